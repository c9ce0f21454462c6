//! Netfilter rules the stateless fast path would bypass.
//!
//! A fast-pathed packet never reaches the netfilter hooks of forwarding:
//! prerouting (raw, mangle, DNAT, conntrack), forward (the firewall),
//! postrouting (SNAT, masquerade), nor the netdev ingress/egress hooks (XDP
//! runs before ingress, and a redirect skips egress). Forwarding past a
//! firewall rule is a policy violation, not a speed-up, so `fastpath run`
//! refuses to start while such base chains exist, and the daemon punts all
//! traffic when they appear later — unless the user said the bypass is
//! intended (`--allow-netfilter-bypass`).
//!
//! In stateful mode (`--mode stateful`) the forwarding ruleset is expected:
//! conntrack and the fast-path ct mark carry its verdict, and the daemon
//! clears the marks whenever the nftables ruleset changes (see ctwatch).
//! What stays refused there is what the mark cannot speak for: netdev
//! (and inet) ingress/egress chains, which run before conntrack or after
//! the redirect, iptables-legacy tables, whose changes send no event,
//! so marks they approved would outlive them, and rules that put packets in
//! conntrack zones: the data path looks entries up in the default zone
//! only, and a tuple a zoned packet shares with a default-zone entry (the
//! overlapping addresses zones exist for) would find that entry's verdict.

use std::fs;
use std::os::fd::RawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use log::warn;
use netlink_sys::protocols::NETLINK_NETFILTER;
use serde::Deserialize;

use crate::nlraw::Events;

/// Hooks forwarded traffic would have passed through.
const FORWARD_PATH_HOOKS: &[&str] = &["prerouting", "forward", "postrouting", "ingress", "egress"];
/// Hooks a stateful fast path still skips (see the module comment).
const STATEFUL_BYPASSED_HOOKS: &[&str] = &["ingress", "egress"];
/// Families whose base chains see routed IPv4/IPv6 packets.
const ROUTED_FAMILIES: &[&str] = &["ip", "ip6", "inet", "netdev"];

/// What the probe found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// "family table chain (hook)" of every base chain on the forwarding path,
    /// and "iptables-legacy table NAME" for loaded legacy tables.
    pub bypassed: Vec<String>,
    /// Why a part of the check could not be done (e.g. no `nft` binary).
    pub unchecked: Option<String>,
}

#[derive(Deserialize)]
struct NftOutput {
    nftables: Vec<NftItem>,
}

#[derive(Deserialize)]
struct NftItem {
    chain: Option<NftChain>,
    rule: Option<NftRule>,
}

#[derive(Deserialize)]
struct NftRule {
    family: String,
    table: String,
    chain: String,
    #[serde(default)]
    expr: serde_json::Value,
}

#[derive(Deserialize)]
struct NftChain {
    family: String,
    table: String,
    name: String,
    hook: Option<String>,
}

/// Base chains on the forwarding path in `nft -j list chains` output.
#[cfg(test)]
pub fn parse_nft_chains(json: &str) -> Result<Vec<String>, serde_json::Error> {
    parse_nft_chains_on(json, FORWARD_PATH_HOOKS)
}

fn hooks(stateful: bool) -> &'static [&'static str] {
    if stateful {
        STATEFUL_BYPASSED_HOOKS
    } else {
        FORWARD_PATH_HOOKS
    }
}

/// Base chains of routed families on one of `hooks`, then (from a listed
/// ruleset) the chains whose rules put packets in conntrack zones.
fn parse_nft_chains_on(json: &str, hooks: &[&str]) -> Result<Vec<String>, serde_json::Error> {
    let out: NftOutput = serde_json::from_str(json)?;
    let mut found = Vec::new();
    let mut zoned = Vec::new();
    for item in out.nftables {
        if let Some(c) = item.chain {
            if let Some(hook) = c.hook.filter(|h| hooks.contains(&h.as_str()) && ROUTED_FAMILIES.contains(&c.family.as_str())) {
                found.push(format!("{} {} {} ({hook})", c.family, c.table, c.name));
            }
        }
        if let Some(r) = item.rule {
            let chain = format!("{} {} {} (sets conntrack zones)", r.family, r.table, r.chain);
            if ROUTED_FAMILIES.contains(&r.family.as_str()) && sets_ct_zone(&r.expr) && !zoned.contains(&chain) {
                zoned.push(chain);
            }
        }
    }
    found.extend(zoned);
    Ok(found)
}

