//! `fastpath flows`: the busiest entries of the per-CPU flow cache, read
//! straight from fp_flows (see api.rs for the JSON shape).

use std::net::{Ipv4Addr, Ipv6Addr};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::api::{self, fmt_mac, Snapshot};
use crate::keepalive::neigh_clock_now;
use crate::maps::{CachedFlow, Maps};
use crate::render::table;

const AF_INET: u8 = 2;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FlowJson {
    pub family: String,
    pub proto: u8,
    pub src: String,
    pub dst: String,
    pub sport: u16,
    pub dport: u16,
    pub ingress: Option<String>,
    pub egress: Option<String>,
    pub nexthop: u32,
    pub dmac: String,
    pub packets: u64,
    /// IP bytes; null unless stateful mode keeps them.
    pub bytes: Option<u64>,
    pub cpus: u32,
    pub idle_s: u32,
    pub current: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FlowsJson {
    pub total: usize,
    pub flows: Vec<FlowJson>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct FlowsArgs {
    #[command(flatten)]
    pub client: crate::ClientArgs,
    /// Show at most this many flows, busiest first (0 = all).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
}

fn addr(family: u8, a: &[u8; 16]) -> String {
    if family == AF_INET {
        Ipv4Addr::new(a[0], a[1], a[2], a[3]).to_string()
    } else {
        Ipv6Addr::from(*a).to_string()
    }
}

fn slot_name(s: &Snapshot, slot: u32) -> Option<String> {
    s.ifaces.iter().find(|i| i.slot == slot).map(|i| i.name.clone())
}

fn flow_json(s: &Snapshot, now: u32, f: &CachedFlow) -> FlowJson {
    let k = &f.key;
    FlowJson {
        family: if k.family == AF_INET { "ipv4" } else { "ipv6" }.into(),
        proto: k.proto,
        src: addr(k.family, &k.saddr),
        dst: addr(k.family, &k.daddr),
        sport: u16::from_be(k.sport),
        dport: u16::from_be(k.dport),
        ingress: slot_name(s, u32::from(k.ingress)),
        egress: slot_name(s, u32::from(f.slot)),
        nexthop: f.nh_id,
        dmac: fmt_mac(&f.dmac),
        packets: f.packets,
        bytes: f.bytes,
        cpus: f.cpus,
        idle_s: now.saturating_sub(f.used),
        current: u64::from(f.generation) == s.generation & u64::from(u32::MAX),
    }
}

/// The cache's flows, busiest first, at most `limit` (0 = all).
pub fn list(s: &Snapshot, maps: &Maps, limit: usize) -> Result<FlowsJson> {
    let mut all = maps.flows().context("reading the flow cache")?;
    all.sort_by(|a, b| b.packets.cmp(&a.packets).then(a.used.cmp(&b.used).reverse()));
    let total = all.len();
    let n = if limit == 0 { total } else { limit.min(total) };
    let now = neigh_clock_now();
    Ok(FlowsJson { total, flows: all.iter().take(n).map(|f| flow_json(s, now, f)).collect() })
}

pub fn render(f: &FlowsJson) -> String {
    if f.flows.is_empty() {
        return "no cached flows\n".into();
    }
    let rows: Vec<Vec<String>> = f
        .flows
        .iter()
        .map(|f| {
            // ICMP keys carry type and code where TCP/UDP have ports (and,
            // in stateful mode, the echo id); an address-pair key (other
            // protocols, `--flow-key addresses`) has none.
            let icmp = f.proto == 1 || f.proto == 58;
            let (src, dst, proto) = if icmp {
                let id = if f.dport != 0 { format!(" id {}", f.dport) } else { String::new() };
                (f.src.clone(), f.dst.clone(), format!("icmp {}/{}{id}", f.sport >> 8, f.sport & 0xff))
            } else if f.sport == 0 && f.dport == 0 {
                (f.src.clone(), f.dst.clone(), f.proto.to_string())
            } else {
                (format!("{}:{}", f.src, f.sport), format!("{}:{}", f.dst, f.dport), f.proto.to_string())
            };
            vec![
                src,
                dst,
                proto,
                f.ingress.clone().unwrap_or_else(|| "-".into()),
                f.egress.clone().unwrap_or_else(|| "-".into()),
                f.dmac.clone(),
                f.packets.to_string(),
                f.bytes.map_or_else(|| "-".into(), |b| b.to_string()),
                f.idle_s.to_string(),
                if f.current { "yes" } else { "stale" }.into(),
            ]
        })
        .collect();
    let mut out = table(&["SOURCE", "DESTINATION", "PROTO", "IN", "OUT", "NEXT HOP MAC", "PACKETS", "BYTES", "IDLE_S", "CURRENT"], &rows);
    if f.total > f.flows.len() {
        out.push_str(&format!("({} of {} cached flows; --limit 0 shows all)\n", f.flows.len(), f.total));
    }
    out
}

pub fn client(args: &FlowsArgs) -> Result<()> {
    let data = api::request_with(&args.client.socket, json!({"cmd": "flows", "limit": args.limit}))?;
    if args.client.json {
        println!("{}", serde_json::to_string_pretty(&data)?);
        return Ok(());
    }
    let f: FlowsJson = serde_json::from_value(data).context("daemon sent unexpected flows")?;
    print!("{}", render(&f));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(proto: u8, sport: u16, dport: u16) -> FlowJson {
        FlowJson {
            family: "ipv4".into(),
            proto,
            src: "192.0.2.2".into(),
            dst: "203.0.113.1".into(),
            sport,
            dport,
            ingress: Some("r0".into()),
            egress: Some("r1".into()),
            nexthop: 1,
            dmac: "02:00:00:00:00:01".into(),
            packets: 3,
            bytes: None,
            cpus: 1,
            idle_s: 0,
            current: true,
        }
    }

    #[test]
    fn ports_only_where_the_key_has_them() {
        let f = FlowsJson { total: 3, flows: vec![flow(17, 4000, 53), flow(17, 0, 0), flow(1, 0x0800, 0)] };
        let text = render(&f);
        let rows: Vec<&str> = text.lines().skip(1).collect();
        assert!(rows[0].starts_with("192.0.2.2:4000") && rows[0].contains("203.0.113.1:53"), "{text}");
        let cols: Vec<&str> = rows[1].split_whitespace().take(2).collect();
        assert_eq!(cols, ["192.0.2.2", "203.0.113.1"], "{text}");
        assert!(rows[2].contains("icmp 8/0"), "{text}");
    }
}
