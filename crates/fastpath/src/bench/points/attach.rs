//! Putting one workload's program at one execution point on the router's
//! ingress veth (r0), and reading how many frames it handled. Each value
//! detaches on drop; the lab's namespaces go at the end anyway.

use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use anyhow::{Context, Result};
use fastpath_bpf::skel::csum_drop::CsumDropSkelBuilder;
use fastpath_bpf::skel::drop::DropSkelBuilder;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{
    libbpf_sys, MapCore, MapFlags, MapHandle, TcHook, TcHookBuilder, TC_EGRESS, TC_INGRESS,
};

use super::super::topo::{self, Topology};
use super::super::traffic::Placement;
use super::xsk::XskDrop;
use super::Point;
use crate::maps::read_u64;

/// The in-kernel programs of one workload variant, kept alive by their fds
/// after the skeleton that loaded them is gone.
pub struct Progs {
    xdp: OwnedFd,
    tc: OwnedFd,
    count: MapHandle,
}

/// Loads drop.bpf.c (rounds = 0) or csum_drop.bpf.c with N rounds.
pub fn load(rounds: u32) -> Result<Progs> {
    let mut obj = MaybeUninit::uninit();
    if rounds == 0 {
        let skel = DropSkelBuilder::default()
            .open(&mut obj)
            .context("opening drop.bpf.o")?
            .load()
            .context("loading drop.bpf.o")?;
        return Ok(Progs {
            xdp: skel.progs.fp_points_xdp_drop.as_fd().try_clone_to_owned()?,
            tc: skel.progs.fp_points_tc_drop.as_fd().try_clone_to_owned()?,
            count: MapHandle::try_from(&skel.maps.points_count)?,
        });
    }
    let mut open = CsumDropSkelBuilder::default()
        .open(&mut obj)
        .context("opening csum_drop.bpf.o")?;
    open.maps
        .rodata_data
        .as_deref_mut()
        .context("csum_drop.bpf.o has no .rodata")?
        .csum_rounds = rounds;
    let skel = open.load().context("loading csum_drop.bpf.o")?;
    Ok(Progs {
        xdp: skel.progs.fp_points_xdp_csum.as_fd().try_clone_to_owned()?,
        tc: skel.progs.fp_points_tc_csum.as_fd().try_clone_to_owned()?,
        count: MapHandle::try_from(&skel.maps.points_count)?,
    })
}

fn sum_percpu(map: &MapHandle) -> Result<u64> {
    let vals = map
        .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
        .context("reading points_count")?
        .context("points_count has no slot 0")?;
    Ok(vals.iter().map(|v| read_u64(v, 0)).sum())
}

/// An XDP attachment through a bpf_link: closing the fd detaches.
fn link_xdp(prog: &OwnedFd, ifindex: u32, flags: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: all-zero opts is libbpf's "no options"; size and flags set below.
    let mut opts: libbpf_sys::bpf_link_create_opts = unsafe { std::mem::zeroed() };
    opts.sz = std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _;
    opts.flags = flags;
    // SAFETY: plain syscall wrapper; opts outlives the call.
    let fd = unsafe {
        libbpf_sys::bpf_link_create(prog.as_raw_fd(), ifindex as i32, libbpf_sys::BPF_XDP, &opts)
    };
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(-fd));
    }
    // SAFETY: a fresh fd nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub enum Attached {
    Xdp {
        _link: OwnedFd,
        count: MapHandle,
    },
    Tc {
        hook: TcHook,
        ns: String,
        count: MapHandle,
        _prog: OwnedFd,
    },
    Xsk {
        // The loop goes before the link: the socket closes while frames may
        // still be redirected to it, which the kernel handles (drops).
        xsk: XskDrop,
        _link: OwnedFd,
        _xsks: MapHandle,
    },
}

