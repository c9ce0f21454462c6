//! Prometheus endpoint: a thread serving `GET /metrics` in the OpenMetrics
//! text format (which Prometheus scrapes natively). Each scrape builds the
//! same `api::Status` that `fastpath status` shows from the daemon's last
//! snapshot plus live counter reads, so both always agree and the maps are
//! read once per scrape.
//!
//! Series (counters get `_total` appended by the format):
//! - `fastpath_packets`, `fastpath_bytes` {interface, verdict=forwarded|punted, reason}
//! - `fastpath_flow_cache_events` {interface, event=hit|miss|stale|expired|evict|bypass}
//! - `fastpath_table_entries`, `fastpath_table_capacity` {table}
//! - `fastpath_family_fast_path` {family} (0: the whole family is punted)
//! - `fastpath_routes_offload_failed`: routes that found no slot (their
//!   traffic is punted to the kernel, see `fastpath routes`)
//! - `fastpath_mirror_lag_last_seconds`, `fastpath_mirror_lag_max_seconds`:
//!   from the daemon receiving a netlink change to the maps holding it
//! - `fastpath_full_sync_age_seconds`: since the last full dump (start or resync)
//! - `fastpath_netlink_resyncs`, `fastpath_reconcile_failures`,
//!   `fastpath_config_reloads` {result=ok|failed}, `fastpath_neigh_keepalives`
//! - `fastpath_reconciles` {kind=full|routes|neighbours|ahead|links}: table
//!   updates that recomputed everything, route-only or neighbour-only
//!   changes written as just those entries, punting entries written
//!   ahead of the recompute a change needs (interface restrictions, new
//!   local routes, routes of deleted next-hop objects), and interface
//!   entries of links whose carrier came back
//! - `fastpath_generation`: table generation
//! - `process_cpu_seconds`, `process_resident_memory_bytes`,
//!   `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`,
//!   `process_start_time_seconds`: the daemon process, as every Prometheus
//!   client library names them; `fastpath_daemon_peak_resident_memory_bytes`
//!   its peak (VmHWM)
//! - `fastpath_flow_packets`, `fastpath_flow_bytes` {family, proto, src,
//!   sport, dst, dport, ingress, egress}: the `--metrics-flows` busiest
//!   flows of the flow cache (what `fastpath flows` lists first), packets
//!   forwarded by the fast path and, in stateful mode, their IP bytes.
//!   Gauges: a flow's series ends when it leaves the top or the cache.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use log::{debug, info, warn};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::api::{self, Shared, Status};
use crate::flows::FlowJson;
use crate::maps::Maps;

pub const DEFAULT_ENDPOINT: &str = "127.0.0.1:9469";

/// Where metrics are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Off,
    At(SocketAddr),
}

/// `ADDR:PORT` (IPv6 as `[ADDR]:PORT`) or `off`.
pub fn parse_endpoint(s: &str) -> Result<Endpoint, String> {
    if s == "off" {
        return Ok(Endpoint::Off);
    }
    s.parse::<SocketAddr>()
        .map(Endpoint::At)
        .map_err(|_| format!("{s:?} is not ADDR:PORT (e.g. {DEFAULT_ENDPOINT}, [::1]:9469) or off"))
}

/// Daemon bookkeeping that only the metrics show; the loop updates it, the
/// snapshot carries it.
#[derive(Debug, Clone, Default)]
pub struct OpsStats {
    pub lag_last: Option<Duration>,
    pub lag_max: Duration,
    pub last_full_sync: Option<Instant>,
    pub reconcile_failures: u64,
    /// Reconciles that recomputed every table / wrote only changed routes'
    /// entries / only changed neighbours' entries.
    pub reconciles_full: u64,
    pub reconciles_routes: u64,
    pub reconciles_neigh: u64,
    /// Punting entries written ahead of the recompute a change needs
    /// (iface_restrict, local_ahead): writes, not reconciles.
    pub reconciles_ahead: u64,
    /// Interface entries of links whose carrier came back, when that was
    /// all that changed (iface_restrict::carrier_back).
    pub reconciles_links: u64,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
}

impl OpsStats {
    pub fn record_lag(&mut self, d: Duration) {
        self.lag_last = Some(d);
        self.lag_max = self.lag_max.max(d);
    }
}

