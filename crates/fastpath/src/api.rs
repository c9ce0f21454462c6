//! The daemon's API: a root-only unix socket speaking newline-delimited JSON,
//! and the CLI clients that talk to it.
//!
//! Request (one line): `{"cmd":"status"}`, `{"cmd":"routes"}` or `{"cmd":"neighbours"}`
//! (`resources` and `route_batch`: see resources_cli.rs and route_batch.rs).
//! Response (one line): `{"ok":true,"data":DATA}` or `{"ok":false,"error":"..."}`.
//! Tests and the demo depend on these exact keys:
//!
//! status:
//! ```text
//! {"generation":u64, "netlink_resyncs":u64, "neigh_keepalives":u64,
//!  "reconciles":{"full":n, "routes":n, "neighbours":n, "ahead":n, "links":n} (table updates: full recomputes, route-only and neighbour-only changes, punting entries written ahead of a recompute, interface entries of links whose carrier came back),
//!  "interfaces":[{"name":str, "ifindex":n, "xdp_mode":"native"|"generic", "mac":"aa:bb:..",
//!                 "mtu":n, "up":bool, "fwd4":bool, "fwd6":bool, "rp_filter":0|1|2,
//!                 "counters":{"<reason>":{"packets":n,"bytes":n}, ... every reason},
//!                 "flow_cache":{"hit":n,"miss":n,"stale":n,"expired":n,"evict":n,"bypass":n},
//!                 "hash":{"variant":"nic rx-hash"|"meta hint / software (device-bound)"|"meta hint / software",
//!                         "packets":{"software":n,"meta":n,"nic":n}}}],
//!  "flow_cache":{"enabled":bool, "timeout_s":n, "entries_per_cpu":n, "key":"ports"|"addresses",
//!                "hit":n,"miss":n,"stale":n,"expired":n,"evict":n,"bypass":n}
//!                (bypass: packets sent past the cache while it was thrashing),
//!  "tables":{"fib4":{"used":n,"capacity":n}, "fib6":{..}, "nexthops":{..},
//!            "groups":{..}, "buckets":{..}, "neighbours":{..}, "interfaces":{..}},
//!  "families":{"ipv4":{"fast_path":bool,"problems":[str]}, "ipv6":{..}},
//!  "totals":{"<reason>":{"packets":n,"bytes":n}, ... every reason},
//!  "mode":"stateless"|"stateful", "routes_offload_failed":n,
//!  "conntrack":null | {"mark":n, "mark_reply":n, "revalidate_ms":n, "revalidate_effective_ms":n, "generation":n (ct_generation),
//!               "timeouts_s":{"tcp":n,"udp":n,"udp_stream":n,"icmp":n,"icmpv6":n}, "events_enabled":bool,
//!               "icmp_capacity":n (--ct-icmp-entries),
//!               "events":n, "bumps":n, "overruns":n, "ruleset_changes":n,
//!               "marks_cleared":n, "clear_errors":n, "liberal":n, "liberal_requests":n,
//!               "icmp_tracked":n (echo entries copied), "icmp_requests":n, "icmp_refreshes":n,
//!               "icmp_full":n, "icmp_errors":n}}
//! ```
//! Reason names are `enum fp_reason` in lower case without `FP_R_`
//! ("forwarded", "not_ip", "no_neigh", ...). `totals` also counts packets
//! that arrived on an interface missing from fp_ifaces (slot 0).
//!
//! routes (sorted by family, then prefix):
//! ```text
//! [{"family":"ipv4"|"ipv6", "prefix":"198.51.100.0/24",
//!   "action":"forward"|"multipath"|"local"|"blackhole"|"unreachable"|"prohibit"|"punt",
//!   "reason":str|null (the punt reason), "mtu":n (0 = device MTU),
//!   "nexthop":{"id":n,"ifindex":n,"dev":str|null,"gateway":str|null}|null,
//!   "group":{"id":n, "kind":"hash-threshold"|"resilient", "buckets":n (resilient: count),
//!            "paths":[{"upper_bound":n (-1 = dead), "nexthop":NEXTHOP|null (null: punted)}]}|null,
//!   "offload":"ok"|"failed"|"punted-cover"}]
//! ```
//! `offload`: "failed" = the route found no slot (in a table that is full)
//! and its traffic goes to the kernel; such a route is listed with
//! `"action":"none"` when not in the map, or as a punt when only its next
//! hop or group found no slot. "punted-cover" = an installed route turned
//! into a punt because a failed route lies inside it. Status also has
//! `"routes_offload_failed":n`.
//! flows (busiest first; `limit` in the request, default 20, 0 = all):
//! ```text
//! {"total":n, "flows":[{"family":"ipv4"|"ipv6", "proto":n, "src":str, "dst":str,
//!   "sport":n, "dport":n, "ingress":str|null, "egress":str|null, "nexthop":n,
//!   "dmac":str, "packets":n, "bytes":n|null (stateful mode only), "cpus":n, "idle_s":n, "current":bool}]}
//! ```
//! `current`: computed from the present table generation (else it is
//! recomputed on its next packet). For ICMP, sport is type << 8 | code.
//!
//! neighbours:
//! ```text
//! [{"ifindex":n, "dev":str|null, "address":str, "mac":"aa:bb:..",
//!   "used_ms_ago":n|null (null: not fast-path forwarded to since written)}]
//! ```

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use fastpath_bpf::intf;
use fastpath_core::model::Family;
use fastpath_core::tables::{Capacities, Desired, GroupKind, RouteAction, RouteEntry};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::keepalive::now_coarse_ns;
use crate::maps::{Counters, Maps, NFLOW, NHASH, NREASONS};
use crate::{render, ClientArgs, StatusArgs};

