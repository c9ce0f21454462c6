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
    /// Adds another run's counts (reasons matched by name).
    pub fn add(&mut self, o: &CtVerdicts) {
        self.forwarded += o.forwarded;
        self.passed += o.passed;
        super::router::add_by_name(&mut self.passed_by_reason, &o.passed_by_reason);
    }

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
        let v6 = t.family == topo::Family::V6;
        open.progs.fp_bench_ct_fwd.set_autoload(!v6);
        open.progs.fp_bench_ct_fwd6.set_autoload(v6);
        let skel = open.load().context("loading ct_fwd.bpf.o (needs the conntrack kfuncs)")?;
        let prog = if v6 { &skel.progs.fp_bench_ct_fwd6 } else { &skel.progs.fp_bench_ct_fwd };
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
            topo::in_netns(&t.router, || prog.attach_xdp(dev as i32))?
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::test_root as root;
    use libbpf_rs::ProgramInput;
    use std::process::Command;

    const XDP_PASS: u32 = 2;


    /// A namespace of its own for conntrack entries, deleted on drop.
    struct Ns(String);
    impl Ns {
        fn new() -> Self {
            let n = format!("fpctref{}", std::process::id());
            assert!(Command::new("ip").args(["netns", "add", &n]).status().unwrap().success());
            Ns(n)
        }
        fn conntrack(&self, args: &str) {
            let ok = Command::new("ip")
                .args(["netns", "exec", &self.0, "conntrack"])
                .args(args.split_whitespace())
                .output()
                .unwrap();
            assert!(ok.status.success(), "conntrack {args}: {}", String::from_utf8_lossy(&ok.stderr));
        }
    }
    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }

    fn udp_frame(sport: u16) -> Vec<u8> {
        let mut f = super::super::traffic::frame(64).unwrap();
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f
    }

    /// Every verdict up to the FIB lookup, in a namespace whose conntrack
    /// holds one established+marked, one unmarked and one unreplied flow.
    /// (Forwarding itself is what `fastpath bench stateful` checks.)
    #[test]
    fn ct_fwd_passes_all_but_established_marked() {
        if !root("ct_fwd_passes_all_but_established_marked") {
            return;
        }
        let ns = Ns::new();
        let entry = |sport: u16, status: &str, mark: u32| {
            format!(
                "-I -p udp -s 192.0.2.2 -d 198.51.100.2 --sport {sport} --dport 9 --reply-src 198.51.100.2 \
                 --reply-dst 192.0.2.2 --reply-port-src 9 --reply-port-dst {sport} {status} --mark {mark} --timeout 600"
            )
        };
        ns.conntrack(&entry(10001, "--status SEEN_REPLY,ASSURED", 0x3));
        ns.conntrack(&entry(10002, "--status SEEN_REPLY,ASSURED", 0x2));
        ns.conntrack(&entry(10003, "", 0x1));

        let mut obj = MaybeUninit::uninit();
        let mut open = CtFwdSkelBuilder::default().open(&mut obj).unwrap();
        open.maps.rodata_data.as_deref_mut().unwrap().ct_fwd_mark = 0x1;
        let skel = open.load().unwrap();
        let mut syn = udp_frame(10001);
        syn[23] = 6; // TCP: flags byte 47 is past a 60-byte frame's ports
        syn[47] = 0x02;
        let cases: [(&str, Vec<u8>, usize); 6] = [
            // Through the conntrack gate; this namespace has no route.
            ("established and marked", udp_frame(10001), 6),
            ("no entry", udp_frame(10000), 3),
            ("unmarked", udp_frame(10002), 5),
            ("unreplied", udp_frame(10003), 4),
            ("tcp syn", syn, 2),
            ("arp", { let mut f = udp_frame(10000); f[12..14].copy_from_slice(&[0x08, 0x06]); f }, 1),
        ];
        // BPF_PROG_RUN looks conntrack up in the caller's namespace.
        let file = std::fs::File::open(super::super::topo::netns_path(&ns.0)).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                for (name, frame, verdict) in &cases {
                    let before: Vec<u64> = (0..VERDICTS.len()).map(|i| read(&skel, i)).collect();
                    let res = skel
                        .progs
                        .fp_bench_ct_fwd
                        .test_run(ProgramInput { data_in: Some(frame), ..Default::default() })
                        .unwrap();
                    assert_eq!(res.return_value, XDP_PASS, "{name}");
                    let after: Vec<u64> = (0..VERDICTS.len()).map(|i| read(&skel, i)).collect();
                    let v = verdicts(&before, &after);
                    assert_eq!(v.passed_by_reason, vec![(VERDICTS[*verdict].to_string(), 1)], "{name}");
                }
            });
        });
    }

    fn read(skel: &CtFwdSkel<'_>, i: usize) -> u64 {
        let vals = skel
            .maps
            .ct_fwd_stats
            .lookup_percpu(&(i as u32).to_ne_bytes(), MapFlags::ANY)
            .unwrap()
            .unwrap();
        vals.iter().map(|v| read_u64(v, 0)).sum()
    }
}
