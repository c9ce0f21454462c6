//! Runs one packet per case through BPF_PROG_RUN and checks verdict, output
//! bytes and counters. Every case starts from an empty program: the loaded
//! program is reused between cases of one test, but all its maps are emptied
//! first (`Loaded::reset`), which is what a fresh load would give without the
//! verifier's second per case.

use std::mem::MaybeUninit;

use anyhow::{bail, ensure, Context, Result};
use fastpath_bpf::intf::{
    fp_reason, fp_stats, reason_name, FP_DEFAULT_FLOW_ENTRIES, FP_FLOW_WAYS, FP_MAX_IFACES,
};
use fastpath_bpf::skel::xdp_fwd::{XdpFwdSkel, XdpFwdSkelBuilder};
use std::cell::RefCell;
use std::sync::{Mutex, MutexGuard, PoisonError};

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, MapType, OpenObject, ProgramInput};

use super::world::{from_raw, World};

pub const XDP_PASS: u32 = 2;
pub const XDP_REDIRECT: u32 = 4;

pub enum Expect {
    /// XDP_PASS, output == input, counted once under this reason.
    Punt(fp_reason),
    /// XDP_REDIRECT with exactly these bytes, counted as forwarded.
    Forward(Vec<u8>),
}

pub struct Case {
    pub name: &'static str,
    pub world: Box<dyn Fn(&mut World)>,
    pub pkt: Vec<u8>,
    pub expect: Expect,
}

impl Case {
    pub fn punt(name: &'static str, world: impl Fn(&mut World) + 'static, pkt: Vec<u8>, r: fp_reason) -> Self {
        Case { name, world: Box::new(world), pkt, expect: Expect::Punt(r) }
    }

    pub fn forward(name: &'static str, world: impl Fn(&mut World) + 'static, pkt: Vec<u8>, out: Vec<u8>) -> Self {
        Case { name, world: Box::new(world), pkt, expect: Expect::Forward(out) }
    }
}

pub fn same(_: &mut World) {}

/// One loaded program; dropped (maps and all) at the end of its case.
pub struct Loaded {
    // Field order is drop order: the skeleton must go before its object.
    pub skel: XdpFwdSkel<'static>,
    /// fp_xdp_fwd_full is the entry point (stateful), not fp_xdp_fwd.
    full: bool,
    _obj: Box<MaybeUninit<OpenObject>>,
}

/// Flow-cache sets per CPU, as the daemon's default.
pub const FLOW_SETS: u32 = FP_DEFAULT_FLOW_ENTRIES / FP_FLOW_WAYS;