/// Binds now, before anything is attached, so a taken port fails the
/// start cleanly; serving starts once the maps exist.
pub fn bind(ep: Endpoint) -> Result<Option<tiny_http::Server>> {
    let Endpoint::At(addr) = ep else {
        info!("metrics endpoint off");
        return Ok(None);
    };
    if !addr.ip().is_loopback() {
        warn!("metrics served on {addr}, beyond loopback, as configured: anyone who can reach it sees the counters");
    }
    let server = tiny_http::Server::http(addr).map_err(|e| anyhow!("metrics endpoint {addr}: {e}"))?;
    Ok(Some(server))
}

/// The serving thread; dropping it stops the thread.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `flows`: how many of the busiest cached flows each scrape exports.
pub fn serve(server: tiny_http::Server, shared: Shared, maps: Maps, flows: usize) -> Result<MetricsServer> {
    let server = Arc::new(server);
    let srv = Arc::clone(&server);
    if let Some(a) = server.server_addr().to_ip() {
        info!("metrics on http://{a}/metrics");
    }
    let thread = std::thread::Builder::new()
        .name("fastpath-metrics".into())
        .spawn(move || {
            // recv() fails once unblock() is called: that is the way out.
            while let Ok(req) = srv.recv() {
                let resp = respond(req.url(), &shared, &maps, flows);
                if let Err(e) = req.respond(resp) {
                    debug!("metrics: answering a scrape: {e}");
                }
            }
        })
        .context("starting the metrics thread")?;
    Ok(MetricsServer { server, thread: Some(thread) })
}

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn respond(url: &str, shared: &Shared, maps: &Maps, flows: usize) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let text = |code: u16, body: String, ctype: &str| {
        let mut r = tiny_http::Response::from_string(body).with_status_code(code);
        if let Ok(h) = tiny_http::Header::from_bytes(&b"Content-Type"[..], ctype.as_bytes()) {
            r.add_header(h);
        }
        r
    };
    let path = url.split('?').next().unwrap_or("");
    if path != "/metrics" {
        return text(404, "fastpath: metrics are at /metrics\n".into(), "text/plain; charset=utf-8");
    }
    let snap = match shared.lock() {
        Ok(g) => Arc::clone(&g),
        Err(p) => Arc::clone(&p.into_inner()),
    };
    let busiest = |st: Status| -> Result<(Status, Vec<FlowJson>), String> {
        // limit 0 would mean every flow to flows::list.
        if flows == 0 {
            return Ok((st, Vec::new()));
        }
        let f = crate::flows::list(&snap, maps, flows).map_err(|e| format!("{e:#}"))?;
        Ok((st, f.flows))
    };
    match api::status(&snap, maps).map_err(|e| format!("{e:#}")).and_then(busiest).and_then(|(st, f)| {
        render_with_flows(st, snap.ops.clone(), Instant::now(), f).map_err(|e| format!("encoding: {e}"))
    }) {
        Ok(body) => text(200, body, CONTENT_TYPE),
        Err(e) => text(500, format!("fastpath: {e}\n"), "text/plain; charset=utf-8"),
    }
}

/// The exposition for one scrape.
#[cfg(test)]
pub fn render(status: Status, ops: OpsStats, now: Instant) -> Result<String, std::fmt::Error> {
    render_with_flows(status, ops, now, Vec::new())
}

/// The exposition for one scrape, with the busiest flows' series.
pub fn render_with_flows(status: Status, ops: OpsStats, now: Instant, flows: Vec<FlowJson>) -> Result<String, std::fmt::Error> {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(Scrape { status, ops, now, flows }));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg)?;
    Ok(out)
}

