//! The stateful bench's reference XDP forwarder (`bpf/bench/ct_fwd.bpf.c`):
//! a conntrack lookup on every packet, the linux-fastpath paper's design,
//! attached to r0 and r1 (the connection-rate part has replies) with both
//! as its TX ports; and its verdict counters.

use std::mem::MaybeUninit;

use anyhow::{Context, Result};
use fastpath_bpf::skel::ct_fwd::{CtFwdSkel, CtFwdSkelBuilder};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject};
use serde::Serialize;

use super::topo::{self, Topology};
use crate::maps::read_u64;

/// enum ct_fwd_verdict of ct_fwd.bpf.c, in its order.
const VERDICTS: [&str; 7] = [
    "forwarded",
    "not_parsed",
    "tcp_flags",
    "ct_miss",
    "not_established",
    "unmarked",
    "no_route",
];

pub struct CtFwd<'obj> {
    skel: CtFwdSkel<'obj>,
    _links: [Link; 2],
}

/// ct_fwd's counters over a span of the bench.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CtVerdicts {
    pub forwarded: u64,
    pub passed: u64,
    pub passed_by_reason: Vec<(String, u64)>,
}

impl CtVerdicts {
    /// At most 1% passed to the kernel, as for fastpath's own modes.
    pub fn mostly_forwarded(&self) -> bool {
        self.forwarded > 0 && self.passed * 100 <= self.forwarded + self.passed
    }

    pub fn summary(&self) -> String {
        let r: Vec<String> = self.passed_by_reason.iter().map(|(n, c)| format!("{n} {c}")).collect();
        format!(
            "forwarded {}, passed {}{}",
            self.forwarded,
            self.passed,
            if r.is_empty() { String::new() } else { format!(" ({})", r.join(", ")) }
        )
    }
}

impl<'obj> CtFwd<'obj> {
    pub fn attach(storage: &'obj mut MaybeUninit<OpenObject>, t: &Topology, ct_mark: u32) -> Result<Self> {
        let mut open = CtFwdSkelBuilder::default()
            .open(storage)
            .context("opening ct_fwd.bpf.o")?;
        open.maps
            .rodata_data
            .as_deref_mut()
            .context("ct_fwd.bpf.o has no .rodata")?
            .ct_fwd_mark = ct_mark;
        let skel = open.load().context("loading ct_fwd.bpf.o (needs the conntrack kfuncs)")?;
        let r0 = t.ifindex(&t.router, topo::R0)?;
        let r1 = t.ifindex(&t.router, topo::R1)?;
        for dev in [r0, r1] {
            // The kernel resolves a devmap's ifindex in the writer's namespace.
            topo::in_netns(&t.router, || {
                skel.maps.ct_tx.update(&dev.to_ne_bytes(), &dev.to_ne_bytes(), MapFlags::ANY)
            })?
            .with_context(|| format!("setting ct_tx[{dev}]"))?;
        }
        // The program looks conntrack up in the namespace it runs in: the router's.
        let attach = |dev: u32| {
            topo::in_netns(&t.router, || skel.progs.fp_bench_ct_fwd.attach_xdp(dev as i32))?
                .with_context(|| format!("attaching ct_fwd to ifindex {dev}"))
        };
        let links = [attach(r0)?, attach(r1)?];
        Ok(CtFwd { skel, _links: links })
    }

    /// Counters summed over CPUs, one per verdict.
    pub fn read(&self) -> Result<Vec<u64>> {
        let mut out = vec![0u64; VERDICTS.len()];
        for (i, c) in out.iter_mut().enumerate() {
            let vals = self
                .skel
                .maps
                .ct_fwd_stats
                .lookup_percpu(&(i as u32).to_ne_bytes(), MapFlags::ANY)
                .context("reading ct_fwd_stats")?
                .unwrap_or_default();
            *c = vals.iter().map(|v| read_u64(v, 0)).sum();
        }
        Ok(out)
    }
}

pub fn verdicts(before: &[u64], after: &[u64]) -> CtVerdicts {
    let mut v = CtVerdicts::default();
    for (i, name) in VERDICTS.iter().enumerate() {
        let n = after.get(i).copied().unwrap_or(0).saturating_sub(before.get(i).copied().unwrap_or(0));
        if i == 0 {
            v.forwarded = n;
        } else if n > 0 {
            v.passed += n;
            v.passed_by_reason.push((name.to_string(), n));
        }
    }
    v.passed_by_reason.sort_by_key(|r| std::cmp::Reverse(r.1));
    v
}
