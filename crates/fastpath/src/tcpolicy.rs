//! tc policy the fast path would bypass on the managed ports.
//!
//! XDP runs before tc ingress, and a redirect hands the frame to the egress
//! driver past its qdisc: a fast-pathed packet would skip the tc filters and
//! tcx programs of the port it arrived on, and the qdisc (shaping, classes,
//! priorities), egress filters and tcx programs of the port it leaves by.
//! So the daemon marks such ports in their fp_ifaces entries: what arrives
//! on a port with ingress policy, and what would leave by a port with
//! egress policy, goes to the kernel (`tc_ingress`, `tc_egress`); the other
//! ports stay fast. `--allow-tc-bypass` forwards past it all.
//!
//! Queueing-only disciplines (the kernel's defaults and AQMs without rates
//! or classes) are no policy: every XDP forwarder skips them.

use std::os::fd::RawFd;
use std::process::Command;

use libbpf_rs::libbpf_sys;
use log::warn;
use netlink_sys::protocols::NETLINK_ROUTE;
use serde::Deserialize;

use crate::nlraw::Events;

const RTNLGRP_TC: u32 = 4;

/// Root or child qdiscs that only queue: skipping them changes no verdict.
const QUEUE_ONLY: &[&str] = &[
    "noqueue", "noop", "pfifo_fast", "pfifo", "bfifo", "pfifo_head_drop", "mq", "fq_codel", "fq", "codel", "sfq",
    "pie", "fq_pie",
];

/// One piece of tc policy on a managed port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bypass {
    pub ifindex: u32,
    pub dev: String,
    /// On the way out (qdisc, egress filters or tcx), else on the way in.
    pub egress: bool,
    /// "qdisc htb (root)", "tc ingress filters", "1 tcx egress program(s)".
    pub what: String,
}

/// What the probe found on the managed ports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    pub bypassed: Vec<Bypass>,
    /// Why the probe could not look (e.g. no `tc` binary).
    pub unchecked: Option<String>,
}

#[derive(Deserialize)]
struct Qdisc {
    kind: String,
    dev: String,
    #[serde(default)]
    root: bool,
    parent: Option<String>,
}