#[derive(Debug)]
struct Scrape {
    status: Status,
    ops: OpsStats,
    now: Instant,
    flows: Vec<FlowJson>,
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

/// A counter family with one label: (label value, count) each.
fn counters_by(e: &mut DescriptorEncoder, name: &str, help: &str, label: &str, vs: &[(&str, u64)]) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Counter)?;
    for (value, n) in vs {
        ConstCounter::new(*n).encode(m.encode_family(&[(label, *value)])?)?;
    }
    Ok(())
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// The series every Prometheus client library exports for its process
/// (client_golang's process collector: same names, units and meaning).
fn encode_process(e: &mut DescriptorEncoder, p: &crate::procstat::DaemonProcess) -> std::fmt::Result {
    let c = ConstCounter::new(p.cpu_seconds);
    c.encode(e.encode_descriptor("process_cpu_seconds", "Total user and system CPU time spent in seconds.", None, c.metric_type())?)?;
    gauge(e, "process_resident_memory_bytes", "Resident memory size in bytes.", p.resident_bytes as f64)?;
    gauge(e, "process_virtual_memory_bytes", "Virtual memory size in bytes.", p.virtual_bytes as f64)?;
    gauge(e, "process_open_fds", "Number of open file descriptors.", p.open_fds as f64)?;
    if let Some(m) = p.max_fds {
        gauge(e, "process_max_fds", "Maximum number of open file descriptors.", m as f64)?;
    }
    gauge(e, "process_start_time_seconds", "Start time of the process since unix epoch in seconds.", p.start_time_seconds)?;
    gauge(
        e,
        "fastpath_daemon_peak_resident_memory_bytes",
        "The most the daemon was resident at once (VmHWM), e.g. while it mirrored a full table.",
        p.peak_resident_bytes as f64,
    )
}