impl Loaded {
    pub fn new(world: &World) -> Result<Self> {
        let mut obj = Box::new(MaybeUninit::uninit());
        // The skeleton borrows the object; the box keeps its address stable
        // and is dropped after the skeleton (see the field order).
        let obj_ref: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *(obj.as_mut() as *mut _) };
        let mut open = XdpFwdSkelBuilder::default().open(obj_ref).context("open xdp_fwd")?;
        // The device-bound entry point loads only bound to a device, which
        // BPF_PROG_RUN cannot run. A stateful world runs the plain entry
        // point the daemon attaches for it (fp_xdp_fwd_full).
        open.progs.fp_xdp_fwd_hw.set_autoload(false);
        open.progs.fp_xdp_fwd.set_autoload(!world.stateful);
        open.progs.fp_xdp_fwd_full.set_autoload(world.stateful);
        let rodata = open.maps.rodata_data.as_deref_mut().context("no .rodata")?;
        rodata.fp_cfg.ingress_ifindex = world.a;
        rodata.fp_cfg.ingress_slot = ingress_slot(world);
        rodata.fp_cfg.flow_sets = FLOW_SETS;
        rodata.fp_cfg.stateful = u32::from(world.stateful);
        rodata.fp_cfg.flow_key_addrs = u32::from(world.flow_key_addrs);
        rodata.fp_cfg.fib4_dir = u32::from(world.fib4_dir);
        rodata.fp_cfg.fib6_dir = if world.fib6_dir { super::world::DIR6_BUCKETS } else { 0 };
        let flows = fastpath_bpf::flow_cache_entries(FLOW_SETS).map_err(anyhow::Error::msg)?;
        open.maps.fp_flows.set_max_entries(flows).context("sizing fp_flows")?;
        open.maps.fp_ct_flows.set_max_entries(flows).context("sizing fp_ct_flows")?;
        // As the daemon sizes them: a reset zeroes every array, 32 MiB for the index.
        let (dir, vals) = if world.fib4_dir { (fastpath_bpf::intf::FP_DIR24_ELEMS, fastpath_bpf::intf::FP_DIR24_VALS) } else { (1, 1) };
        open.maps.fp_fib4_dir.set_max_entries(dir).context("sizing fp_fib4_dir")?;
        let dir16 = if world.fib4_dir { fastpath_bpf::intf::FP_DIR16_ELEMS } else { 1 };
        open.maps.fp_fib4_dir16.set_max_entries(dir16).context("sizing fp_fib4_dir16")?;
        open.maps.fp_fib4_vals.set_max_entries(vals).context("sizing fp_fib4_vals")?;
        // The IPv6 index likewise.
        let (tops, dir, vals) = if world.fib6_dir {
            (fastpath_bpf::intf::FP_DIR6_TOPS, super::world::DIR6_BUCKETS, super::world::DIR6_VALS)
        } else {
            (1, 1, 1)
        };
        open.maps.fp_fib6_dir16.set_max_entries(tops).context("sizing fp_fib6_dir16")?;
        open.maps.fp_fib6_dir.set_max_entries(dir).context("sizing fp_fib6_dir")?;
        open.maps.fp_fib6_vals.set_max_entries(vals).context("sizing fp_fib6_vals")?;
        let skel = open.load().context("load xdp_fwd (verifier)")?;
        world.apply(&skel)?;
        Ok(Loaded { skel, full: world.stateful, _obj: obj })
    }

    /// Empties every writable map (tables, flow caches, counters, .bss): the
    /// state of a fresh load. Goes over all maps of the object, so a map
    /// added later cannot carry state from one case into the next.
    pub fn reset(&self) -> Result<()> {
        let cpus = libbpf_rs::num_possible_cpus().context("number of CPUs")?;
        for map in self.skel.object().maps() {
            let name = map.name().to_string_lossy().into_owned();
            let zero = vec![0u8; map.value_size() as usize];
            match map.map_type() {
                // Frozen at load; the same for every case of one test (see `check`).
                _ if name.ends_with(".rodata") => {}
                // The 32 MiB /24 index: World::apply writes all of it whenever
                // the program reads it (fp_config.fib4_dir), or knows it
                // already holds what it would write; zeroing it was most of
                // a case's time.
                _ if name == "fp_fib4_dir" => {}
                // Through a mapping where the map allows one: a batch update
                // of the IPv6 index's 65536 top words, or of the flow
                // caches, took milliseconds a map.
                MapType::Array if map.info().is_ok_and(|i| i.info.map_flags & libbpf_rs::libbpf_sys::BPF_F_MMAPABLE != 0) => {
                    let len = map.value_size().next_multiple_of(8) as usize * map.max_entries() as usize;
                    super::world::with_mapped(&map, len, |d: &mut [u8]| d.fill(0)).with_context(|| format!("zeroing {name}"))?;
                }
                // One batch per map: the flow-cache arrays have tens of
                // thousands of slots, and a syscall per slot made the reset
                // most of a table case's time.
                MapType::Array => {
                    let n = map.max_entries();
                    let keys: Vec<u8> = (0..n).flat_map(u32::to_ne_bytes).collect();
                    let zeros = vec![0u8; zero.len() * n as usize];
                    map.update_batch(&keys, &zeros, n, MapFlags::ANY, MapFlags::ANY)
                        .with_context(|| format!("zeroing {name}"))?;
                }
                MapType::PercpuArray => {
                    let zeros = vec![zero.clone(); cpus];
                    for k in 0..map.max_entries() {
                        map.update_percpu(&k.to_ne_bytes(), &zeros, MapFlags::ANY)
                            .with_context(|| format!("zeroing {name}"))?;
                    }
                }
                // Arrays whose slots can be deleted; an empty slot fails with ENOENT.
                MapType::Devmap | MapType::Xskmap => {
                    for k in 0..map.max_entries() {
                        let _ = map.delete(&k.to_ne_bytes());
                    }
                }
                MapType::Hash | MapType::LpmTrie | MapType::LruHash => {
                    let keys: Vec<Vec<u8>> = map.keys().collect();
                    for k in keys {
                        map.delete(&k).with_context(|| format!("emptying {name}"))?;
                    }
                }
                // Records a case left unread: consumed and dropped.
                MapType::RingBuf => {
                    let mut b = libbpf_rs::RingBufferBuilder::new();
                    b.add(&map, |_: &[u8]| 0).with_context(|| format!("opening {name}"))?;
                    b.build().and_then(|r| r.consume()).with_context(|| format!("draining {name}"))?;
                }
                t => bail!("reset: map {name} has type {t:?}, which this runner does not know how to empty"),
            }
        }
        Ok(())
    }

    /// Runs one frame arriving on `ingress`; returns (verdict, output frame).
    pub fn run(&self, ingress: u32, pkt: &[u8]) -> Result<(u32, Vec<u8>)> {
        self.run_meta(ingress, &[], pkt)
    }

    /// Same, with `meta` in the metadata area in front of the frame (what an
    /// upstream program would leave there). The output has the metadata
    /// stripped again.
    pub fn run_meta(&self, ingress: u32, meta: &[u8], pkt: &[u8]) -> Result<(u32, Vec<u8>)> {
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex.
        // BPF_PROG_RUN takes the metadata as the first `data` bytes of the
        // input, with data_meta 0 (net/bpf/test_run.c).
        let mut input_bytes = meta.to_vec();
        input_bytes.extend_from_slice(pkt);
        let mut ctx = [0u8; 24];
        ctx[..4].copy_from_slice(&(meta.len() as u32).to_ne_bytes());
        ctx[4..8].copy_from_slice(&(input_bytes.len() as u32).to_ne_bytes());
        ctx[12..16].copy_from_slice(&ingress.to_ne_bytes());
        // A frame larger than one page goes in as a multi-buffer one (the
        // program is xdp.frags) and comes out whole.
        let mut out = vec![0u8; input_bytes.len().max(4096)];
        let input = ProgramInput {
            data_in: Some(&input_bytes),
            context_in: Some(&mut ctx),
            data_out: Some(&mut out),
            ..Default::default()
        };
        let prog = if self.full { &self.skel.progs.fp_xdp_fwd_full } else { &self.skel.progs.fp_xdp_fwd };
        let res = prog.test_run(input).context("BPF_PROG_RUN")?;
        let data = res.data.context("no data out")?;
        let data = data.get(meta.len()..).context("output shorter than the metadata")?.to_vec();
        Ok((res.return_value, data))
    }

    /// Replaces the runtime switches (.bss) as the daemon does.
    pub fn set_rt(&self, rt: &fastpath_bpf::intf::fp_runtime) -> Result<()> {
        self.skel.maps.bss.update(&0u32.to_ne_bytes(), super::world::raw(rt), MapFlags::ANY).context(".bss")
    }

    /// One slot's fp_stats value of every CPU, by CPU number.
    fn stats_per_cpu(&self, slot: u32) -> Result<Vec<Vec<u8>>> {
        self.skel
            .maps
            .fp_stats
            .lookup_percpu(&slot.to_ne_bytes(), MapFlags::ANY)
            .context("fp_stats lookup")?
            .context("fp_stats slot missing")
    }

    /// Counters of one slot, summed over CPUs.
    pub fn stats(&self, slot: u32) -> Result<fp_stats> {
        let mut sum = fp_stats::default();
        for raw in self.stats_per_cpu(slot)? {
            let s: fp_stats = from_raw(&raw);
            for i in 0..s.packets.len() {
                sum.packets[i] += s.packets[i];
                sum.bytes[i] += s.bytes[i];
            }
            for i in 0..s.flow.len() {
                sum.flow[i] += s.flow[i];
            }
            for i in 0..s.hash_src.len() {
                sum.hash_src[i] += s.hash_src[i];
            }
        }
        Ok(sum)
    }

    /// The flow cache's thrash guard of one slot on the calling thread's CPU
    /// (not a counter: it is not summed; tests pin their thread).
    pub fn flow_guard(&self, slot: u32) -> Result<fastpath_bpf::intf::fp_flow_guard> {
        // SAFETY: no arguments; returns the CPU or -1.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).context("sched_getcpu")?;
        let per_cpu = self.stats_per_cpu(slot)?;
        let raw = per_cpu.get(cpu).context("no fp_stats value for this CPU")?;
        Ok(from_raw::<fp_stats>(raw).guard)
    }

    /// Every (slot, reason, packets, bytes) with a non-zero count.
    pub fn counted(&self) -> Result<Vec<(u32, usize, u64, u64)>> {
        let mut v = Vec::new();
        for slot in 0..FP_MAX_IFACES {
            let s = self.stats(slot)?;
            for r in 0..s.packets.len() {
                if s.packets[r] != 0 || s.bytes[r] != 0 {
                    v.push((slot, r, s.packets[r], s.bytes[r]));
                }
            }
        }
        Ok(v)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ")
}