/// Whether a rule's statements assign a conntrack zone: nft's `ct [original|
/// reply] zone set ...` (a mangle of the ct zone key) anywhere in it, or
/// iptables-nft's CT target, whose options (`--zone`) nft cannot show.
/// Matching on a zone (`ct zone 2`) assigns nothing.
fn sets_ct_zone(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Array(a) => a.iter().any(sets_ct_zone),
        Value::Object(o) => {
            let zone_key = |m: &Value| m.pointer("/key/ct/key").and_then(Value::as_str) == Some("zone");
            let ct_target = |x: &Value| {
                x.get("type").and_then(Value::as_str) == Some("target") && x.get("name").and_then(Value::as_str) == Some("CT")
            };
            o.get("mangle").is_some_and(zone_key) || o.get("xt").is_some_and(ct_target) || o.values().any(sets_ct_zone)
        }
        _ => false,
    }
}

/// Probes the current network namespace (stateless mode).
#[allow(dead_code)] // the stateless entry point, kept for callers outside the daemon
pub fn probe() -> Findings {
    probe_mode(false)
}

/// Probes for what the fast path of this mode would bypass.
pub fn probe_mode(stateful: bool) -> Findings {
    let mut f = probe_nft(stateful);
    f.bypassed.extend(legacy_tables());
    f
}