impl Scrape {
    /// The busiest flows, one series each; bytes only where the data path
    /// keeps them (stateful mode).
    fn encode_flows(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        if self.flows.is_empty() {
            return Ok(());
        }
        let labels = |f: &FlowJson| -> [(&'static str, String); 8] {
            [
                ("family", f.family.clone()),
                ("proto", f.proto.to_string()),
                ("src", f.src.clone()),
                ("sport", f.sport.to_string()),
                ("dst", f.dst.clone()),
                ("dport", f.dport.to_string()),
                ("ingress", f.ingress.clone().unwrap_or_default()),
                ("egress", f.egress.clone().unwrap_or_default()),
            ]
        };
        let mut m = e.encode_descriptor(
            "fastpath_flow_packets",
            "Packets the fast path forwarded for one of the busiest cached flows (since it entered the cache).",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for f in &self.flows {
            ConstGauge::new(f.packets as i64).encode(m.encode_family(&labels(f))?)?;
        }
        if self.flows.iter().any(|f| f.bytes.is_some()) {
            let mut m = e.encode_descriptor(
                "fastpath_flow_bytes",
                "Stateful mode: IP bytes the fast path forwarded for one of the busiest cached flows.",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for f in &self.flows {
                if let Some(b) = f.bytes {
                    ConstGauge::new(b as i64).encode(m.encode_family(&labels(f))?)?;
                }
            }
        }
        Ok(())
    }
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.status;

        for (name, help, bytes) in [
            ("fastpath_packets", "Packets seen by the XDP program, by ingress interface, verdict and reason.", false),
            ("fastpath_bytes", "Bytes seen by the XDP program, by ingress interface, verdict and reason.", true),
        ] {
            let mut m = e.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Counter)?;
            for i in &s.interfaces {
                for (reason, pb) in &i.counters {
                    let verdict = if reason == "forwarded" { "forwarded" } else { "punted" };
                    let labels =
                        [("interface", i.name.as_str()), ("verdict", verdict), ("reason", reason.as_str())];
                    let v = if bytes { pb.bytes } else { pb.packets };
                    ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
                }
            }
        }

        let mut m = e.encode_descriptor(
            "fastpath_flow_cache_events",
            "Flow cache lookups (hit or miss) and what a miss found (stale, expired) or did (evict).",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for i in &s.interfaces {
            for (event, n) in &i.flow_cache {
                ConstCounter::new(*n).encode(m.encode_family(&[("interface", i.name.as_str()), ("event", event.as_str())])?)?;
            }
        }

        let tables = s.tables.named();
        for (name, help, cap) in [
            ("fastpath_table_entries", "Entries fastpath holds in each table.", false),
            ("fastpath_table_capacity", "Capacity of each table.", true),
        ] {
            let mut m = e.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Gauge)?;
            for (table, o) in &tables {
                let v = if cap { o.capacity } else { o.used };
                ConstGauge::new(v as i64).encode(m.encode_family(&[("table", *table)])?)?;
            }
        }

        if let Some(d) = &s.fib4_dir24 {
            let mut m = e.encode_descriptor(
                "fastpath_fib4_dir24",
                "The IPv4 /24 index: route values held and their capacity, /24 blocks sent to the trie, routes without a value slot.",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (what, v) in
                [("values", d.vals), ("values_capacity", d.vals_capacity), ("trie_blocks", d.trie_blocks), ("unslotted", d.unslotted)]
            {
                ConstGauge::new(v as i64).encode(m.encode_family(&[("what", what)])?)?;
            }
        }

        if let Some(d) = &s.fib6_multibit {
            let mut m = e.encode_descriptor(
                "fastpath_fib6_multibit",
                "The IPv6 multibit index: route values held and their capacity, entries and slots, /16s sent to the trie, values without a slot.",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (what, v) in [
                ("values", d.vals),
                ("values_capacity", d.vals_capacity),
                ("entries", d.entries),
                ("entries_capacity", d.entries_capacity),
                ("trie_tops", d.trie_tops),
                ("unslotted", d.unslotted),
            ] {
                ConstGauge::new(v as i64).encode(m.encode_family(&[("what", what)])?)?;
            }
        }

        let mut m = e.encode_descriptor(
            "fastpath_family_fast_path",
            "1 while the family is fast-pathed, 0 while all of it is punted (table full, policy, netfilter).",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (fam, f) in [("ipv4", &s.families.ipv4), ("ipv6", &s.families.ipv6)] {
            ConstGauge::new(i64::from(f.fast_path)).encode(m.encode_family(&[("family", fam)])?)?;
        }

        let g = ConstGauge::new(s.routes_offload_failed as i64);
        g.encode(e.encode_descriptor(
            "fastpath_routes_offload_failed",
            "Routes that found no slot in a full table: their traffic goes to the kernel (offload failed).",
            None,
            g.metric_type(),
        )?)?;

        let o = &self.ops;
        gauge(
            &mut e,
            "fastpath_mirror_lag_last_seconds",
            "Time from receiving the last netlink change to the maps holding it.",
            o.lag_last.unwrap_or_default().as_secs_f64(),
        )?;
        gauge(&mut e, "fastpath_mirror_lag_max_seconds", "Largest mirror lag since start.", o.lag_max.as_secs_f64())?;
        if let Some(t) = o.last_full_sync {
            gauge(
                &mut e,
                "fastpath_full_sync_age_seconds",
                "Time since the last full dump of kernel state (start or resync).",
                self.now.saturating_duration_since(t).as_secs_f64(),
            )?;
        }
        counter(&mut e, "fastpath_netlink_resyncs", "Netlink overruns recovered by a full resync.", s.netlink_resyncs)?;
        counter(&mut e, "fastpath_reconcile_failures", "Reconciles that failed to write the maps (retried).", o.reconcile_failures)?;
        counters_by(
            &mut e,
            "fastpath_config_reloads",
            "SIGHUP reloads of the config file, applied or rejected whole.",
            "result",
            &[("ok", o.reloads_ok), ("failed", o.reloads_failed)],
        )?;
        counters_by(
            &mut e,
            "fastpath_reconciles",
            "Table updates: full recomputes, route-only or neighbour-only changes written as just those entries, punting entries written ahead of a recompute, and interface entries of links whose carrier came back.",
            "kind",
            &[
                ("full", o.reconciles_full),
                ("routes", o.reconciles_routes),
                ("neighbours", o.reconciles_neigh),
                ("ahead", o.reconciles_ahead),
                ("links", o.reconciles_links),
            ],
        )?;
        counter(&mut e, "fastpath_neigh_keepalives", "Neighbours refreshed in the kernel because fast-pathed traffic used them.", s.neigh_keepalives)?;
        gauge(&mut e, "fastpath_generation", "Table generation (bumped by every route or neighbour change).", s.generation as f64)?;
        if let Some(p) = &s.daemon {
            encode_process(&mut e, p)?;
        }
        self.encode_flows(&mut e)?;
        if let Some(ct) = &s.conntrack {
            let c = &ct.counters;
            gauge(&mut e, "fastpath_ct_generation", "Stateful mode: conntrack generation (each bump re-checks every cached verdict).", f64::from(ct.generation))?;
            counters_by(
                &mut e,
                "fastpath_ct_events",
                "Stateful mode: conntrack and nftables events and what the daemon did about them.",
                "what",
                &[
                    ("events", c.events),
                    ("bumps", c.bumps),
                    ("overruns", c.overruns),
                    ("ruleset_changes", c.ruleset_changes),
                    ("marks_cleared", c.marks_cleared),
                    ("clear_errors", c.clear_errors),
                    ("liberal", c.liberal),
                    ("liberal_requests", c.liberal_requests),
                    ("icmp_requests", c.icmp_requests),
                    ("icmp_refreshes", c.icmp_refreshes),
                    ("icmp_full", c.icmp_full),
                    ("icmp_errors", c.icmp_errors),
                ],
            )?;
            gauge(&mut e, "fastpath_ct_icmp_entries", "Stateful mode: ICMP echo conntrack entries copied for the data path.", c.icmp_tracked as f64)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Families, FamilyStatus, FlowCacheStatus, HashStatus, IfaceStatus, Occupancy, PacketsBytes, Tables};
    use std::collections::BTreeMap;

    fn status() -> Status {
        let mut counters = BTreeMap::new();
        counters.insert("forwarded".to_string(), PacketsBytes { packets: 10, bytes: 1000 });
        counters.insert("no_neigh".to_string(), PacketsBytes { packets: 2, bytes: 120 });
        let mut flow = BTreeMap::new();
        flow.insert("hit".to_string(), 9);
        Status {
            mode: "stateless".into(),
            reconciles: Default::default(),
            conntrack: None,
            route_source: None,
            afxdp: None,
            admission: None,
            fib4_dir24: None,
            fib6_multibit: None,
            daemon: Some(crate::procstat::DaemonProcess {
                pid: 7,
                resident_bytes: 300 << 20,
                peak_resident_bytes: 400 << 20,
                virtual_bytes: 900 << 20,
                cpu_seconds: 12.5,
                open_fds: 40,
                max_fds: Some(1024),
                start_time_seconds: 1.8e9,
            }),
            generation: 4,
            netlink_resyncs: 1,
            neigh_keepalives: 0,
            interfaces: vec![IfaceStatus {
                name: "r0".into(),
                ifindex: 2,
                xdp_mode: "native".into(),
                mac: String::new(),
                mtu: 1500,
                up: true,
                fwd4: true,
                fwd6: true,
                rp_filter: 0,
                counters,
                flow_cache: flow,
                hash: HashStatus::default(),
            }],
            tables: Tables { fib4: Occupancy { used: 3, capacity: 1024 }, ..Default::default() },
            families: Families { ipv4: FamilyStatus { fast_path: true, ..Default::default() }, ipv6: FamilyStatus::default() },
            totals: BTreeMap::new(),
            flow_cache: FlowCacheStatus::default(),
            routes_offload_failed: 2,
        }
    }

    #[test]
    fn exposition_has_labelled_counters_gauges_and_eof() {
        let t0 = Instant::now();
        let mut ops = OpsStats {
            last_full_sync: Some(t0),
            reconcile_failures: 2,
            reconciles_full: 3,
            reconciles_routes: 5,
            reconciles_neigh: 7,
            reconciles_ahead: 1,
            reconciles_links: 4,
            reloads_ok: 1,
            ..Default::default()
        };
        ops.record_lag(Duration::from_millis(30));
        ops.record_lag(Duration::from_millis(10));
        let out = render(status(), ops, t0 + Duration::from_secs(5)).expect("encodes");
        for line in [
            "# TYPE fastpath_packets counter",
            "fastpath_packets_total{interface=\"r0\",verdict=\"forwarded\",reason=\"forwarded\"} 10",
            "fastpath_packets_total{interface=\"r0\",verdict=\"punted\",reason=\"no_neigh\"} 2",
            "fastpath_bytes_total{interface=\"r0\",verdict=\"forwarded\",reason=\"forwarded\"} 1000",
            "fastpath_flow_cache_events_total{interface=\"r0\",event=\"hit\"} 9",
            "fastpath_table_entries{table=\"fib4\"} 3",
            "fastpath_table_capacity{table=\"fib4\"} 1024",
            "fastpath_routes_offload_failed 2",
            "fastpath_family_fast_path{family=\"ipv4\"} 1",
            "fastpath_family_fast_path{family=\"ipv6\"} 0",
            "fastpath_mirror_lag_last_seconds 0.01",
            "fastpath_mirror_lag_max_seconds 0.03",
            "fastpath_full_sync_age_seconds 5.0",
            "fastpath_netlink_resyncs_total 1",
            "fastpath_reconcile_failures_total 2",
            "fastpath_config_reloads_total{result=\"ok\"} 1",
            "fastpath_reconciles_total{kind=\"full\"} 3",
            "fastpath_reconciles_total{kind=\"routes\"} 5",
            "fastpath_reconciles_total{kind=\"neighbours\"} 7",
            "fastpath_reconciles_total{kind=\"ahead\"} 1",
            "fastpath_generation 4.0",
            "process_cpu_seconds_total 12.5",
            "process_resident_memory_bytes 314572800.0",
            "process_virtual_memory_bytes 943718400.0",
            "process_open_fds 40.0",
            "process_max_fds 1024.0",
            "process_start_time_seconds 1800000000.0",
            "fastpath_daemon_peak_resident_memory_bytes 419430400.0",
        ] {
            assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
        }
        assert!(out.ends_with("# EOF\n"), "{out}");
        assert!(!out.contains("fastpath_ct_"), "stateless mode exports no conntrack series");
    }

    #[test]
    fn stateful_mode_exports_conntrack_series() {
        let mut st = status();
        st.mode = "stateful".into();
        let mut ct = crate::ctwatch::CtStatus { generation: 7, ..Default::default() };
        ct.counters.bumps = 3;
        ct.counters.liberal = 2;
        st.conntrack = Some(ct);
        let out = render(st, OpsStats::default(), Instant::now()).expect("encodes");
        for line in [
            "fastpath_ct_generation 7.0",
            "fastpath_ct_events_total{what=\"bumps\"} 3",
            "fastpath_ct_events_total{what=\"liberal\"} 2",
        ] {
            assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
        }
    }

    #[test]
    fn the_dashboard_only_uses_series_we_export() {
        let out = render(status(), OpsStats { last_full_sync: Some(Instant::now()), ..Default::default() }, Instant::now())
            .expect("encodes");
        let dash = include_str!("../../../deploy/grafana/fastpath.json");
        let v: serde_json::Value = serde_json::from_str(dash).expect("valid JSON");
        let panels = v["panels"].as_array().expect("panels");
        assert!(panels.len() >= 5);
        for p in panels {
            for t in p["targets"].as_array().expect("targets") {
                let expr = t["expr"].as_str().expect("expr");
                let ours = |w: &&str| w.starts_with("fastpath_") || w.starts_with("process_");
                for name in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(ours) {
                    assert!(out.contains(&format!("\n{name}")), "{name} used by the dashboard is not exported");
                }
            }
        }
    }

    #[test]
    fn busiest_flows_are_labelled_series_with_bytes_only_where_kept() {
        let flow = |proto: u8, sport: u16, packets: u64, bytes: Option<u64>| FlowJson {
            family: "ipv4".into(),
            proto,
            src: "192.0.2.2".into(),
            dst: "203.0.113.1".into(),
            sport,
            dport: 53,
            ingress: Some("r0".into()),
            egress: Some("r1".into()),
            nexthop: 1,
            dmac: "02:00:00:00:02:02".into(),
            packets,
            bytes,
            cpus: 1,
            idle_s: 0,
            current: true,
        };
        let labels = "family=\"ipv4\",proto=\"17\",src=\"192.0.2.2\",sport=\"4000\",dst=\"203.0.113.1\",dport=\"53\",ingress=\"r0\",egress=\"r1\"";
        let out = render_with_flows(status(), OpsStats::default(), Instant::now(), vec![flow(17, 4000, 37, Some(3404))])
            .expect("encodes");
        for line in [format!("fastpath_flow_packets{{{labels}}} 37"), format!("fastpath_flow_bytes{{{labels}}} 3404")] {
            assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
        }
        // Stateless entries carry no bytes: no byte series at all.
        let out = render_with_flows(status(), OpsStats::default(), Instant::now(), vec![flow(6, 4001, 5, None)])
            .expect("encodes");
        assert!(out.contains("fastpath_flow_packets{") && !out.contains("fastpath_flow_bytes"), "{out}");
        let out = render(status(), OpsStats::default(), Instant::now()).expect("encodes");
        assert!(!out.contains("fastpath_flow_packets") && !out.contains("fastpath_flow_bytes"), "no flows, no flow series: {out}");
    }

    #[test]
    fn endpoint_parsing() {
        assert_eq!(parse_endpoint("off"), Ok(Endpoint::Off));
        assert_eq!(parse_endpoint("127.0.0.1:9469"), Ok(Endpoint::At("127.0.0.1:9469".parse().unwrap())));
        assert_eq!(parse_endpoint("[::1]:1"), Ok(Endpoint::At("[::1]:1".parse().unwrap())));
        assert!(parse_endpoint("localhost").is_err());
        assert!(parse_endpoint("1.2.3.4").is_err());
    }
}