thread_local! {
    /// The program the last case of this test (one test = one thread) ran
    /// on, with the load-time settings it was loaded with.
    static LOADED: RefCell<Option<(LoadKey, Loaded)>> = const { RefCell::new(None) };
}

/// Everything `Loaded::new` puts into .rodata: cases that agree on it can
/// share one load.
type LoadKey = (u32, u32, bool, bool, bool, bool);

fn load_key(w: &World) -> LoadKey {
    (w.a, ingress_slot(w), w.stateful, w.flow_key_addrs, w.fib4_dir, w.fib6_dir)
}

/// The instance keeps its slot even when the test unmanages it.
fn ingress_slot(w: &World) -> u32 {
    w.slots.iter().find(|(i, _)| *i == w.a).map(|(_, s)| *s).unwrap_or(0)
}

/// Runs `f` on a program in the state a fresh load of `world` would have.
fn with_program<T>(world: &World, f: impl FnOnce(&Loaded) -> Result<T>) -> Result<T> {
    LOADED.with(|cell| {
        let mut slot = cell.borrow_mut();
        let key = load_key(world);
        match slot.as_ref() {
            Some((k, l)) if *k == key => {
                l.reset()?;
                world.apply(&l.skel)?;
            }
            _ => {
                *slot = None;
                *slot = Some((key, Loaded::new(world)?));
            }
        }
        let (_, l) = slot.as_ref().context("no program")?;
        f(l)
    })
}