/// What the daemon loop publishes after each round; the API thread adds
/// live counter reads to it.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub generation: u64,
    pub netlink_resyncs: u64,
    pub neigh_keepalives: u64,
    pub ifaces: Vec<IfaceInfo>,
    pub applied: Arc<Desired>,
    pub caps: Option<Capacities>,
    pub problems: Vec<String>,
    /// ifindex -> name of every link the mirror knows.
    pub dev_names: BTreeMap<u32, String>,
    /// Flow cache: idle timeout (0 = off) and capacity per CPU.
    pub flow_timeout: u32,
    pub flow_entries: u32,
    /// `--flow-key addresses`: TCP/UDP cached by address pair.
    pub flow_key_addrs: bool,
    /// Lag, resync and reload bookkeeping for the metrics endpoint.
    pub ops: crate::metrics::OpsStats,
    /// Stateful mode (None: stateless).
    pub ct: Option<crate::ctwatch::CtStatus>,
    /// --route-source fpm (None: routes from the kernel).
    pub route_source: Option<Arc<crate::fpm::Published>>,
    /// AF_XDP data path (None: XDP).
    pub afxdp: Option<crate::afxdp::StatsSource>,
    /// --reservation-model/--resource-target other than the default.
    pub admission: Option<fastpath_core::resources::AdmissionStatus>,
    /// The /24 index's occupancy (None: off).
    pub fib4_dir24: Option<crate::maps::DirUsage>,
    /// The IPv6 multibit index's occupancy (None: off).
    pub fib6_multibit: Option<crate::maps::Dir6Usage>,
    /// --resource-target sim-asic: the device, for `resources`.
    pub device: Option<Device>,
}

/// A resource target other than the maps and the model in front of it;
/// `resources` asks it on demand (a simulated device answers with its
/// query latency, as a real one would).
#[derive(Clone)]
pub struct Device {
    pub target: Arc<dyn fastpath_core::resources::Target>,
    pub model: Arc<dyn fastpath_core::resources::Model>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({}, {})", self.target.name(), self.model.name())
    }
}

#[derive(Debug, Clone)]
pub struct IfaceInfo {
    pub name: String,
    pub ifindex: u32,
    pub slot: u32,
    pub xdp_mode: &'static str,
    pub mac: Option<[u8; 6]>,
    pub mtu: u32,
    pub up: bool,
    pub fwd4: bool,
    pub fwd6: bool,
    pub rp_filter: u8,
    pub hash_variant: &'static str,
}