/// The nftables part: base chains on the mode's hooks and (stateful) zone rules.
fn probe_nft(stateful: bool) -> Findings {
    let mut f = Findings::default();
    // Stateful mode reads the rules too (zones), without set elements (-t):
    // a blocklist of a million addresses is no business of this check.
    let args: &[&str] = if stateful { &["-j", "-t", "list", "ruleset"] } else { &["-j", "list", "chains"] };
    let cmd = format!("nft {}", args.join(" "));
    match Command::new("nft").args(args).output() {
        Ok(o) if o.status.success() => match parse_nft_chains_on(&String::from_utf8_lossy(&o.stdout), hooks(stateful)) {
            Ok(chains) => f.bypassed = chains,
            Err(e) => f.unchecked = Some(format!("cannot parse `{cmd}`: {e}")),
        },
        Ok(o) => f.unchecked = Some(format!("`{cmd}` failed: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => f.unchecked = Some(format!("cannot run nft to check nftables rules: {e}")),
    }
    f
}

/// How a legacy table is named in the findings.
const LEGACY: &str = "iptables-legacy ";

/// Legacy x_tables register their hooks when a table is loaded; they send
/// no event when they do.
fn legacy_tables() -> Vec<String> {
    let mut v = Vec::new();
    for (file, fam) in [("/proc/net/ip_tables_names", "ip"), ("/proc/net/ip6_tables_names", "ip6")] {
        if let Ok(names) = fs::read_to_string(file) {
            v.extend(names.split_whitespace().map(|t| format!("{LEGACY}{fam} table {t}")));
        }
    }
    v
}

/// nftables sends an event for every committed change (NFNLGRP_NFTABLES,
/// an overrun counting as one), so the ruleset, whose listing grows with
/// it, is read on those and otherwise only this often, as a safety net.
const NFT_RECHECK: Duration = Duration::from_secs(30);

/// include/uapi/linux/netfilter/nfnetlink.h
const NFNLGRP_NFTABLES: u32 = 7;

/// Re-probes while the daemon runs: rules added after start must stop the
/// fast path too, in the round of the daemon's loop that the event of the
/// commit adding them wakes.
pub struct Watcher {
    allowed: bool,
    stateful: bool,
    current: Vec<String>,
    /// The nftables part of `current`, kept between ruleset reads.
    nft: Vec<String>,
    nft_read: Instant,
    /// None if the subscription failed: then the ruleset is read every period.
    events: Option<Events>,
}

impl Watcher {
    /// `initial`: the findings of preflight; `allowed`: --allow-netfilter-bypass.
    pub fn new(initial: &Findings, allowed: bool) -> Self {
        let nft = initial.bypassed.iter().filter(|b| !b.starts_with(LEGACY)).cloned().collect();
        // --allow-netfilter-bypass: nothing to follow.
        let events = match (!allowed).then(|| Events::open(NETLINK_NETFILTER, NFNLGRP_NFTABLES, "nftables")) {
            Some(Ok(e)) => Some(e),
            Some(Err(e)) => {
                warn!("subscribing to nftables events: {e}; the ruleset is read every second instead");
                None
            }
            None => None,
        };
        Watcher { allowed, stateful: false, current: initial.bypassed.clone(), nft, nft_read: Instant::now(), events }
    }

    /// Stateful mode: only what the ct mark cannot speak for blocks.
    pub fn stateful(mut self, on: bool) -> Self {
        self.stateful = on;
        self
    }

    /// The event socket, which wakes the daemon's loop (`refresh` drains it).
    pub fn wake_fds(&self, out: &mut Vec<RawFd>) {
        if !self.allowed {
            out.extend(self.events.as_ref().map(Events::fd));
        }
    }

    /// Called every round of the daemon's loop (`periodic`: once a second):
    /// the ruleset is read when it changed (or, unsubscribed, every
    /// period), the legacy tables every period. True if what the daemon
    /// must punt changed.
    pub fn refresh(&mut self, periodic: bool) -> bool {
        if self.allowed {
            return false;
        }
        let changed = self.events.as_mut().is_some_and(Events::drain);
        let read_nft = changed || (periodic && (self.events.is_none() || self.nft_read.elapsed() >= NFT_RECHECK));
        if !read_nft && !periodic {
            return false;
        }
        let nft = read_nft.then(|| {
            self.nft_read = Instant::now();
            probe_nft(self.stateful)
        });
        self.update(nft, legacy_tables())
    }

    /// A probe that could not check proves nothing: keep what we knew, so
    /// a failing `nft` never lifts the punt while chains exist (fail closed).
    /// `nft`: None when the ruleset was not read this time.
    fn update(&mut self, nft: Option<Findings>, legacy: Vec<String>) -> bool {
        if let Some(f) = nft {
            if f.unchecked.is_some() {
                return false;
            }
            self.nft = f.bypassed;
        }
        let now: Vec<String> = self.nft.iter().cloned().chain(legacy).collect();
        let changed = now != self.current;
        self.current = now;
        changed
    }

    /// Chains that must stop the fast path now (empty when allowed or none).
    pub fn blocking(&self) -> &[String] {
        if self.allowed {
            &[]
        } else {
            &self.current
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarding_path_base_chains_only() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
            {"chain": {"family": "inet", "table": "fw", "name": "fwd", "handle": 1, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}},
            {"chain": {"family": "ip", "table": "nat", "name": "post", "handle": 2, "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}},
            {"chain": {"family": "inet", "table": "fw", "name": "in", "handle": 3, "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
            {"chain": {"family": "inet", "table": "fw", "name": "regular", "handle": 4}},
            {"chain": {"family": "bridge", "table": "br", "name": "f", "handle": 5, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}},
            {"chain": {"family": "netdev", "table": "nd", "name": "ing", "handle": 6, "type": "filter", "hook": "ingress", "prio": 0, "policy": "accept"}}]}"#;
        assert_eq!(
            parse_nft_chains(json).unwrap(),
            vec!["inet fw fwd (forward)", "ip nat post (postrouting)", "netdev nd ing (ingress)"]
        );
    }

    #[test]
    fn stateful_mode_refuses_only_netdev_hooks() {
        let json = r#"{"nftables": [
            {"chain": {"family": "inet", "table": "fw", "name": "fwd", "handle": 1, "type": "filter", "hook": "forward", "prio": 0, "policy": "drop"}},
            {"chain": {"family": "ip", "table": "nat", "name": "post", "handle": 2, "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}},
            {"chain": {"family": "inet", "table": "fw", "name": "early", "handle": 3, "type": "filter", "hook": "ingress", "prio": 0, "policy": "accept"}},
            {"chain": {"family": "netdev", "table": "nd", "name": "eg", "handle": 6, "type": "filter", "hook": "egress", "prio": 0, "policy": "accept"}}]}"#;
        assert_eq!(
            parse_nft_chains_on(json, hooks(true)).unwrap(),
            vec!["inet fw early (ingress)", "netdev nd eg (egress)"]
        );
        assert_eq!(parse_nft_chains_on(json, hooks(false)).unwrap().len(), 4);
    }

    #[test]
    fn stateful_mode_refuses_conntrack_zones() {
        // As nft 1.0.6 lists them: a plain zone, a per-direction map, a
        // zone match, and iptables-nft's CT target.
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
            {"chain": {"family": "inet", "table": "raw", "name": "pre", "handle": 1, "type": "filter", "hook": "prerouting", "prio": -300, "policy": "accept"}},
            {"rule": {"family": "inet", "table": "raw", "chain": "pre", "handle": 2, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "lo"}}, {"mangle": {"key": {"ct": {"key": "zone"}}, "value": 3}}]}},
            {"rule": {"family": "inet", "table": "raw", "chain": "pre", "handle": 4, "expr": [{"mangle": {"key": {"ct": {"key": "zone", "dir": "original"}}, "value": {"map": {"key": {"meta": {"key": "iifname"}}, "data": {"set": [["lo", 4]]}}}}}]}},
            {"rule": {"family": "ip", "table": "fw", "chain": "fwd", "handle": 5, "expr": [{"match": {"op": "==", "left": {"ct": {"key": "zone"}}, "right": 2}}, {"mangle": {"key": {"ct": {"key": "mark"}}, "value": 1}}]}},
            {"rule": {"family": "ip", "table": "raw", "chain": "PREROUTING", "handle": 6, "expr": [{"counter": {"packets": 0, "bytes": 0}}, {"xt": {"type": "target", "name": "CT"}}]}},
            {"rule": {"family": "bridge", "table": "br", "chain": "pre", "handle": 7, "expr": [{"mangle": {"key": {"ct": {"key": "zone"}}, "value": 3}}]}}]}"#;
        assert_eq!(
            parse_nft_chains_on(json, hooks(true)).unwrap(),
            vec!["inet raw pre (sets conntrack zones)", "ip raw PREROUTING (sets conntrack zones)"]
        );
    }

    #[test]
    fn empty_ruleset() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}}]}"#;
        assert!(parse_nft_chains(json).unwrap().is_empty());
    }

    #[test]
    fn watcher_fails_closed_and_honours_the_override() {
        let chains = vec!["inet fw transit (forward)".to_string()];
        let found = Findings { bypassed: chains.clone(), unchecked: None };
        let mut w = Watcher::new(&found, false);
        assert_eq!(w.blocking(), chains.as_slice());
        // nft failing says nothing about the rules: still blocked.
        assert!(!w.update(Some(Findings { bypassed: vec![], unchecked: Some("nft failed".into()) }), vec![]));
        assert_eq!(w.blocking(), chains.as_slice());
        // Not read this time: what was read last still holds.
        assert!(!w.update(None, vec![]));
        assert_eq!(w.blocking(), chains.as_slice());
        // A legacy table comes and goes without an nftables read.
        let legacy = vec!["iptables-legacy ip table filter".to_string()];
        assert!(w.update(None, legacy.clone()));
        assert_eq!(w.blocking(), [chains.clone(), legacy].concat().as_slice());
        assert!(w.update(None, vec![]));
        // A real empty answer lifts it.
        assert!(w.update(Some(Findings::default()), vec![]));
        assert!(w.blocking().is_empty());
        assert!(w.update(Some(found.clone()), vec![]));
        // --allow-netfilter-bypass: never blocks.
        assert!(Watcher::new(&found, true).blocking().is_empty());
    }

    #[test]
    fn garbage_is_an_error_not_a_pass() {
        assert!(parse_nft_chains("not json").is_err());
    }
}