/// Runs one case from a program in its just-loaded state and checks
/// everything it promises.
pub fn check(base: &World, case: &Case) -> Result<()> {
    let mut world = base.clone();
    (case.world)(&mut world);
    with_program(&world, |loaded| check_loaded(&world, case, loaded))
}

/// With the flow cache on, each case's packet is sent three times and must
/// come out the same each time: a miss that fills the cache, then hits
/// (the last on the express path where it applies).
fn check_loaded(world: &World, case: &Case, loaded: &Loaded) -> Result<()> {
    let sends: u64 = if world.rt.flow_timeout > 0 { 3 } else { 1 };
    let (want_verdict, want_out, want_reason) = match &case.expect {
        Expect::Punt(r) => (XDP_PASS, &case.pkt, *r as usize),
        Expect::Forward(o) => (XDP_REDIRECT, o, fp_reason::FP_R_FORWARDED as usize),
    };
    for n in 1..sends {
        let (verdict, out) = loaded.run(world.a, &case.pkt)?;
        ensure!(verdict == want_verdict && out == *want_out, "send {n} of {sends}: verdict {verdict} or bytes differ");
    }
    let (verdict, out) = loaded.run(world.a, &case.pkt)?;
    let slot = world.slot(world.a);
    let counted = loaded.counted()?;
    let want_counted = vec![(slot, want_reason, sends, sends * want_out.len() as u64)];
    if counted != want_counted {
        let show = |v: &[(u32, usize, u64, u64)]| {
            v.iter().map(|(s, r, p, b)| format!("slot {s} {} {p} pkts {b} B", reason_name(*r))).collect::<Vec<_>>()
        };
        bail!("counters: got {:?}, want {:?}", show(&counted), show(&want_counted));
    }
    ensure!(verdict == want_verdict, "verdict {verdict}, want {want_verdict}");
    if out != *want_out {
        bail!("output bytes differ\n got  {}\n want {}", hex(&out), hex(want_out));
    }
    Ok(())
}

/// Runs all cases, each from a just-loaded program state, once with the flow cache off and
/// once on (the packet three times: the full path filling the cache, then
/// hits), and reports every failure at once.
pub fn run_all(base: &World, cases: &[Case]) {
    run_all_with(base, cases, check)
}

fn run_all_with(base: &World, cases: &[Case], mut check: impl FnMut(&World, &Case) -> Result<()>) {
    let mut failed = Vec::new();
    for timeout in [0, 30] {
        let mut world = base.clone();
        world.rt.flow_timeout = timeout;
        for case in cases {
            if let Err(e) = check(&world, case) {
                failed.push(format!("{} (flow timeout {timeout}): {e:#}", case.name));
            }
        }
    }
    assert!(failed.is_empty(), "{} of {} runs failed:\n{}", failed.len(), 2 * cases.len(), failed.join("\n"));
}