impl Attached {
    /// Puts `progs` (or, for AF_XDP, the redirect plus a user loop doing
    /// `rounds` checksums on `loop_cpu`) on r0.
    pub fn new(
        point: Point,
        progs: Progs,
        rounds: u32,
        t: &Topology,
        loop_place: Placement,
    ) -> Result<Self> {
        let r0 = t.ifindex(&t.router, topo::R0)?;
        match point {
            Point::Native | Point::Generic => {
                let flags = if point == Point::Native {
                    libbpf_sys::XDP_FLAGS_DRV_MODE
                } else {
                    libbpf_sys::XDP_FLAGS_SKB_MODE
                };
                let link = topo::in_netns(&t.router, || link_xdp(&progs.xdp, r0, flags))?
                    .with_context(|| format!("attaching XDP ({}) to r0", point.name()))?;
                Ok(Attached::Xdp {
                    _link: link,
                    count: progs.count,
                })
            }
            Point::Tc => {
                let mut hook = TcHookBuilder::new(progs.tc.as_fd())
                    .ifindex(r0 as i32)
                    .replace(true)
                    .handle(1)
                    .priority(1)
                    .hook(TC_INGRESS);
                topo::in_netns(&t.router, || -> Result<()> {
                    hook.create().context("creating the clsact qdisc on r0")?;
                    hook.attach().context("attaching cls_bpf to r0 ingress")?;
                    Ok(())
                })??;
                Ok(Attached::Tc {
                    hook,
                    ns: t.router.clone(),
                    count: progs.count,
                    _prog: progs.tc,
                })
            }
            Point::Afxdp => {
                let mut obj = MaybeUninit::uninit();
                let skel = DropSkelBuilder::default()
                    .open(&mut obj)
                    .context("opening drop.bpf.o")?
                    .load()
                    .context("loading drop.bpf.o")?;
                let xsks = MapHandle::try_from(&skel.maps.points_xsks)?;
                let prog = skel.progs.fp_points_xsk.as_fd().try_clone_to_owned()?;
                let xsk = XskDrop::start(&t.router, r0, 0, loop_place, rounds)?;
                xsks.update(
                    &0u32.to_ne_bytes(),
                    &(xsk.fd() as u32).to_ne_bytes(),
                    MapFlags::ANY,
                )
                .context("putting the AF_XDP socket into the XSKMAP")?;
                let link = topo::in_netns(&t.router, || {
                    link_xdp(&prog, r0, libbpf_sys::XDP_FLAGS_DRV_MODE)
                })?
                .context("attaching the AF_XDP redirect to r0")?;
                Ok(Attached::Xsk {
                    xsk,
                    _link: link,
                    _xsks: xsks,
                })
            }
        }
    }

    /// CPU time of the point's own user-space thread (AF_XDP only).
    pub fn user_cpu_time(&self) -> Result<std::time::Duration> {
        match self {
            Attached::Xsk { xsk, .. } => xsk.cpu_time(),
            _ => Ok(std::time::Duration::ZERO),
        }
    }

    /// Time the AF_XDP loop spent on frames, not polling (AF_XDP only).
    pub fn user_work_time(&self) -> Option<std::time::Duration> {
        match self {
            Attached::Xsk { xsk, .. } => Some(xsk.work_time()),
            _ => None,
        }
    }

