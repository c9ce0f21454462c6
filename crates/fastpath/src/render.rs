//! Text output of the CLI clients: aligned tables for humans. Scripts use
//! `--json`, whose shapes are documented in api.rs.

use std::fmt::Write;

use fastpath_bpf::intf::REASON_NAMES;

use crate::api::{HashStatus, NeighbourJson, NexthopJson, PacketsBytes, RouteJson, Status};

/// Left-aligned columns, right-aligned where every cell is a number.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let n = headers.len();
    let mut width: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    let mut numeric = vec![true; n];
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            width[i] = width[i].max(c.chars().count());
            if c.parse::<f64>().is_err() && c != "-" {
                numeric[i] = false;
            }
        }
    }
    let line = |cells: Vec<&str>, out: &mut String| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let w = width[i];
            if i > 0 {
                s.push_str("  ");
            }
            if numeric[i] {
                let _ = write!(s, "{c:>w$}");
            } else {
                let _ = write!(s, "{c:<w$}");
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    let mut out = String::new();
    line(headers.to_vec(), &mut out);
    for r in rows {
        line(r.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

/// The program variant, and which source hashed the packets seen so far.
fn hash_source(h: &HashStatus) -> String {
    let seen: Vec<String> =
        h.packets.iter().filter(|(_, n)| **n > 0).map(|(src, n)| format!("{src} {n}")).collect();
    if seen.is_empty() {
        h.variant.clone()
    } else {
        format!("{} ({})", h.variant, seen.join(", "))
    }
}

fn yes(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

fn counter_rows(rows: &mut Vec<Vec<String>>, who: &str, c: &std::collections::BTreeMap<String, PacketsBytes>, all: bool) {
    for name in REASON_NAMES {
        let v = c.get(*name).copied().unwrap_or_default();
        if all || v.packets != 0 || v.bytes != 0 {
            rows.push(vec![who.to_string(), name.to_string(), v.packets.to_string(), v.bytes.to_string()]);
        }
    }
}

pub fn status(s: &Status, all: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "generation {}   netlink resyncs {}   neighbour keep-alives {}   table updates {} full, {} route-only, {} neighbour-only, {} written ahead, {} carrier back",
        s.generation,
        s.netlink_resyncs,
        s.neigh_keepalives,
        s.reconciles.full,
        s.reconciles.routes,
        s.reconciles.neighbours,
        s.reconciles.ahead,
        s.reconciles.links
    );
    if let Some(c) = &s.conntrack {
        let _ = writeln!(
            out,
            "mode stateful: ct mark {:#x}, reply {:#x}, revalidate {} ms{}, ct generation {}: events {}  bumps {}  overruns {}  ruleset changes {}  marks cleared {}",
            c.mark,
            c.mark_reply,
            c.revalidate_ms,
            if c.revalidate_effective_ms < c.revalidate_ms {
                format!(" (capped at {} ms: half the shortest conntrack timeout)", c.revalidate_effective_ms)
            } else {
                String::new()
            },
            c.generation, c.counters.events, c.counters.bumps, c.counters.overruns,
            c.counters.ruleset_changes, c.counters.marks_cleared
        );
        let _ = writeln!(
            out,
            "  icmp echo entries copied {} of {}: requests {}  timeout refreshes {}  table full {}  errors {}",
            c.counters.icmp_tracked, c.icmp_capacity, c.counters.icmp_requests, c.counters.icmp_refreshes,
            c.counters.icmp_full, c.counters.icmp_errors
        );
        if !c.events_enabled {
            out.push_str("  problem: net.netfilter.nf_conntrack_events is 0 (only entries the ruleset gives an event mask with `ct event set` send events; the others' revocations wait for the revalidation)\n");
        }
    } else {
        out.push_str("mode stateless\n");
    }
    if let Some(a) = &s.afxdp {
        let _ = writeln!(
            out,
            "datapath afxdp: {} sockets, {} queue(s), {} mode, batch {}, prefetch {}, busy poll {}: rx {}  forwarded {} ({} bytes)  dropped meta {} parse {} ttl {} tx-full {}",
            a.sockets, a.queues, a.mode, a.batch, a.prefetch, if a.busy_poll { "on" } else { "off" }, a.rx, a.forwarded,
            a.forwarded_bytes, a.drop_meta, a.drop_parse, a.drop_ttl, a.drop_tx_full
        );
    }
    for (fam, f) in [("ipv4", &s.families.ipv4), ("ipv6", &s.families.ipv6)] {
        let state = if f.fast_path { "fast path" } else { "PUNTED to the kernel" };
        let _ = writeln!(out, "{fam}: {state}   multipath hash: {}", f.multipath_hash);
        for p in &f.problems {
            let _ = writeln!(out, "  problem: {p}");
        }
    }
    out.push('\n');

    let rows: Vec<Vec<String>> = s
        .interfaces
        .iter()
        .map(|i| {
            vec![
                i.name.clone(),
                i.ifindex.to_string(),
                i.xdp_mode.clone(),
                i.mac.clone(),
                i.mtu.to_string(),
                yes(i.up),
                yes(i.fwd4),
                yes(i.fwd6),
                i.rp_filter.to_string(),
                hash_source(&i.hash),
            ]
        })
        .collect();
    out.push_str(&table(
        &["INTERFACE", "IFINDEX", "XDP", "MAC", "MTU", "UP", "FWD4", "FWD6", "RP_FILTER", "FLOW HASH"],
        &rows,
    ));
    out.push('\n');

    let fc = &s.flow_cache;
    let ev = |n: &str| fc.events.get(n).copied().unwrap_or(0);
    if fc.enabled {
        let _ = writeln!(
            out,
            "flow cache: on, {} entries per CPU, idle timeout {} s, {}: hit {}  miss {}  stale {}  expired {}  evict {}  bypass {}\n",
            fc.entries_per_cpu,
            fc.timeout_s,
            if fc.key == "addresses" { "TCP/UDP keyed by address pair" } else { "keyed by 5-tuple" },
            ev("hit"),
            ev("miss"),
            ev("stale"),
            ev("expired"),
            ev("evict"),
            ev("bypass")
        );
    } else {
        out.push_str("flow cache: off\n\n");
    }

    let rows: Vec<Vec<String>> = s
        .tables
        .named()
        .iter()
    .map(|(n, o)| vec![n.to_string(), o.used.to_string(), o.capacity.to_string()])
    .collect();
    out.push_str(&table(&["TABLE", "USED", "CAPACITY"], &rows));
    match &s.fib4_dir24 {
        Some(d) => out.push_str(&format!(
            "fib4 index: dir24, {} of {} route values, {} /24 blocks sent to the trie (a longer route in them), {} routes without a value slot\n",
            d.vals, d.vals_capacity, d.trie_blocks, d.unslotted
        )),
        None => out.push_str("fib4 index: trie\n"),
    }
    match &s.fib6_multibit {
        Some(d) => out.push_str(&format!(
            "fib6 index: multibit, {} of {} route values, {} entries in {} slots, {} /16s sent to the trie, {} route values without a slot\n",
            d.vals, d.vals_capacity, d.entries, d.entries_capacity, d.trie_tops, d.unslotted
        )),
        None => out.push_str("fib6 index: trie\n"),
    }
    if let Some(p) = &s.daemon {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let _ = writeln!(
            out,
            "daemon: pid {}, {:.1} MiB resident (peak {:.1} MiB), CPU {:.1} s, {} open fds",
            p.pid,
            mib(p.resident_bytes),
            mib(p.peak_resident_bytes),
            p.cpu_seconds,
            p.open_fds
        );
    }
    out.push('\n');

    let mut rows = Vec::new();
    for i in &s.interfaces {
        counter_rows(&mut rows, &i.name, &i.counters, all);
    }
    counter_rows(&mut rows, "(total)", &s.totals, all);
    if rows.is_empty() {
        out.push_str("no packets seen yet\n");
    } else {
        out.push_str(&table(&["INTERFACE", "REASON", "PACKETS", "BYTES"], &rows));
    }
    out
}

fn via_dev(n: &Option<NexthopJson>) -> (String, String) {
    match n {
        Some(n) => (
            n.gateway.clone().unwrap_or_else(|| "on-link".into()),
            n.dev.clone().unwrap_or_else(|| format!("#{}", n.ifindex)),
        ),
        None => ("-".into(), "-".into()),
    }
}

/// One row per route; a multipath route is followed by one row per path
/// (its upper bound, or "dead"; "punt" where we cannot forward by it).
pub fn routes(r: &[RouteJson]) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for r in r {
        let (via, dev) = via_dev(&r.nexthop);
        let mut action = match &r.reason {
            Some(reason) => format!("{} ({reason})", r.action),
            None => r.action.clone(),
        };
        if let Some(g) = &r.group {
            action = if g.kind == "resilient" {
                format!("{action} (group {}, resilient, {} buckets)", g.id, g.buckets)
            } else {
                format!("{action} (group {})", g.id)
            };
        }
        let mtu = if r.mtu == 0 { "-".to_string() } else { r.mtu.to_string() };
        let offload = if r.offload.is_empty() { "ok".to_string() } else { r.offload.clone() };
        rows.push(vec![r.prefix.clone(), action, via, dev, mtu, offload]);
        for (i, p) in r.group.iter().flat_map(|g| g.paths.iter().map(move |p| (g, p))).enumerate() {
            let (g, p) = p;
            let (via, dev) = via_dev(&p.nexthop);
            let what = if p.nexthop.is_none() {
                "punt".to_string()
            } else if g.kind == "resilient" {
                "member".to_string()
            } else if p.upper_bound < 0 {
                "dead".to_string()
            } else {
                format!("upto {}", p.upper_bound)
            };
            rows.push(vec![format!("  path {i}"), what, via, dev, String::new(), String::new()]);
        }
    }
    if rows.is_empty() {
        return "no routes\n".into();
    }
    table(&["PREFIX", "ACTION", "VIA", "DEV", "MTU", "OFFLOAD"], &rows)
}

pub fn neighbours(n: &[NeighbourJson]) -> String {
    let rows: Vec<Vec<String>> = n
        .iter()
        .map(|n| {
            vec![
                n.address.clone(),
                n.dev.clone().unwrap_or_else(|| format!("#{}", n.ifindex)),
                n.mac.clone(),
                n.used_ms_ago.map(|m| m.to_string()).unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    if rows.is_empty() {
        return "no neighbours\n".into();
    }
    table(&["ADDRESS", "DEV", "MAC", "USED_MS_AGO"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align() {
        let t = table(&["A", "NUM"], &[vec!["long-name".into(), "5".into()], vec!["x".into(), "123".into()]]);
        assert_eq!(t, "A          NUM\nlong-name    5\nx          123\n");
    }
}