/// One packet through a program loaded once for a sequence (flow cache,
/// conntrack state carried between packets): forwarded with these bytes.
#[allow(dead_code)] // not every test binary runs sequences
pub fn forwards(l: &Loaded, w: &World, pkt: &[u8], want: &[u8]) {
    let (verdict, out) = l.run(w.a, pkt).expect("run");
    assert_eq!(verdict, XDP_REDIRECT, "not forwarded");
    assert_eq!(out, want, "output bytes");
}

/// As `forwards`: passed up unmodified and counted under @reason.
#[allow(dead_code)]
pub fn punts(l: &Loaded, w: &World, pkt: &[u8], reason: fp_reason) {
    punts_case(l, w, "", pkt, reason)
}

/// As `punts`, for one of a list of cases: `name` heads every message.
#[allow(dead_code)]
pub fn punts_case(l: &Loaded, w: &World, name: &str, pkt: &[u8], reason: fp_reason) {
    let before = l.stats(super::world::SLOT_A).expect("stats").packets[reason as usize];
    let (verdict, out) = l.run(w.a, pkt).expect("run");
    assert_eq!(verdict, XDP_PASS, "{name}: not punted");
    assert_eq!(out, pkt, "{name}: a punt must not modify the frame");
    let after = l.stats(super::world::SLOT_A).expect("stats").packets[reason as usize];
    assert_eq!(after, before + 1, "{name}: not counted as {}", reason_name(reason as usize));
}

/// Programs loaded once for all tests of a binary that use `Shared`, in one
/// namespace kept for them: a load of the stateful program costs the
/// verifier seconds, a reset milliseconds. Tests holding it run one at a
/// time (they share the namespace's conntrack table too).
pub struct Shared {
    kept: super::netns::Kept,
    programs: Vec<(LoadKey, Loaded)>,
}

// SAFETY: a libbpf object is file descriptors and heap memory with no tie to
// the thread that loaded it; the mutex below gives one test at a time access.
unsafe impl Send for Shared {}

static SHARED: Mutex<Option<Shared>> = Mutex::new(None);

/// A test's hold on the shared namespace and programs; released when dropped.
pub struct SharedLab(MutexGuard<'static, Option<Shared>>);

impl SharedLab {
    /// Waits for the other tests of this binary that share the programs and
    /// moves the calling thread into their namespace (made by the first).
    pub fn take() -> Result<Self> {
        // A test that failed while holding it left nothing that the next
        // `program` does not reset.
        let mut guard = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        match guard.as_ref() {
            Some(s) => s.kept.enter()?,
            None => *guard = Some(Shared { kept: super::netns::Kept::new()?, programs: Vec::new() }),
        }
        Ok(SharedLab(guard))
    }

    /// As `take`, with the calling thread pinned to its CPU (flow-cache hits
    /// and conntrack verdicts are per CPU: a flow's later packets must run
    /// where its first did), and the veth pair's ifindexes.
    pub fn take_pinned() -> Result<(Self, u32, u32)> {
        let mut lab = Self::take()?;
        super::cpu::pin_here().context("pinning the test thread")?;
        let (a, b) = lab.ports()?;
        Ok((lab, a, b))
    }

    fn shared(&mut self) -> Result<&mut Shared> {
        self.0.as_mut().context("shared lab missing")
    }

    /// Ingress and egress ifindex of the namespace's veth pair.
    pub fn ports(&mut self) -> Result<(u32, u32)> {
        let lab = &self.shared()?.kept.lab;
        Ok((lab.a, lab.b))
    }

    /// A program in the state a fresh load of `world` would have: loaded
    /// the first time these load-time settings are asked for, reset after.
    pub fn program(&mut self, world: &World) -> Result<&Loaded> {
        let key = load_key(world);
        let shared = self.shared()?;
        match shared.programs.iter().position(|(k, _)| *k == key) {
            Some(i) => {
                let l = &shared.programs[i].1;
                l.reset()?;
                world.apply(&l.skel)?;
                Ok(l)
            }
            None => {
                shared.programs.push((key, Loaded::new(world)?));
                shared.programs.last().map(|(_, l)| l).context("no program")
            }
        }
    }

    /// `run_all` on the shared programs.
    pub fn run_all(&mut self, base: &World, cases: &[Case]) {
        run_all_with(base, cases, |world, case| {
            let mut world = world.clone();
            (case.world)(&mut world);
            let loaded = self.program(&world)?;
            check_loaded(&world, case, loaded)
        })
    }
}