    /// Frames the point has handled since it was attached.
    pub fn packets(&self) -> Result<u64> {
        match self {
            Attached::Xdp { count, .. } | Attached::Tc { count, .. } => sum_percpu(count),
            Attached::Xsk { xsk, .. } => Ok(xsk.count()),
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Attached::Tc { hook, ns, .. } = self {
            // Both attach points: removes the clsact qdisc itself, so the
            // next TC cell creates a fresh one.
            hook.attach_point(TC_INGRESS | TC_EGRESS);
            let r = topo::in_netns(ns, || hook.destroy());
            if let Err(e) = r.and_then(|r| r.map_err(anyhow::Error::from)) {
                log::warn!("removing the clsact qdisc from r0: {e:#}");
            }
        }
    }
}

/// What the kernel says to a NIC-offloaded (XDP_FLAGS_HW_MODE) attach of the
/// drop program on r0: the evidence for "no offload here".
pub fn offload_attempt(t: &Topology) -> String {
    let res = (|| -> Result<String> {
        let progs = load(0)?;
        let r0 = t.ifindex(&t.router, topo::R0)?;
        Ok(
            match topo::in_netns(&t.router, || {
                link_xdp(&progs.xdp, r0, libbpf_sys::XDP_FLAGS_HW_MODE)
            })? {
                Ok(_) => "unexpectedly accepted".to_string(),
                Err(e) => format!("XDP_FLAGS_HW_MODE attach on veth: {e}"),
            },
        )
    })();
    res.unwrap_or_else(|e| format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::test_root as root;
    use libbpf_rs::ProgramInput;

    const XDP_DROP: u32 = 1;
    const TC_ACT_SHOT: u32 = 2;


    /// The BPF checksum loop computes what the AF_XDP loop computes, for
    /// XDP and TC alike, then drops and counts the frame.
    #[test]
    fn csum_programs_match_the_user_space_loop_and_drop() {
        if !root("csum_programs_match_the_user_space_loop_and_drop") {
            return;
        }
        let frame = crate::bench::traffic::frame(64).unwrap();
        let mut tweaked = frame.clone();
        tweaked[22] = 7; // a different TTL: a sum that is not 0xffff
        for rounds in [1u32, 3, 150] {
            let mut obj = MaybeUninit::uninit();
            let mut open = CsumDropSkelBuilder::default().open(&mut obj).unwrap();
            open.maps.rodata_data.as_deref_mut().unwrap().csum_rounds = rounds;
            let skel = open.load().unwrap();
            for (prog, verdict) in [
                (&skel.progs.fp_points_xdp_csum, XDP_DROP),
                (&skel.progs.fp_points_tc_csum, TC_ACT_SHOT),
            ] {
                let input = ProgramInput {
                    data_in: Some(&tweaked),
                    ..Default::default()
                };
                assert_eq!(
                    prog.test_run(input).unwrap().return_value,
                    verdict,
                    "rounds {rounds}"
                );
                let got: Vec<u32> = skel
                    .maps
                    .points_csum_sink
                    .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
                    .unwrap()
                    .unwrap()
                    .iter()
                    .map(|v| u32::from_ne_bytes(v[..4].try_into().unwrap()))
                    .collect();
                let want = super::super::xsk::csum_rounds(&tweaked, rounds);
                assert!(
                    got.contains(&want),
                    "rounds {rounds}: BPF {got:?}, Rust {want}"
                );
            }
            assert_eq!(
                sum_percpu(&MapHandle::try_from(&skel.maps.points_count).unwrap()).unwrap(),
                2
            );
        }
    }

    #[test]
    fn drop_programs_drop_and_count() {
        if !root("drop_programs_drop_and_count") {
            return;
        }
        let frame = crate::bench::traffic::frame(64).unwrap();
        let progs = load(0).unwrap();
        let mut obj = MaybeUninit::uninit();
        let skel = DropSkelBuilder::default()
            .open(&mut obj)
            .unwrap()
            .load()
            .unwrap();
        for (prog, verdict) in [
            (&skel.progs.fp_points_xdp_drop, XDP_DROP),
            (&skel.progs.fp_points_tc_drop, TC_ACT_SHOT),
        ] {
            let input = ProgramInput {
                data_in: Some(&frame),
                ..Default::default()
            };
            assert_eq!(prog.test_run(input).unwrap().return_value, verdict);
        }
        assert_eq!(
            sum_percpu(&MapHandle::try_from(&skel.maps.points_count).unwrap()).unwrap(),
            2
        );
        assert_eq!(sum_percpu(&progs.count).unwrap(), 0);
    }
}