/// Policy qdiscs on `devs` in `tc -j qdisc show` output as (dev, what),
/// and the (dev, hook) whose filters must be listed (ingress, and egress
/// with clsact).
#[allow(clippy::type_complexity)]
fn parse_qdiscs(json: &str, devs: &[&str]) -> Result<(Vec<(String, String)>, Vec<(String, &'static str)>), serde_json::Error> {
    let qdiscs: Vec<Qdisc> = serde_json::from_str(json)?;
    let (mut policy, mut hooks) = (Vec::new(), Vec::new());
    for q in qdiscs.into_iter().filter(|q| devs.contains(&q.dev.as_str())) {
        match q.kind.as_str() {
            "clsact" => {
                hooks.push((q.dev.clone(), "ingress"));
                hooks.push((q.dev, "egress"));
            }
            "ingress" => hooks.push((q.dev, "ingress")),
            k if QUEUE_ONLY.contains(&k) => {}
            k => {
                let at = if q.root { "root".to_string() } else { format!("parent {}", q.parent.as_deref().unwrap_or("?")) };
                policy.push((q.dev, format!("qdisc {k} ({at})")));
            }
        }
    }
    Ok((policy, hooks))
}

fn tc_json(args: &[&str]) -> Result<String, String> {
    match Command::new("tc").arg("-j").args(args).output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => Err(format!("`tc -j {}` failed: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Err(format!("cannot run tc to check the ports' qdiscs and filters: {e}")),
    }
}

/// Programs attached to `ifindex` by tcx (bpf links, no qdisc); 0 where the
/// kernel has no tcx.
fn tcx_count(ifindex: u32, attach: libbpf_sys::bpf_attach_type) -> u32 {
    let mut opts = libbpf_sys::bpf_prog_query_opts {
        sz: size_of::<libbpf_sys::bpf_prog_query_opts>() as libbpf_sys::size_t,
        ..Default::default()
    };
    // SAFETY: opts is a valid, sized bpf_prog_query_opts; no id arrays are
    // passed, so the kernel only fills in the count.
    let r = unsafe { libbpf_sys::bpf_prog_query_opts(ifindex as i32, attach, &mut opts) };
    if r == 0 {
        // SAFETY: both union members are the same u32 (prog_cnt, count).
        unsafe { opts.__bindgen_anon_1.count }
    } else {
        0
    }
}

/// Probes the managed ports, (name, ifindex) each: qdiscs, filters, tcx.
pub fn probe(ports: &[(String, u32)]) -> Findings {
    let mut f = probe_tc(ports);
    f.bypassed.extend(probe_tcx(ports));
    f
}

/// Their qdiscs and filters, through `tc -j` (a fork or two per probe).
fn probe_tc(ports: &[(String, u32)]) -> Findings {
    let mut f = Findings::default();
    let devs: Vec<&str> = ports.iter().map(|(n, _)| n.as_str()).collect();
    let ifindex = |dev: &str| ports.iter().find(|(n, _)| n == dev).map_or(0, |(_, i)| *i);
    let (policy, hooks) = match tc_json(&["qdisc", "show"]).and_then(|j| {
        parse_qdiscs(&j, &devs).map_err(|e| format!("cannot parse `tc -j qdisc show`: {e}"))
    }) {
        Ok(v) => v,
        Err(why) => return Findings { bypassed: vec![], unchecked: Some(why) },
    };
    for (dev, what) in policy {
        f.bypassed.push(Bypass { ifindex: ifindex(&dev), dev, egress: true, what });
    }
    for (dev, hook) in hooks {
        match tc_json(&["filter", "show", "dev", &dev, hook]) {
            Ok(j) => match serde_json::from_str::<Vec<serde_json::Value>>(&j) {
                Ok(v) if v.is_empty() => {}
                Ok(_) => f.bypassed.push(Bypass {
                    ifindex: ifindex(&dev),
                    egress: hook == "egress",
                    what: format!("tc {hook} filters"),
                    dev,
                }),
                Err(e) => f.unchecked = Some(format!("cannot parse `tc -j filter show dev {dev} {hook}`: {e}")),
            },
            Err(why) => f.unchecked = Some(why),
        }
    }
    f
}

/// Their tcx programs (bpf links: no qdisc, no tc event), one syscall each way.
fn probe_tcx(ports: &[(String, u32)]) -> Vec<Bypass> {
    let mut v = Vec::new();
    for (dev, ifindex) in ports {
        for (attach, egress) in [(libbpf_sys::BPF_TCX_INGRESS, false), (libbpf_sys::BPF_TCX_EGRESS, true)] {
            let n = tcx_count(*ifindex, attach);
            if n > 0 {
                let hook = if egress { "egress" } else { "ingress" };
                v.push(Bypass { ifindex: *ifindex, dev: dev.clone(), egress, what: format!("{n} tcx {hook} program(s)") });
            }
        }
    }
    v
}

/// "r1: qdisc htb (root)" for logs and the start-up line.
pub fn describe(b: &[Bypass]) -> String {
    b.iter().map(|b| format!("{}: {}", b.dev, b.what)).collect::<Vec<_>>().join(", ")
}

/// Re-probes while the daemon runs. Qdiscs and filters are listed again
/// when the kernel reports a change to them (RTNLGRP_TC) or the managed
/// ports change (at once, so a port a reload adds is held from its first
/// table write), not every period: that costs a fork of `tc`, and the loop
/// that mirrors the kernel must not stall on it. tcx links send no such
/// event and are queried every period and on a port change (a syscall).
/// Without the event socket everything is probed every period.
pub struct Watcher {
    allowed: bool,
    /// From qdiscs and filters, and from tcx; `current` is both.
    tc: Vec<Bypass>,
    tcx: Vec<Bypass>,
    current: Vec<Bypass>,
    events: Option<Events>,
    /// The ports of the last successful qdisc/filter probe.
    ports: Vec<(String, u32)>,
    /// The ports of the last round that probed (successfully or not).
    seen: Vec<(String, u32)>,
}

impl Watcher {
    /// `initial`: preflight's findings on `ports`; `allowed`: --allow-tc-bypass.
    pub fn new(initial: &Findings, ports: Vec<(String, u32)>, allowed: bool) -> Self {
        let events = if allowed {
            None
        } else {
            Events::open(NETLINK_ROUTE, RTNLGRP_TC, "tc")
                .map_err(|e| warn!("subscribing to tc events: {e}; qdiscs and filters are listed every period"))
                .ok()
        };
        // Allowed: nothing is ever kept clear of, so nothing is held.
        let held = if allowed { Vec::new() } else { initial.bypassed.clone() };
        let (tcx, tc) = held.iter().cloned().partition(|b| b.what.contains(" tcx "));
        Watcher { allowed, tc, tcx, current: held, events, seen: ports.clone(), ports }
    }

    /// The event socket, which wakes the daemon's loop (`refresh` drains it).
    pub fn wake_fds(&self, out: &mut Vec<RawFd>) {
        if !self.allowed {
            out.extend(self.events.as_ref().map(Events::fd));
        }
    }

    /// Probes what is due (see the type); true if what the daemon must
    /// keep clear of changed.
    pub fn refresh(&mut self, period: bool, ports: impl FnOnce() -> Vec<(String, u32)>) -> bool {
        if self.allowed {
            return false;
        }
        let event = self.events.as_mut().is_some_and(|e| e.drain());
        let ports = ports();
        // A port added by a reload is probed before its first table write,
        // not at the next period; a probe of them that failed is tried
        // again at the next period, not in every round.
        let moved = ports != self.seen;
        if !event && !period && !moved {
            return false;
        }
        self.seen = ports.clone();
        if event || moved || ports != self.ports || self.events.is_none() {
            let f = probe_tc(&ports);
            // A probe that could not look proves nothing: keep what we knew.
            if f.unchecked.is_none() {
                self.tc = f.bypassed;
                self.ports = ports.clone();
            }
        }
        if period || moved {
            self.tcx = probe_tcx(&ports);
        }
        let now: Vec<Bypass> = self.tc.iter().chain(&self.tcx).cloned().collect();
        let changed = now != self.current;
        self.current = now;
        changed
    }

    /// Policy the fast path must keep clear of now (empty when allowed or none).
    pub fn blocking(&self) -> &[Bypass] {
        &self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queueing_only_qdiscs_are_no_policy_and_hooks_are_listed() {
        let json = r#"[{"kind":"mq","handle":"0:","dev":"eth0","root":true},
            {"kind":"fq_codel","handle":"0:","dev":"eth0","parent":":1"},
            {"kind":"htb","handle":"1:","dev":"eth1","root":true},
            {"kind":"tbf","handle":"10:","dev":"eth1","parent":"1:1"},
            {"kind":"clsact","handle":"ffff:","dev":"eth0","parent":"ffff:fff1"},
            {"kind":"ingress","handle":"ffff:","dev":"eth1","parent":"ffff:fff1"},
            {"kind":"cake","handle":"8001:","dev":"wan9","root":true}]"#;
        let (policy, hooks) = parse_qdiscs(json, &["eth0", "eth1"]).unwrap();
        let policy: Vec<String> = policy.into_iter().map(|(d, w)| format!("{d}: {w}")).collect();
        assert_eq!(policy, ["eth1: qdisc htb (root)", "eth1: qdisc tbf (parent 1:1)"]);
        assert_eq!(
            hooks,
            [("eth0".to_string(), "ingress"), ("eth0".to_string(), "egress"), ("eth1".to_string(), "ingress")]
        );
    }

    #[test]
    fn garbage_is_an_error_and_the_override_blocks_nothing() {
        assert!(parse_qdiscs("not json", &["eth0"]).is_err());
        let htb = Bypass { ifindex: 3, dev: "eth1".into(), egress: true, what: "qdisc htb (root)".into() };
        let found = Findings { bypassed: vec![htb], unchecked: None };
        assert_eq!(describe(&found.bypassed), "eth1: qdisc htb (root)");
        assert_eq!(Watcher::new(&found, vec![], false).blocking(), found.bypassed.as_slice());
        assert!(Watcher::new(&found, vec![], true).blocking().is_empty());
    }
}