pub type Shared = Arc<Mutex<Arc<Snapshot>>>;

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct PacketsBytes {
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IfaceStatus {
    pub name: String,
    pub ifindex: u32,
    pub xdp_mode: String,
    pub mac: String,
    pub mtu: u32,
    pub up: bool,
    pub fwd4: bool,
    pub fwd6: bool,
    pub rp_filter: u8,
    pub counters: BTreeMap<String, PacketsBytes>,
    #[serde(default)]
    pub flow_cache: BTreeMap<String, u64>,
    #[serde(default)]
    pub hash: HashStatus,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HashStatus {
    pub variant: String,
    pub packets: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FlowCacheStatus {
    pub enabled: bool,
    pub timeout_s: u32,
    pub entries_per_cpu: u32,
    /// What identifies a TCP/UDP flow: "ports" (5-tuple) or "addresses".
    #[serde(default)]
    pub key: String,
    #[serde(flatten)]
    pub events: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Occupancy {
    pub used: u64,
    pub capacity: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Tables {
    pub fib4: Occupancy,
    pub fib6: Occupancy,
    pub nexthops: Occupancy,
    #[serde(default)]
    pub groups: Occupancy,
    #[serde(default)]
    pub buckets: Occupancy,
    pub neighbours: Occupancy,
    pub interfaces: Occupancy,
}

impl Tables {
    /// Every table with its name as the JSON, the table view and the metrics call it.
    pub fn named(&self) -> [(&'static str, Occupancy); 7] {
        [
            ("fib4", self.fib4),
            ("fib6", self.fib6),
            ("nexthops", self.nexthops),
            ("groups", self.groups),
            ("buckets", self.buckets),
            ("neighbours", self.neighbours),
            ("interfaces", self.interfaces),
        ]
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FamilyStatus {
    pub fast_path: bool,
    pub problems: Vec<String>,
    /// How multipath routes are hashed: "L3 (policy 0)", "L4 (policy 1)",
    /// or why they are punted.
    #[serde(default)]
    pub multipath_hash: String,
}

/// Table updates since start: full recomputes, route-only or
/// neighbour-only changes written as just those entries (fastpath-core's
/// route_delta, neigh_delta), punting entries written ahead of a
/// recompute (iface_restrict, local_ahead, gone_ahead), interface entries
/// of links whose carrier came back (iface_restrict::carrier_back).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Reconciles {
    pub full: u64,
    pub routes: u64,
    #[serde(default)]
    pub neighbours: u64,
    /// Punting entries written ahead of the full recompute a change needs:
    /// an interface restricted (down, no forwarding, smaller MTU), new
    /// local-table routes and own addresses.
    #[serde(default)]
    pub ahead: u64,
    /// Interface entries of links whose carrier came back, written alone
    /// because nothing else changed.
    #[serde(default)]
    pub links: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Families {
    pub ipv4: FamilyStatus,
    pub ipv6: FamilyStatus,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub generation: u64,
    pub netlink_resyncs: u64,
    pub neigh_keepalives: u64,
    #[serde(default)]
    pub reconciles: Reconciles,
    pub interfaces: Vec<IfaceStatus>,
    pub tables: Tables,
    pub families: Families,
    pub totals: BTreeMap<String, PacketsBytes>,
    #[serde(default)]
    pub flow_cache: FlowCacheStatus,
    #[serde(default)]
    pub mode: String,
    #[serde(default)]
    pub conntrack: Option<crate::ctwatch::CtStatus>,
    /// --route-source fpm only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_source: Option<crate::fpm::SourceStatus>,
    /// Routes that found no slot (see `fastpath_core::overflow`).
    #[serde(default)]
    pub routes_offload_failed: u64,
    /// `--datapath afxdp`: the user-space forwarder's counters.
    #[serde(default)]
    pub afxdp: Option<crate::afxdp::Stats>,
    /// `--reservation-model`/`--resource-target` other than the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<fastpath_core::resources::AdmissionStatus>,
    /// `--fib4-index dir24`: the /24 index's occupancy (absent: trie only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fib4_dir24: Option<crate::maps::DirUsage>,
    /// `--fib6-index multibit`: the IPv6 index's occupancy (absent: trie only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fib6_multibit: Option<crate::maps::Dir6Usage>,
    /// The daemon's own memory, CPU and descriptors (absent if /proc said nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<crate::procstat::DaemonProcess>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NexthopJson {
    pub id: u32,
    pub ifindex: u32,
    pub dev: Option<String>,
    pub gateway: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouteJson {
    pub family: String,
    pub prefix: String,
    pub action: String,
    pub reason: Option<String>,
    pub mtu: u32,
    pub nexthop: Option<NexthopJson>,
    #[serde(default)]
    pub group: Option<GroupJson>,
    /// --route-source fpm only: "fpm" for zebra's routes, "kernel" for the local table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// "ok" | "failed" | "punted-cover"
    #[serde(default)]
    pub offload: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupPathJson {
    pub upper_bound: i32,
    pub nexthop: Option<NexthopJson>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupJson {
    pub id: u32,
    pub kind: String,
    pub buckets: u16,
    pub paths: Vec<GroupPathJson>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NeighbourJson {
    pub ifindex: u32,
    pub dev: Option<String>,
    pub address: String,
    pub mac: String,
    pub used_ms_ago: Option<u64>,
}

pub fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// Names of enum fp_flow_event and enum fp_hash_src, in order.
pub const FLOW_EVENTS: [&str; NFLOW] = ["hit", "miss", "stale", "expired", "evict", "bypass"];
pub const HASH_SOURCES: [&str; NHASH] = ["software", "meta", "nic"];

fn named(names: &[&str], v: &[u64]) -> BTreeMap<String, u64> {
    names.iter().zip(v).map(|(n, v)| (n.to_string(), *v)).collect()
}

fn counters_json(c: &Counters) -> BTreeMap<String, PacketsBytes> {
    (0..NREASONS)
        .map(|i| (intf::reason_name(i).to_string(), PacketsBytes { packets: c.packets[i], bytes: c.bytes[i] }))
        .collect()
}

/// Which family a problem line is about. The problem strings are free text
/// from `desired`; one naming neither family concerns both.
fn problem_families(p: &str) -> (bool, bool) {
    let l = p.to_ascii_lowercase();
    let v4 = l.contains("ipv4") || l.contains("fib4");
    let v6 = l.contains("ipv6") || l.contains("fib6");
    if !v4 && !v6 {
        (true, true)
    } else {
        (v4, v6)
    }
}

/// The kernel's multipath hash as the data path reproduces it, or why
/// multipath routes of the family are punted (desired::mp_block says the same
/// as a problem).
fn multipath_hash(policy: u8, fields: u32, seed: u32, v6: bool) -> String {
    match (seed, policy) {
        (0, _) => "punted (fib_multipath_hash_seed is 0: the kernel's random seed)".into(),
        (_, 0) => "L3 (policy 0)".into(),
        (_, 1) => "L4 (policy 1)".into(),
        (_, 2) => "L3 or inner L3 (policy 2; encapsulations punted)".into(),
        (_, 3) => format!("custom fields {} (policy 3)", hash_fields(fields, v6)),
        (_, p) => format!("punted (policy {p} not implemented)"),
    }
}

/// fib_multipath_hash_fields by name, as ip-sysctl.rst lists them (IPv4
/// ignores the flow label); an inner field also says that encapsulated
/// packets are punted.
fn hash_fields(fields: u32, v6: bool) -> String {
    use fastpath_core::mphash::{FIELDS_INNER, FIELD_DST_IP, FIELD_DST_PORT, FIELD_FLOWLABEL, FIELD_IP_PROTO, FIELD_SRC_IP, FIELD_SRC_PORT};
    let names = [
        (FIELD_SRC_IP, "src-ip"),
        (FIELD_DST_IP, "dst-ip"),
        (FIELD_IP_PROTO, "proto"),
        (FIELD_FLOWLABEL, "flowlabel"),
        (FIELD_SRC_PORT, "src-port"),
        (FIELD_DST_PORT, "dst-port"),
    ];
    let mut out: Vec<&str> =
        names.iter().filter(|(bit, name)| fields & bit != 0 && (v6 || *name != "flowlabel")).map(|(_, n)| *n).collect();
    if out.is_empty() {
        out.push("none");
    }
    let mut s = format!("{} ({fields:#x})", out.join(","));
    if fields & FIELDS_INNER != 0 {
        s.push_str("; inner fields: encapsulations punted");
    }
    s
}

fn occ(used: usize, cap: u32) -> Occupancy {
    Occupancy { used: used as u64, capacity: cap as u64 }
}

pub fn status(s: &Snapshot, maps: &Maps) -> Result<Status> {
    let mut totals = maps.counters(0).context("reading counters")?;
    let mut interfaces = Vec::new();
    for i in &s.ifaces {
        let c = maps.counters(i.slot).context("reading counters")?;
        totals.add(&c);
        interfaces.push(IfaceStatus {
            name: i.name.clone(),
            ifindex: i.ifindex,
            xdp_mode: i.xdp_mode.to_string(),
            mac: i.mac.as_ref().map(fmt_mac).unwrap_or_default(),
            mtu: i.mtu,
            up: i.up,
            fwd4: i.fwd4,
            fwd6: i.fwd6,
            rp_filter: i.rp_filter,
            counters: counters_json(&c),
            flow_cache: named(&FLOW_EVENTS, &c.flow),
            hash: HashStatus { variant: i.hash_variant.to_string(), packets: named(&HASH_SOURCES, &c.hash_src) },
        });
    }
    let a = &s.applied;
    let caps =
        s.caps.unwrap_or(Capacities { fib4: 0, fib6: 0, nexthops: 0, neigh: 0, ifaces: 0, groups: 0, buckets: 0 });
    let punted = a.switches.table_full | a.switches.policy_punt;
    let mut families = Families {
        ipv4: FamilyStatus {
            fast_path: punted & Family::V4.bit() == 0,
            problems: vec![],
            multipath_hash: multipath_hash(a.switches.mp_policy4, a.switches.mp_fields4, a.switches.mp_seed, false),
        },
        ipv6: FamilyStatus {
            fast_path: punted & Family::V6.bit() == 0,
            problems: vec![],
            multipath_hash: multipath_hash(a.switches.mp_policy6, a.switches.mp_fields6, a.switches.mp_seed, true),
        },
    };
    for p in &s.problems {
        let (v4, v6) = problem_families(p);
        if v4 {
            families.ipv4.problems.push(p.clone());
        }
        if v6 {
            families.ipv6.problems.push(p.clone());
        }
    }
    Ok(Status {
        generation: s.generation,
        netlink_resyncs: s.netlink_resyncs,
        neigh_keepalives: s.neigh_keepalives,
        reconciles: Reconciles {
            full: s.ops.reconciles_full,
            routes: s.ops.reconciles_routes,
            neighbours: s.ops.reconciles_neigh,
            ahead: s.ops.reconciles_ahead,
            links: s.ops.reconciles_links,
        },
        interfaces,
        tables: Tables {
            fib4: occ(a.fib4.len(), caps.fib4),
            fib6: occ(a.fib6.len(), caps.fib6),
            // Id 0 of the next-hop array is never used.
            nexthops: occ(a.nexthops.len(), caps.nexthops.saturating_sub(1)),
            // Likewise group 0; bucket keys hold 16 bits of group id.
            groups: occ(a.groups.len(), caps.groups.saturating_sub(1).min(u32::from(u16::MAX))),
            buckets: occ(a.res_buckets.len(), caps.buckets),
            neighbours: occ(a.neigh.len(), caps.neigh),
            interfaces: occ(a.ifaces.len(), caps.ifaces),
        },
        families,
        totals: counters_json(&totals),
        flow_cache: FlowCacheStatus {
            enabled: s.flow_timeout != 0,
            timeout_s: s.flow_timeout,
            entries_per_cpu: s.flow_entries,
            key: if s.flow_key_addrs { "addresses" } else { "ports" }.into(),
            events: named(&FLOW_EVENTS, &totals.flow),
        },
        mode: if s.ct.is_some() { "stateful" } else { "stateless" }.into(),
        conntrack: s.ct,
        route_source: s.route_source.as_ref().map(|r| r.status.clone()),
        routes_offload_failed: a.offload.failed() as u64,
        afxdp: s.afxdp.as_ref().map(|a| a.stats()),
        admission: s.admission.clone(),
        fib4_dir24: s.fib4_dir24,
        fib6_multibit: s.fib6_multibit,
        daemon: crate::procstat::myself().map_err(|e| log::debug!("daemon process stats: {e:#}")).ok(),
    })
}

fn nexthop_json(s: &Snapshot, nh_id: u32) -> Option<NexthopJson> {
    s.applied.nexthops.get(&nh_id).map(|n| NexthopJson {
        id: nh_id,
        ifindex: n.ifindex,
        dev: s.dev_names.get(&n.ifindex).cloned(),
        gateway: n.gateway.map(|g| g.to_string()),
    })
}

fn route_json(s: &Snapshot, family: &str, prefix: String, e: &RouteEntry, offload: &str) -> RouteJson {
    let mut group = None;
    let (action, reason, nexthop) = match e.action {
        RouteAction::Forward { nh_id } => ("forward", None, nexthop_json(s, nh_id)),
        RouteAction::Multipath { group: gid } => {
            group = s.applied.groups.get(&gid).map(|g| GroupJson {
                id: gid,
                kind: match g.kind {
                    GroupKind::HashThreshold => "hash-threshold".into(),
                    GroupKind::Resilient => "resilient".into(),
                },
                buckets: g.n_buckets,
                paths: g
                    .paths
                    .iter()
                    .map(|p| GroupPathJson { upper_bound: p.upper_bound, nexthop: nexthop_json(s, p.nh_id) })
                    .collect(),
            });
            ("multipath", None, None)
        }
        RouteAction::Local => ("local", None, None),
        RouteAction::Blackhole => ("blackhole", None, None),
        RouteAction::Unreachable => ("unreachable", None, None),
        RouteAction::Prohibit => ("prohibit", None, None),
        RouteAction::Punt { reason } => ("punt", Some(intf::reason_name(reason as usize).to_string()), None),
    };
    RouteJson {
        family: family.into(),
        prefix,
        action: action.into(),
        reason,
        mtu: e.mtu,
        nexthop,
        group,
        source: None,
        offload: offload.into(),
    }
}

/// --route-source fpm: whether zebra sent this prefix.
fn with_source(src: Option<&crate::fpm::server::SourcesRead<'_>>, mut r: RouteJson, addr: std::net::IpAddr, len: u8) -> RouteJson {
    if let Some(src) = src {
        r.source = Some(if src.sent(addr, len) { "fpm" } else { "kernel" }.into());
    }
    r
}

/// A route that is not in the map at all: it found no slot.
fn missing_json(family: &str, prefix: String) -> RouteJson {
    RouteJson {
        family: family.into(),
        prefix,
        action: "none".into(),
        reason: None,
        mtu: 0,
        nexthop: None,
        group: None,
        source: None,
        offload: fastpath_core::overflow::FAILED.into(),
    }
}

/// Map entries and failed routes not in the map, each family sorted by prefix.
pub fn routes(s: &Snapshot) -> Vec<RouteJson> {
    let a = &s.applied;
    let o = &a.offload;
    let src = s.route_source.as_ref().map(|r| r.sources.read());
    let src = src.as_ref();
    let mut v4: BTreeMap<(std::net::Ipv4Addr, u8), RouteJson> = a
        .fib4
        .iter()
        .map(|(k @ (addr, len), e)| {
            let r = route_json(s, "ipv4", format!("{addr}/{len}"), e, o.status4(k));
            (*k, with_source(src, r, (*addr).into(), *len))
        })
        .collect();
    for k @ (addr, len) in o.failed4.iter().filter(|k| !a.fib4.contains_key(k)) {
        v4.insert(*k, with_source(src, missing_json("ipv4", format!("{addr}/{len}")), (*addr).into(), *len));
    }
    let mut v6: BTreeMap<(std::net::Ipv6Addr, u8), RouteJson> = a
        .fib6
        .iter()
        .map(|(k @ (addr, len), e)| {
            let r = route_json(s, "ipv6", format!("{addr}/{len}"), e, o.status6(k));
            (*k, with_source(src, r, (*addr).into(), *len))
        })
        .collect();
    for k @ (addr, len) in o.failed6.iter().filter(|k| !a.fib6.contains_key(k)) {
        v6.insert(*k, with_source(src, missing_json("ipv6", format!("{addr}/{len}")), (*addr).into(), *len));
    }
    v4.into_values().chain(v6.into_values()).collect()
}

pub fn neighbours(s: &Snapshot, maps: &Maps) -> Vec<NeighbourJson> {
    let now = now_coarse_ns();
    s.applied
        .neigh
        .iter()
        .map(|(k, e)| {
            let used = maps.neigh_used_ns(k).ok().flatten().filter(|ns| *ns != 0);
            NeighbourJson {
                ifindex: k.ifindex,
                dev: s.dev_names.get(&k.ifindex).cloned(),
                address: k.addr.to_string(),
                mac: fmt_mac(&e.mac),
                used_ms_ago: used.map(|ns| now.saturating_sub(ns) / 1_000_000),
            }
        })
        .collect()
}

#[derive(Deserialize)]
struct Request {
    cmd: String,
    #[serde(default)]
    limit: Option<usize>,
}

fn answer(line: &str, shared: &Shared, maps: &Maps) -> serde_json::Value {
    let snap = match shared.lock() {
        Ok(g) => Arc::clone(&g),
        Err(p) => Arc::clone(&p.into_inner()),
    };
    let data: Result<serde_json::Value> = (|| {
        let req: Request = serde_json::from_str(line).context("bad request (want {\"cmd\":\"status\"|\"routes\"|\"neighbours\"})")?;
        Ok(match req.cmd.as_str() {
            "status" => serde_json::to_value(status(&snap, maps)?)?,
            "routes" => serde_json::to_value(routes(&snap))?,
            "neighbours" | "neighbors" => serde_json::to_value(neighbours(&snap, maps))?,
            "flows" => serde_json::to_value(crate::flows::list(&snap, maps, req.limit.unwrap_or(20))?)?,
            "resources" => serde_json::to_value(crate::resources_cli::resources(&snap)?)?,
            "route_batch" => crate::route_batch::handle(line, &snap)?,
            other => bail!("unknown command {other:?}"),
        })
    })();
    match data {
        Ok(d) => json!({"ok": true, "data": d}),
        Err(e) => json!({"ok": false, "error": format!("{e:#}")}),
    }
}

fn serve_conn(stream: UnixStream, shared: &Shared, maps: &Maps) -> std::io::Result<()> {
    // A client that goes quiet must not block everyone else.
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut out = stream.try_clone()?;
    for line in BufReader::new(stream).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let mut resp = answer(&line, shared, maps).to_string();
        resp.push('\n');
        out.write_all(resp.as_bytes())?;
    }
    Ok(())
}

/// The socket file; removed on drop.
pub struct Server {
    path: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            log::warn!("removing {}: {e}", self.path.display());
        }
    }
}

/// Binds the socket (0600, parent created 0700) and serves it from a thread.
/// `stale`: preflight saw a socket file nobody answered on.
pub fn serve(path: &Path, stale: bool, shared: Shared, maps: Maps) -> Result<Server> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    if stale {
        // Re-check right before removing: a daemon may have started since preflight.
        if UnixStream::connect(path).is_ok() {
            bail!("another fastpath daemon is already serving {}", path.display());
        }
        log::info!("removing stale socket {}", path.display());
        std::fs::remove_file(path).with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    // Bind under a tight umask so the socket is never reachable by others, not even briefly.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = bound.with_context(|| format!("binding API socket {}", path.display()))?;
    let server = Server { path: path.to_path_buf() };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", path.display()))?;
    std::thread::Builder::new()
        .name("api".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(s) => {
                        if let Err(e) = serve_conn(s, &shared, &maps) {
                            log::debug!("API connection: {e}");
                        }
                    }
                    Err(e) => log::warn!("API accept: {e}"),
                }
            }
        })
        .context("starting the API thread")?;
    log::info!("API listening on {}", path.display());
    Ok(server)
}

/// One request, one answer; Err with a one-line message otherwise.
pub fn request(path: &Path, cmd: &str) -> Result<serde_json::Value> {
    request_with(path, json!({ "cmd": cmd }))
}

pub fn request_with(path: &Path, req: serde_json::Value) -> Result<serde_json::Value> {
    let mut stream = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e) if e.kind() == ErrorKind::NotFound => bail!("daemon not running (no socket at {})", path.display()),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            bail!("daemon not running (stale socket at {})", path.display())
        }
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            bail!("cannot connect to {}: permission denied (the API is root-only)", path.display())
        }
        Err(e) => return Err(e).with_context(|| format!("connecting to {}", path.display())),
    };
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = req.to_string();
    req.push('\n');
    stream.write_all(req.as_bytes()).with_context(|| format!("sending to {}", path.display()))?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).with_context(|| format!("reading from {}", path.display()))?;
    if line.is_empty() {
        bail!("daemon at {} closed the connection without answering", path.display());
    }
    let mut resp: serde_json::Value = serde_json::from_str(&line).context("daemon sent invalid JSON")?;
    if resp["ok"].as_bool() == Some(true) {
        Ok(resp["data"].take())
    } else {
        Err(anyhow!("daemon: {}", resp["error"].as_str().unwrap_or("unknown error")))
    }
}

fn print_json(v: &serde_json::Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub fn client_status(args: &StatusArgs) -> Result<()> {
    let data = request(&args.client.socket, "status")?;
    if args.client.json {
        return print_json(&data);
    }
    let s: Status = serde_json::from_value(data).context("daemon sent an unexpected status")?;
    print!("{}", render::status(&s, args.all));
    Ok(())
}

pub fn client_routes(args: &ClientArgs) -> Result<()> {
    let data = request(&args.socket, "routes")?;
    if args.json {
        return print_json(&data);
    }
    let r: Vec<RouteJson> = serde_json::from_value(data).context("daemon sent unexpected routes")?;
    print!("{}", render::routes(&r));
    Ok(())
}

pub fn client_neighbours(args: &ClientArgs) -> Result<()> {
    let data = request(&args.socket, "neighbours")?;
    if args.json {
        return print_json(&data);
    }
    let n: Vec<NeighbourJson> = serde_json::from_value(data).context("daemon sent unexpected neighbours")?;
    print!("{}", render::neighbours(&n));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_split_by_family() {
        assert_eq!(problem_families("fib6 full: IPv6 punted"), (false, true));
        assert_eq!(problem_families("IPv4: non-default ip rules"), (true, false));
        assert_eq!(problem_families("next-hop table full"), (true, true));
    }

    #[test]
    fn routes_carry_offload_status_and_list_failed_routes_not_in_the_map() {
        let mut d = Desired::default();
        let k = |a: &str, l: u8| (a.parse::<std::net::Ipv4Addr>().expect("v4"), l);
        let punt = RouteEntry { action: RouteAction::Punt { reason: 15 }, mtu: 0 };
        d.fib4.insert(k("203.0.113.0", 24), punt);
        d.fib4.insert(k("198.51.100.0", 24), RouteEntry { action: RouteAction::Local, mtu: 0 });
        d.offload.failed4.insert(k("203.0.113.77", 32));
        d.offload.covers4.insert(k("203.0.113.0", 24));
        d.offload.failed6.insert(("2001:db8::".parse().expect("v6"), 64));
        let s = Snapshot { applied: Arc::new(d), ..Default::default() };
        let got: Vec<(String, String, String)> =
            routes(&s).into_iter().map(|r| (r.prefix, r.action, r.offload)).collect();
        let want = [
            ("198.51.100.0/24", "local", "ok"),
            ("203.0.113.0/24", "punt", "punted-cover"),
            ("203.0.113.77/32", "none", "failed"),
            ("2001:db8::/64", "none", "failed"),
        ];
        let want: Vec<(String, String, String)> =
            want.iter().map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn mac_format() {
        assert_eq!(fmt_mac(&[0xaa, 0xbb, 0, 1, 2, 0xff]), "aa:bb:00:01:02:ff");
    }
}
