//! `fastpath run`: preflight, load, fill the tables, attach, serve, then
//! follow the kernel until SIGINT/SIGTERM and leave it as it was.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fastpath_bpf::intf;
use fastpath_core::delta_base::DeltaBase;
use fastpath_core::desired::{self, if_flags, Ids};
use fastpath_core::mirror::{Ahead, Mirror, PollOutcome, RouteScope, Touched};
use fastpath_core::model::{Family, KernelState, RouteKey};
use fastpath_core::gone_ahead;
use fastpath_core::neigh_delta;
use fastpath_core::iface_restrict;
use fastpath_core::local_ahead;
use fastpath_core::reconcile::Reconciler;
use fastpath_core::route_delta::{self, FibDelta};
use fastpath_core::tables::{Capacities, Desired, IfaceEntry, Op, Switches, TableWriter};
use log::{debug, error, info, warn};

use crate::api::{self, IfaceInfo, Shared, Snapshot};
use crate::config::Loaded;
use crate::metrics::{self, OpsStats};
use crate::reload::{self, Reloader};
use crate::loader::{self, Attachment};
use crate::maps::{MapWriter, Maps};
use crate::preflight::{self, Iface};
use crate::published::Published;
use crate::{ctwatch, ifset, keepalive, netfilter, nlraw, pin, tcpolicy, vethpeer, xfrm, RunArgs};

/// How long the main loop sleeps in poll when nothing happens; bounds the
/// reaction time to signals.
const IDLE_POLL: Duration = Duration::from_millis(100);
/// While routes wait for their simulated-ASIC write, how often the loop
/// looks for writes that landed (they then go into the maps, all that
/// landed meanwhile in one reconcile).
const LANDED_POLL: Duration = Duration::from_millis(5);
/// After a change, wait for the burst (a route flap, `ip route replace`
/// as delete+add) to finish, but never longer than this.
const DEBOUNCE_MAX: Duration = Duration::from_millis(20);
const DEBOUNCE_STEP: Duration = Duration::from_millis(2);
/// sysctls and neighbour keep-alive.
const PERIODIC: Duration = Duration::from_secs(1);
/// Re-dump of resilient group buckets, a safety net behind the kernel's
/// per-bucket notifications (see `mirror`).
const BUCKET_REFRESH: Duration = Duration::from_secs(10);
/// A neighbour the data path used this recently is reported in use.
const KEEPALIVE_WINDOW: Duration = Duration::from_secs(2);
/// A reconcile at least this slow is logged with its breakdown.
const SLOW_RECONCILE: Duration = Duration::from_millis(100);
/// After a failed reconcile, try again no sooner than this.
const RETRY: Duration = Duration::from_secs(1);

/// Devmap slots we filled; cleared on drop (after the links are gone).
struct TxPorts<'a> {
    maps: &'a Maps,
    slots: Vec<u32>,
}

impl Drop for TxPorts<'_> {
    fn drop(&mut self) {
        for s in &self.slots {
            // A deleted device already took its entry with it.
            if let Err(e) = self.maps.del_tx_port(*s) {
                debug!("removing devmap slot {s}: {e}");
            }
        }
    }
}

pub fn run(loaded: Loaded) -> Result<()> {
    let args: RunArgs = loaded.args.clone();
    let stateful = args.mode == crate::FwdMode::Stateful;
    let checked = preflight::check(&args)?;
    let mut nf_watch = netfilter::Watcher::new(&checked.netfilter, args.allow_netfilter_bypass).stateful(stateful);
    let mut xfrm_watch = xfrm::Watcher::open().context("checking IPsec (xfrm) policies")?;
    let mut tc_watch = tcpolicy::Watcher::new(&checked.tc, preflight::tc_ports(&checked.ifaces), args.allow_tc_bypass);
    let mut veth_watch = vethpeer::Watcher::new(&preflight::tc_ports(&checked.ifaces));
    for b in veth_watch.blocking() {
        warn!("{}: what would leave by it goes to the kernel: {}", b.dev, b.why);
    }
    let mut ifaces = checked.ifaces;

    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&term)).context("installing signal handlers")?;
    }
    let hup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&hup)).context("installing signal handlers")?;
    let mut reloader = Reloader::new(&loaded);
    let metrics_listener = metrics::bind(args.metrics)?;

    loader::bridge_libbpf_log();
    let caps = Capacities {
        fib4: args.fib4_entries,
        fib6: args.fib6_entries,
        nexthops: args.nexthop_entries,
        neigh: args.neigh_entries,
        ifaces: intf::FP_MAX_IFACES,
        groups: args.group_entries,
        buckets: args.bucket_entries,
    };
    // Its combination with stateful mode and --pin: config::combinable().
    let afxdp_on = args.datapath == crate::Datapath::Afxdp;
    if args.pin && args.admission.resource_target == fastpath_core::resources::TargetKind::SimAsic {
        // Its pools live in this process: a restart would adopt maps the new
        // simulated device knows nothing of.
        anyhow::bail!("--resource-target sim-asic holds its tables in the daemon's memory only: not with --pin");
    }
    let opts = loader::LoadOpts {
        flow_sets: if args.flow_timeout == 0 { 0 } else { loader::flow_sets(args.flow_entries) },
        nic_hash: args.rx_hash != crate::RxHash::Off && args.xdp_mode != crate::XdpMode::Generic,
        nic_hash_virtual: args.rx_hash == crate::RxHash::Nic,
        stateful,
        afxdp: afxdp_on,
        flow_key_addrs: args.flow_key == crate::FlowKey::Addresses,
        ct_icmp_keys: if stateful { args.ct_icmp_entries.saturating_mul(2) } else { 1 },
        fib4_dir: args.fib4_dir(),
        fib6_dir: args.fib6_dir(),
    };
    // --pin: what a previous daemon left (maps to adopt, links to take over).
    let mut pins = if args.pin { Some(pin::Pins::open(&args, &mut ifaces, &caps, &opts)?) } else { None };
    let mut instances = loader::load_all(&ifaces, &caps, &opts, pins.as_ref().and_then(|p| p.maps()))?;
    let maps = Maps::from_skel(&instances.first().context("no interface to run on")?.skel).context("opening map handles")?;

    let mut tx = TxPorts { maps: &maps, slots: Vec::new() };
    for i in &ifaces {
        maps.add_tx_port(i.slot, i.ifindex).with_context(|| format!("adding {} to the devmap", i.name))?;
        // Pinned devmap entries outlive the daemon (programs may still use them).
        if !args.pin {
            tx.slots.push(i.slot);
        }
    }

    let mut mirror = Mirror::open(args.netlink_rcvbuf).context("opening the netlink mirror")?;
    if args.route_source == crate::RouteSource::Fpm {
        // zebra's routes replace the kernel's; the kernel's copy stays out.
        mirror.set_scope(RouteScope::LocalTable);
    }
    let t = Instant::now();
    let mut state = mirror.dump().context("dumping kernel state")?;
    info!("dumped kernel state in {:.1} ms ({} routes)", t.elapsed().as_secs_f64() * 1e3, state.routes.len());
    // --route-source fpm: zebra's routes and next hops go into `state` in
    // place of the kernel's before every reconcile (see fpm::overlay).
    let mut fpm = crate::fpm::start(&args)?;
    let managed: BTreeMap<u32, u32> = ifaces.iter().map(|i| (i.ifindex, i.slot)).collect();
    let mut lp = Loop {
        netfilter_block: nf_watch.blocking().to_vec(),
        xfrm_block: xfrm_watch.findings().clone(),
        tc_block: tc_watch.blocking().to_vec(),
        veth_block: veth_watch.blocking().to_vec(),
        ids: Ids::new(caps.nexthops, caps.groups),
        reconciler: Reconciler::with_capacities(caps),
        writer: {
            let mut w = MapWriter::new(maps.try_clone().context("opening map handles")?, managed.clone());
            w.set_flow_timeout(if opts.flow_sets == 0 { 0 } else { args.flow_timeout });
            w.set_orphan_grace(args.orphan_grace);
            if opts.fib4_dir {
                w.enable_fib4_dir()?;
            }
            if opts.fib6_dir {
                w.enable_fib6_dir()?;
            }
            w
        },
        caps,
        managed,
        problems: BTreeSet::new(),
        failed_log: Default::default(),
        published: Published::new(Desired::default()),
        keepalives: 0,
        gone: BTreeSet::new(),
        configured: ifaces.iter().map(|i| i.name.clone()).collect(),
        readopt_refused: None,
        reslot: BTreeSet::new(),
        flow_timeout: if opts.flow_sets == 0 { 0 } else { args.flow_timeout },
        flow_entries: opts.flow_sets * intf::FP_FLOW_WAYS,
        flow_key_addrs: opts.flow_key_addrs,
        ops: OpsStats { last_full_sync: Some(t), ..Default::default() },
        ct_status: None,
        route_source: None,
        fpm_reported_full: 0,
        afxdp: None,
        ct: None,
        admission: args.admission.build(&caps)?,
        delta_base: None,
    };
    // Adopted first: fp_runtime comes back with the old run's ct_generation,
    // which the stateful start below moves past. Starting from 0 instead
    // would make verdicts the old run cached at a low generation current
    // again (the pinned programs keep forwarding meanwhile).
    if let Some(p) = &pins {
        p.adopt_tables(&maps, &mut lp.reconciler, &mut lp.writer, &mut lp.ids)?;
    }
    // Stateful mode: subscribed and fp_runtime's ct fields set before the
    // first packet can be fast-pathed by our programs.
    if stateful {
        let first = instances.first().context("no interface to run on")?;
        let m = &first.skel.maps;
        let maps = ctwatch::StatefulMaps {
            liberal_req: libbpf_rs::MapHandle::try_from(&m.fp_ct_liberal_req).context("opening fp_ct_liberal_req")?,
            icmp: libbpf_rs::MapHandle::try_from(&m.fp_ct_icmp).context("opening fp_ct_icmp")?,
            icmp_req: libbpf_rs::MapHandle::try_from(&m.fp_ct_icmp_req).context("opening fp_ct_icmp_req")?,
        };
        let c = ctwatch::Stateful::start(args.ct_marks(), args.ct_revalidate_ms, args.netlink_rcvbuf, args.ct_ab, maps, &mut lp.writer)?;
        lp.ct_status = Some(c.status(&lp.writer));
        lp.ct = Some(c);
    }
    // Tables complete before the first packet can see them.
    if let Some(f) = &mut fpm {
        f.overlay(&mut state, true);
    }
    lp.reconcile(&state).context("writing the initial tables")?;
    lp.fpm_report(&mut fpm);

    // Packets stamp the keep-alive clock on neighbours and cached flows:
    // start it now rather than at the first tick.
    maps.set_neigh_clock(keepalive::neigh_clock_now()).context("starting the keep-alive clock")?;
    // AF_XDP: sockets registered before the program can redirect to them.
    // (A plain instance attach_all may swap in shares the first one's maps, the XSKMAP too.)
    let afxdp = match (afxdp_on, instances.first()) {
        (true, Some(first)) => Some(crate::afxdp::start(&args, &ifaces, first)?),
        _ => None,
    };
    lp.afxdp = afxdp.as_ref().map(|f| f.stats_source());
    let takeover = pins.as_mut().map(|p| p.take_links(&ifaces)).unwrap_or_default();
    let plain = |k: usize, first: &loader::Instance| loader::load_plain(&ifaces[k], &caps, &opts, first);
    let mut attachments = loader::attach_all(&mut instances, args.xdp_mode, takeover, &plain)?;
    let first = instances.first().context("no interface to run on")?;
    if let Some(p) = &mut pins {
        p.commit(first, &instances, &attachments, &maps).context("pinning")?;
    }
    let shared: Shared = Arc::new(Mutex::new(Arc::new(Snapshot::default())));
    lp.publish(&shared, &state, &mirror, &ifaces, &attachments);
    let server = api::serve(
        &args.socket,
        checked.socket == preflight::SocketState::Stale,
        Arc::clone(&shared),
        maps.try_clone().context("opening map handles")?,
    )?;
    let metrics_server = match metrics_listener {
        Some(l) => Some(metrics::serve(
            l,
            Arc::clone(&shared),
            maps.try_clone().context("opening map handles")?,
            usize::from(args.metrics_flows),
        )?),
        None => None,
    };
    info!(
        "fastpath running on {} (generation {})",
        ifaces.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", "),
        lp.reconciler.generation()
    );
    crate::startlog::release();

    // The initial reconcile above covered everything.
    let mut pending = Pending::Nothing;
    let mut retry_at: Option<Instant> = None;
    let mut last_periodic = Instant::now();
    let mut heap = crate::heap::Trimmer::new();
    let mut last_buckets = Instant::now();
    let mut last_poll_err: Option<String> = None;
    // When the oldest netlink change not yet in the maps arrived.
    let mut pending_since: Option<Instant> = None;
    // Links (among other things) changed since the last look at whether a
    // managed device went away or came back: that look asks the kernel
    // about our XDP links, which takes the rtnl lock, so only then.
    let mut links_changed = false;
    // The attached interfaces, as a reload or a re-adoption changes them.
    macro_rules! attached {
        () => {
            ifset::Attached {
                ifaces: &mut ifaces,
                instances: &mut instances,
                attachments: &mut attachments,
                pins: pins.as_ref(),
                maps: &maps,
                tx_slots: &mut tx.slots,
                caps: &caps,
                opts: &opts,
                mode: args.xdp_mode,
            }
        };
    }
    while !term.load(Ordering::Relaxed) {
        if hup.swap(false, Ordering::Relaxed) {
            match reloader.reload(&mut Hup { lp: &mut lp, set: attached!() }) {
                reload::Outcome::Rejected => lp.ops.reloads_failed += 1,
                reload::Outcome::Done { .. } => lp.ops.reloads_ok += 1,
                reload::Outcome::NoFile => {}
            }
            // A changed interface set is written by this reconcile; without
            // one it finds nothing to write.
            pending.everything();
            lp.publish(&shared, &state, &mirror, &ifaces, &attachments);
        }
        let idle = if lp.admission.as_ref().is_some_and(|a| a.has_pending()) { LANDED_POLL } else { IDLE_POLL };
        // A firewall rule, IPsec policy, tc filter or veth peer change that
        // must stop the fast path wakes the loop as a route or FPM change
        // does, rather than waiting out the idle poll; conntrack events must
        // not wait behind an idle route socket either. Each is drained in
        // every round, so none stays readable.
        let mut wake = vec![mirror.fd()];
        nf_watch.wake_fds(&mut wake);
        xfrm_watch.wake_fds(&mut wake);
        tc_watch.wake_fds(&mut wake);
        veth_watch.wake_fds(&mut wake);
        wake.extend(fpm.as_ref().map(|f| f.wake_fd()));
        match &lp.ct {
            Some(c) => c.wait(&wake, idle),
            None => drop(nlraw::wait_any(&wake, idle)),
        }
        match mirror.poll(&mut state, Duration::ZERO, &mut |st, a| lp.ahead(st, a)) {
            Ok(PollOutcome::Idle) => last_poll_err = None,
            Ok(outcome) => {
                last_poll_err = None;
                pending_since.get_or_insert_with(Instant::now);
                if outcome == PollOutcome::Resynced {
                    lp.ops.last_full_sync = Some(Instant::now());
                    warn!("netlink overrun: resynced from a full dump ({} so far)", mirror.resyncs());
                }
                debounce(&mut mirror, &mut state, &mut |st, a| lp.ahead(st, a));
                // A failed re-dump is tried again after the next event.
                if let Err(e) = mirror.settle_sources(&mut state) {
                    error!("netlink: re-dumping the routes after an address went: {e}");
                }
                let t = mirror.take_touched();
                if t.other {
                    debug!("more than routes, next-hop objects and neighbours changed: full recompute");
                    links_changed = true;
                    pending.everything();
                } else {
                    pending.partial(t);
                }
            }
            Err(e) => {
                let msg = e.to_string();
                if last_poll_err.as_deref() != Some(msg.as_str()) {
                    error!("netlink: {msg}");
                }
                last_poll_err = Some(msg);
                std::thread::sleep(IDLE_POLL);
            }
        }

        if lp.admission.as_mut().is_some_and(|a| a.take_landed()) {
            pending.everything();
        }

        if let Some(f) = &mut fpm {
            let ch = f.take_changed();
            if ch.table {
                // Which routes changed is known when they are overlaid.
                pending.partial(Touched::default());
                pending_since.get_or_insert_with(Instant::now);
            }
            if ch.status {
                lp.route_source = Some(Arc::new(f.published()));
                lp.publish(&shared, &state, &mirror, &ifaces, &attachments);
            }
        }

        if let Some(c) = &mut lp.ct {
            c.step(&mut lp.writer);
            // The counters move with every event, and a snapshot per event
            // costs the CPU the connections need: a new generation is
            // published at once, the rest with the periodic publish.
            let st = c.status(&lp.writer);
            let bumped = lp.ct_status.is_none_or(|old| old.generation != st.generation);
            lp.ct_status = Some(st);
            if bumped {
                lp.publish(&shared, &state, &mirror, &ifaces, &attachments);
            }
        }

        if lp.published.catch_up(Instant::now()) {
            lp.publish(&shared, &state, &mirror, &ifaces, &attachments);
        }

        // New policy must stop the fast path now, not at the next period.
        if xfrm_watch.poll() {
            lp.xfrm_block = xfrm_watch.findings().clone();
            lp.restrict_ifaces(&state, &[]);
            pending.everything();
        }
        // By the names the ports have now (tc reports names, not ifindexes).
        let ports = || {
            let now = |i: &Iface| state.links.get(&i.ifindex).map_or_else(|| i.name.clone(), |l| l.name.clone());
            ifaces.iter().map(|i| (now(i), i.ifindex)).collect()
        };
        if tc_watch.refresh(last_periodic.elapsed() >= PERIODIC, ports) {
            lp.tc_block = tc_watch.blocking().to_vec();
            lp.restrict_ifaces(&state, &[]);
            pending.everything();
        }
        if veth_watch.refresh(last_periodic.elapsed() >= PERIODIC, ports) {
            for b in veth_watch.blocking().iter().filter(|b| !lp.veth_block.contains(b)) {
                warn!("{}: what would leave by it goes to the kernel: {}", b.dev, b.why);
            }
            for b in lp.veth_block.iter().filter(|b| !veth_watch.blocking().iter().any(|n| n.ifindex == b.ifindex)) {
                info!("{}: its peer takes XDP frames now", b.dev);
            }
            lp.veth_block = veth_watch.blocking().to_vec();
            // A newly blocked veth must stop at once (cached flows go back
            // through the checks); one unblocked waits for the recompute.
            lp.restrict_ifaces(&state, &[]);
            pending.everything();
        }

        let periodic = last_periodic.elapsed() >= PERIODIC;
        // A rule the fast path would bypass stops it in the round after
        // its commit, not at the next period.
        if nf_watch.refresh(periodic) {
            lp.netfilter_block = nf_watch.blocking().to_vec();
            lp.restrict_ifaces(&state, &[]);
            pending.everything();
        }
        if periodic {
            last_periodic = Instant::now();
            if let Some(took) = heap.tick() {
                debug!("heap trimmed in {:.1} ms", took.as_secs_f64() * 1e3);
            }
            if let Some(c) = &mut lp.ct {
                c.refresh_sysctls(&mut lp.writer);
            }
            match mirror.refresh_sysctls(&mut state) {
                Ok(true) => {
                    debug!("sysctls changed: full recompute");
                    pending.everything();
                }
                Ok(false) => {}
                Err(e) => error!("netlink: re-dumping the routes after IPv6 was switched on a link: {e}"),
            }
            if last_buckets.elapsed() >= BUCKET_REFRESH && state.nexthops.values().any(|n| n.resilient) {
                last_buckets = Instant::now();
                match mirror.refresh_buckets(&mut state) {
                    Ok(true) => pending.everything(),
                    Ok(false) => {}
                    Err(e) => warn!("re-dumping next-hop buckets: {e}"),
                }
            }
        }

        if !matches!(pending, Pending::Nothing) && retry_at.is_none_or(|t| Instant::now() >= t) {
            if let Some(f) = &mut fpm {
                // A full recompute may follow a resync, which rebuilt `state`
                // from a dump (the kernel's local table only): then
                // everything goes back in.
                match f.overlay(&mut state, matches!(pending, Pending::Everything)) {
                    Some(t) => pending.partial(t),
                    None => pending.everything(),
                }
            }
            let res = match &pending {
                Pending::Partial(t) => lp.reconcile_partial(&state, t),
                _ => {
                    // It covers whatever the mirror noted so far (a sysctl
                    // refresh notes `other` too): left there, the next
                    // route change would recompute everything again.
                    mirror.take_touched();
                    lp.reconcile(&state)
                }
            };
            match res {
                Ok(()) => {
                    lp.fpm_report(&mut fpm);
                    pending = Pending::Nothing;
                    retry_at = None;
                    if let Some(t) = pending_since.take() {
                        lp.ops.record_lag(t.elapsed());
                    }
                    lp.prebuild_delta_base(&state);
                    heap.updated();
                }
                Err(e) => {
                    lp.ops.reconcile_failures += 1;
                    pending.everything();
                    error!("{e:#}; retrying");
                    retry_at = Some(Instant::now() + RETRY);
                }
            }
            lp.note_deleted(&state, &ifaces);
            lp.publish(&shared, &state, &mirror, &ifaces, &attachments);
        }

        if periodic {
            // A refused change is tried again every period.
            let look = std::mem::take(&mut links_changed) || lp.readopt_refused.is_some();
            if look && lp.follow_devices(attached!(), &state) {
                pending.everything();
                lp.publish(&shared, &state, &mirror, &ifaces, &attachments);
            }
            if let Some(f) = &fpm {
                lp.route_source = Some(Arc::new(f.published()));
            }
            lp.keepalives += keepalive::refresh(&maps, &state, KEEPALIVE_WINDOW);
            // Entries of replaced IPv6 index versions go once they rested,
            // also when no route change comes to flush them.
            lp.writer.tidy();
            lp.publish(&shared, &state, &mirror, &ifaces, &attachments);
        }
    }

    drop(metrics_server);
    drop(fpm);
    let names: Vec<String> = attachments.iter().map(|a| a.name.clone()).collect();
    if args.pin {
        info!("signal received: leaving the pinned programs forwarding on {} (`fastpath detach` removes them); exiting", names.join(", "));
    } else {
        info!("signal received: detaching and exiting");
    }
    drop(server);
    drop(attachments);
    drop(afxdp);
    drop(tx);
    if !args.pin {
        info!("detached from {}; exiting", names.join(", "));
    }
    Ok(())
}

/// What the next reconcile must cover: nothing, the FIB entries of the
/// touched route keys and of the routes using the touched next-hop objects,
/// the neighbour entries and/or the interface entries of links whose
/// carrier came back (only such messages came in: route_delta, neigh_delta
/// and iface_restrict::carrier_back may be all it takes), or everything.
enum Pending {
    Nothing,
    Partial(Touched),
    Everything,
}

impl Pending {
    fn everything(&mut self) {
        *self = Pending::Everything;
    }

    /// `t` without `other` set.
    fn partial(&mut self, t: Touched) {
        match self {
            Pending::Nothing => *self = Pending::Partial(t),
            Pending::Partial(p) => {
                p.routes.extend(t.routes);
                p.nexthops.extend(t.nexthops);
                p.carrier_back.extend(t.carrier_back);
                p.neighbours |= t.neighbours;
            }
            Pending::Everything => {}
        }
    }
}

/// After a change, keep draining until the kernel goes quiet (or the
/// debounce budget is spent) so one burst costs one reconcile.
fn debounce(mirror: &mut Mirror, state: &mut KernelState, ahead: &mut dyn FnMut(&KernelState, &Ahead)) {
    let start = Instant::now();
    while start.elapsed() < DEBOUNCE_MAX {
        match mirror.poll(state, DEBOUNCE_STEP, ahead) {
            Ok(PollOutcome::Idle) => return,
            Ok(_) => {}
            Err(e) => {
                error!("netlink: {e}");
                return;
            }
        }
    }
}

/// Where a reconcile's time went; logged at info when it was slow enough
/// to matter (full tables), at debug otherwise.
#[derive(Default)]
struct Timing {
    compute: Duration,
    apply: Duration,
    publish: Duration,
}

impl Timing {
    fn log(&self, writes: usize, generation: u64) {
        let total = self.compute + self.apply + self.publish;
        if writes == 0 && total < SLOW_RECONCILE {
            return;
        }
        let level = if total >= SLOW_RECONCILE { log::Level::Info } else { log::Level::Debug };
        log::log!(
            level,
            "applied {writes} map writes, generation {generation} in {:.1} ms (compute {:.1}, apply {:.1}, shadow copy {:.1})",
            total.as_secs_f64() * 1e3,
            self.compute.as_secs_f64() * 1e3,
            self.apply.as_secs_f64() * 1e3,
            self.publish.as_secs_f64() * 1e3
        );
    }
}

struct Loop {
    /// Netfilter base chains that appeared while running (not allowed by
    /// --allow-netfilter-bypass): everything is punted while any exists.
    netfilter_block: Vec<String>,
    /// Families IPsec policies take out of the fast path (see xfrm.rs).
    xfrm_block: xfrm::Findings,
    /// tc policy on the managed ports (not allowed by --allow-tc-bypass):
    /// their fp_ifaces entries keep the fast path off that way (tcpolicy.rs).
    tc_block: Vec<tcpolicy::Bypass>,
    /// Managed veths whose peer would drop redirected frames (vethpeer.rs).
    veth_block: Vec<vethpeer::Block>,
    ids: Ids,
    reconciler: Reconciler,
    writer: MapWriter,
    caps: Capacities,
    managed: BTreeMap<u32, u32>,
    /// Problems already logged, so each is logged once when it appears and once when it clears.
    problems: BTreeSet<String>,
    /// Routes already logged as offload failed.
    failed_log: fastpath_core::overflow::FailedLog,
    /// What readers see of the applied tables (route-only and
    /// neighbour-only changes to a big table reach it within published::LAG).
    published: Published,
    keepalives: u64,
    /// Managed interfaces already reported deleted.
    gone: BTreeSet<u32>,
    /// The interface names the user asked for (command line or the last
    /// accepted reload): a device created again under one is taken back.
    configured: Vec<String>,
    /// Why the last re-adoption was refused (logged once per reason).
    readopt_refused: Option<String>,
    /// Interfaces whose slot a reload changed (added: a new one, dropped:
    /// 0): their next hops are rewritten before the next reconcile.
    reslot: BTreeSet<u32>,
    /// Flow cache settings, for status.
    flow_timeout: u32,
    flow_entries: u32,
    flow_key_addrs: bool,
    ops: OpsStats,
    /// Stateful mode, for status (None: stateless).
    ct_status: Option<ctwatch::CtStatus>,
    /// --route-source fpm, for status and `routes` (None: kernel).
    route_source: Option<Arc<crate::fpm::Published>>,
    /// Full reconciles when zebra was last told the routes' status.
    fpm_reported_full: u64,
    /// AF_XDP data path counters, for status (None: XDP data path).
    afxdp: Option<crate::afxdp::StatsSource>,
    /// Stateful mode (None: stateless); here so a reload can reach it.
    ct: Option<ctwatch::Stateful>,
    /// --reservation-model/--resource-target (None: the default, see admission.rs).
    admission: Option<fastpath_core::resources::Admission>,
    /// What route-only changes keep between them (None: built by the next
    /// one); every full reconcile drops it.
    delta_base: Option<DeltaBase>,
}

/// What a SIGHUP reaches: the loop's settings and the attached interfaces.
struct Hup<'a, 'b> {
    lp: &'a mut Loop,
    set: ifset::Attached<'b>,
}

impl reload::Live for Hup<'_, '_> {
    fn set_flow_timeout(&mut self, secs: u32) -> Result<(), String> {
        self.lp.set_flow_timeout(secs)
    }

    fn set_ct_mark(&mut self, marks: ctwatch::CtMarks) -> Result<(), String> {
        self.lp.set_ct_mark(marks)
    }

    fn set_ct_revalidate_ms(&mut self, ms: u32) -> Result<(), String> {
        self.lp.set_ct_revalidate_ms(ms)
    }

    fn set_interfaces(&mut self, names: &[String]) -> Result<(), reload::Refusal> {
        if self.set.change(names, &self.lp.writer.taken_slots())?.is_some() {
            self.lp.manage(self.set.ifaces);
        }
        self.lp.configured = names.to_vec();
        Ok(())
    }
}

impl Loop {
    fn set_flow_timeout(&mut self, secs: u32) -> Result<(), String> {
        // The cache is sized and switched on at load.
        if self.flow_entries == 0 && secs != 0 {
            return Err("the flow cache was not loaded (started with flow-timeout 0)".into());
        }
        self.writer.set_flow_timeout(secs);
        if let Err(e) = self.writer.flush_runtime() {
            self.writer.set_flow_timeout(self.flow_timeout);
            return Err(format!("writing fp_runtime: {e}"));
        }
        self.flow_timeout = secs;
        Ok(())
    }

    fn set_ct_mark(&mut self, marks: ctwatch::CtMarks) -> Result<(), String> {
        let Some(c) = &mut self.ct else { return Ok(()) };
        if c.marks() == marks {
            return Ok(());
        }
        c.set_marks(marks, &mut self.writer)?;
        self.ct_status = Some(c.status(&self.writer));
        Ok(())
    }

    fn set_ct_revalidate_ms(&mut self, ms: u32) -> Result<(), String> {
        let Some(c) = &mut self.ct else { return Ok(()) };
        c.set_revalidate_ms(ms, &mut self.writer)?;
        self.ct_status = Some(c.status(&self.writer));
        Ok(())
    }

    /// A reload changed the interface set (`ifaces`, with their slots).
    /// The next reconcile writes the entries and neighbours of the new
    /// interfaces and deletes those of the dropped ones; their next hops
    /// change egress slot, which the reconciler cannot see (same ifindex,
    /// same gateway), so they are rewritten first, and the generation bump
    /// that ends it makes every cached flow look again.
    fn manage(&mut self, ifaces: &[Iface]) {
        let managed: BTreeMap<u32, u32> = ifaces.iter().map(|i| (i.ifindex, i.slot)).collect();
        let before = &self.managed;
        self.reslot.extend(managed.keys().chain(before.keys()).filter(|k| managed.get(k) != before.get(k)));
        self.writer.set_slots(managed.clone());
        self.managed = managed;
        self.reconciler.force_bump();
    }

    fn reslot_nexthops(&mut self) -> Result<()> {
        let nexthops = &self.reconciler.applied().nexthops;
        for (id, e) in nexthops.iter().filter(|(_, e)| self.reslot.contains(&e.ifindex)) {
            self.writer.apply(&Op::UpsertNexthop(*id, e.clone())).context("re-slotting a next hop")?;
        }
        self.reslot.clear();
        Ok(())
    }

    fn reconcile(&mut self, state: &KernelState) -> Result<()> {
        self.delta_base = None;
        self.reslot_nexthops()?;
        // Routes that found no free next-hop id are punted on their own; ids
        // the apply releases may serve them, so a starved pass is followed by
        // one more rather than waiting for the next kernel event.
        let mut passes = 0;
        let mut timing = Timing::default();
        let (desired, res) = loop {
            passes += 1;
            let t = Instant::now();
            let mut desired = desired::compute_gated(state, &self.managed, &self.caps, &mut self.ids, self.admission.as_mut());
            self.punt_for_bypass(&mut desired);
            timing.compute += t.elapsed();
            let t = Instant::now();
            let res = self.reconciler.apply(&desired, &mut self.writer);
            timing.apply += t.elapsed();
            // Even after a partial failure the shadow says what the maps hold.
            self.ids.release_unused(self.reconciler.applied());
            if res.is_err() || !self.ids.starved() || passes == 2 {
                break (desired, res);
            }
        };
        self.log_problems(&desired);
        self.failed_log.update(&desired.offload);
        let t = Instant::now();
        let mut applied = self.reconciler.applied().clone();
        applied.offload = desired.offload;
        self.published.replace(applied);
        timing.publish = t.elapsed();
        let n = res.context("reconciling the BPF maps")?;
        timing.log(n, self.reconciler.generation());
        self.ops.reconciles_full += 1;
        self.writer.forget_retired(&self.reconciler.applied().ifaces);
        Ok(())
    }

    /// After route and neighbour messages only: writes just the changed
    /// neighbour entries and prefixes' FIB entries when `neigh_delta` and
    /// `route_delta` are sure that is all that changes, else the full
    /// reconcile.
    fn reconcile_partial(&mut self, state: &KernelState, t: &Touched) -> Result<()> {
        if self.admission.is_some() || !self.reslot.is_empty() {
            return self.reconcile(state);
        }
        if !t.carrier_back.is_empty() {
            let applied = &self.reconciler.applied().ifaces;
            let ifaces: BTreeMap<u32, IfaceEntry> = iface_restrict::carrier_back(applied, state, &t.carrier_back)
                .into_iter()
                .filter(|(i, e)| applied.get(i) != Some(e))
                .collect();
            if !ifaces.is_empty() {
                let names: Vec<String> = ifaces.keys().map(|i| state.links.get(i).map_or_else(|| i.to_string(), |l| l.name.clone())).collect();
                let d = FibDelta { ifaces, ..FibDelta::default() };
                self.write_delta(d, Timing::default()).context("writing the interface entries of links whose carrier came back")?;
                self.ops.reconciles_links += 1;
                info!("{}: carrier back, interface entries written (generation {})", names.join(", "), self.reconciler.generation());
            }
        }
        // A next-hop object replaced: the routes using it.
        let mut users = Vec::new();
        if !t.nexthops.is_empty() {
            let Some(u) = route_delta::object_users(state, &t.nexthops) else {
                debug!("next-hop object changes touch too many routes: full recompute");
                return self.reconcile(state);
            };
            users = u;
        }
        let touched: Vec<(Family, RouteKey)> = t.routes.iter().cloned().chain(users).collect();
        let touched = touched.as_slice();
        if t.neighbours {
            let t = Instant::now();
            let Some(delta) = neigh_delta::neigh_delta(self.reconciler.applied(), state, &self.managed, &self.caps) else {
                debug!("neighbour changes need a full recompute");
                return self.reconcile(state);
            };
            let timing = Timing { compute: t.elapsed(), ..Timing::default() };
            self.write_delta(delta, timing).context("writing changed neighbours to the BPF maps")?;
            self.ops.reconciles_neigh += 1;
            if touched.is_empty() {
                return Ok(());
            }
        }
        self.reconcile_routes(state, touched)
    }

    /// Mirror::poll's hook, before the re-dumps and the full recompute a
    /// change needs (seconds with a full table): what the change takes away
    /// goes to the maps at once (`Ahead`: route keys this poll touched,
    /// next-hop objects it deleted, whether more than routes and
    /// neighbours changed since the last reconcile).
    fn ahead(&mut self, state: &KernelState, a: &Ahead) {
        if a.other {
            self.restrict_ifaces(state, a.v4_flushed);
        }
        // A resource model decides what reaches the FIB maps (and counts it).
        if self.admission.is_some() {
            return;
        }
        // Without a re-dump to come no route used them (Followups::settle).
        if a.other && !a.gone_nexthops.is_empty() {
            self.punt_gone_nexthops(state, a.gone_nexthops);
        }
        let d = local_ahead::local_ahead(self.reconciler.applied(), state, a.routes, a.other, &self.caps);
        if d.is_empty() {
            return;
        }
        self.write_ahead(d, "local-table or own-address entries punted ahead of the recompute");
    }

    /// Writes punting entries ahead of a recompute; a failure is left to
    /// that recompute, which follows in any case.
    fn write_ahead(&mut self, d: FibDelta, what: &str) {
        let n = d.len();
        match self.write_delta(d, Timing::default()) {
            Ok(()) => {
                self.ops.reconciles_ahead += 1;
                info!("{n} {what} (generation {})", self.reconciler.generation());
            }
            Err(e) => warn!("{what}: {e:#}"),
        }
    }

    /// Next-hop objects deleted: the kernel dropped the routes using them
    /// without a message each, and they leave the state only with the route
    /// re-dump (1-2 s with a full table), and the maps with the recompute
    /// after it. Their prefixes are punted now (`gone_ahead`).
    fn punt_gone_nexthops(&mut self, state: &KernelState, gone: &[u32]) {
        let Some(users) = route_delta::object_users(state, gone) else {
            warn!("next-hop objects {gone:?} were used by too many routes to punt ahead of the re-dump");
            return;
        };
        let d = gone_ahead::gone_ahead(self.reconciler.applied(), &users);
        if d.is_empty() {
            return;
        }
        // Its use counts no longer match the maps; the recompute that
        // follows builds a new one.
        self.delta_base = None;
        self.write_ahead(d, "prefixes routed through deleted next-hop objects punted ahead of the re-dump");
    }

    /// The route index route-only changes need (`DeltaBase`, one pass over
    /// the routes: 100-220 ms with a full table), built once the maps hold
    /// a full recompute's result rather than on the next route change's
    /// time. It is carried from here like one built at that change (the
    /// property test in delta_base covers carried bases).
    fn prebuild_delta_base(&mut self, state: &KernelState) {
        if self.delta_base.is_some() || self.admission.is_some() || !self.reslot.is_empty() {
            return;
        }
        let t = Instant::now();
        self.delta_base = Some(DeltaBase::new(state, self.reconciler.applied()));
        debug!("route index built in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    }

    /// What a link, rule or netfilter change takes away (down, gone, no
    /// forwarding, a smaller MTU, a stricter rp_filter; a family no longer
    /// looked up in the main table, or behind a netfilter chain the data
    /// path would bypass; IPv4 out of `v4_flushed`, the interfaces that
    /// lost their last IPv4 address and with it every IPv4 route through
    /// them) goes to the maps before the route re-dump and full recompute
    /// it needs. A failed write is left to that recompute, which follows
    /// in any case.
    fn restrict_ifaces(&mut self, state: &KernelState, v4_flushed: &[u32]) {
        let applied = self.reconciler.applied();
        let mut r = iface_restrict::restrictions(&applied.ifaces, state);
        // As `punt_for_bypass` will in the recompute: tc and veth peer
        // marks on the ports. V4_FLUSH is the recompute's to clear.
        let mut bits = self.watched_bits();
        for i in v4_flushed {
            *bits.entry(*i).or_insert(0) |= if_flags::V4_FLUSH;
        }
        for (ifindex, bits) in bits {
            let pos = r.iter().position(|(i, _)| *i == ifindex);
            let Some(mut e) = pos.map(|p| r[p].1.clone()).or_else(|| applied.ifaces.get(&ifindex).cloned()) else {
                continue;
            };
            if e.flags & bits == bits {
                continue;
            }
            e.flags |= bits;
            match pos {
                Some(p) => r[p].1 = e,
                None => r.push((ifindex, e)),
            }
        }
        let mut sw = iface_restrict::policy_punts(&applied.switches, state, &self.managed);
        // As `punt_for_bypass` will in the recompute.
        let bits = self.bypass_punt();
        if applied.switches.policy_punt & bits != bits {
            let base = sw.unwrap_or(applied.switches);
            sw = Some(Switches { policy_punt: base.policy_punt | bits, ..base });
        }
        if r.is_empty() && sw.is_none() {
            return;
        }
        match self.reconciler.apply_restrictions(sw, &r, &mut self.writer) {
            Ok(_) => {
                self.ops.reconciles_ahead += 1;
                let mut names: Vec<String> = r
                    .iter()
                    .map(|(i, _)| {
                        let name = state.links.get(i).map_or_else(|| format!("ifindex {i}"), |l| l.name.clone());
                        if v4_flushed.contains(i) {
                            format!("{name} (last IPv4 address gone: IPv4 punted)")
                        } else {
                            name
                        }
                    })
                    .collect();
                if let Some(s) = sw {
                    names.push(format!("policy punt {:#x}", s.policy_punt));
                }
                info!("{}: restricted ahead of the recompute (generation {})", names.join(", "), self.reconciler.generation());
            }
            Err(e) => warn!("restricting interfaces ahead of the recompute: {e}"),
        }
    }

    /// Writes a delta to the maps (a failure is retried as a full
    /// reconcile, which republishes) and hands it to what readers see.
    fn write_delta(&mut self, delta: FibDelta, mut timing: Timing) -> Result<()> {
        let t = Instant::now();
        let res = self.reconciler.apply_fib_delta(&delta, &mut self.writer);
        timing.apply = t.elapsed();
        let n = res?;
        let t = Instant::now();
        // What readers see follows the maps, at once or within LAG.
        self.published.apply(delta, Instant::now());
        timing.publish = t.elapsed();
        timing.log(n, self.reconciler.generation());
        Ok(())
    }

    /// Writes just the changed prefixes' FIB entries when `route_delta` is
    /// sure that is all that changes, else the full reconcile.
    fn reconcile_routes(&mut self, state: &KernelState, touched: &[(Family, RouteKey)]) -> Result<()> {
        if touched.is_empty() {
            // Messages that changed nothing: no base to build (a pass over
            // a full table), only a pending generation bump to write.
            self.write_delta(FibDelta::default(), Timing::default()).context("writing the BPF maps")?;
            self.ops.reconciles_routes += 1;
            return Ok(());
        }
        let t = Instant::now();
        // Normally built after the last full recompute; otherwise from
        // `state` with `touched` already in it: their pairs are probed
        // either way, and a local-table change is never a delta. Put back
        // only once this delta is written.
        let mut base = self.delta_base.take().unwrap_or_else(|| DeltaBase::new(state, self.reconciler.applied()));
        let delta = route_delta::fib_delta(self.reconciler.applied(), self.published.offload(), &base, state, touched, &self.caps, &self.ids);
        let Some(delta) = delta else {
            debug!("{} route change(s) need a full recompute", touched.len());
            return self.reconcile(state);
        };
        let timing = Timing { compute: t.elapsed(), ..Timing::default() };
        // The ids of what it adds are taken even if the write fails: the
        // full reconcile that follows adopts what reached the maps.
        self.ids.reserve_delta(&delta);
        base.advance(touched, &delta);
        self.write_delta(delta, timing).context("writing changed routes to the BPF maps")?;
        self.delta_base = Some(base);
        self.ops.reconciles_routes += 1;
        Ok(())
    }

    /// The families that policy the data path cannot apply takes out of
    /// the fast path: all while a netfilter chain it would bypass exists,
    /// those with IPsec policies on the forwarding path.
    fn bypass_punt(&self) -> u32 {
        let nf = if self.netfilter_block.is_empty() { 0 } else { Family::V4.bit() | Family::V6.bit() };
        nf | self.xfrm_block.families
    }

    /// fp_ifaces flag bits per managed ifindex for the tc policy on it and
    /// for a veth peer that would drop redirected frames.
    fn watched_bits(&self) -> BTreeMap<u32, u16> {
        let mut m = BTreeMap::new();
        for b in &self.tc_block {
            *m.entry(b.ifindex).or_insert(0) |= if b.egress { if_flags::TC_EGRESS } else { if_flags::TC_INGRESS };
        }
        for b in &self.veth_block {
            *m.entry(b.ifindex).or_insert(0) |= if_flags::PEER_NO_XDP;
        }
        m
    }

    /// Forwarding past a firewall rule, tc or IPsec policy would be a policy
    /// violation, so what it concerns goes to the kernel. Counted under
    /// `policy_routing`: it is the kernel's policy that must decide.
    fn punt_for_bypass(&self, d: &mut Desired) {
        d.switches.policy_punt |= self.bypass_punt();
        if !self.netfilter_block.is_empty() {
            d.problems.push(format!(
                "netfilter rules the fast path would bypass ({}): IPv4 and IPv6 punted (restart with --allow-netfilter-bypass if the bypass is intended)",
                self.netfilter_block.join(", ")
            ));
        }
        for (ifindex, bits) in self.watched_bits() {
            if let Some(e) = d.ifaces.get_mut(&ifindex) {
                e.flags |= bits;
            }
        }
        for b in &self.veth_block {
            d.problems.push(format!("{}: traffic leaving by it goes to the kernel: {}", b.dev, b.why));
        }
        for b in &self.tc_block {
            let way = if b.egress { "leaving by" } else { "arriving on" };
            d.problems.push(format!(
                "tc policy on {} ({}): traffic {way} {} goes to the kernel (--allow-tc-bypass forwards past it)",
                b.dev, b.what, b.dev
            ));
        }
        d.problems.extend(self.xfrm_block.why.iter().cloned());
    }

    /// After a successful reconcile: tell zebra what made it into the fast
    /// path (every route's status after a full recompute: what did not fit
    /// may have changed anywhere).
    fn fpm_report(&mut self, fpm: &mut Option<crate::fpm::Server>) {
        if let Some(f) = fpm {
            let full = std::mem::replace(&mut self.fpm_reported_full, self.ops.reconciles_full) != self.ops.reconciles_full;
            // The maps as they are now (what readers see may lag them).
            f.report(&crate::fpm::InFib { tables: self.reconciler.applied(), offload: self.published.offload() }, full);
            self.route_source = Some(Arc::new(f.published()));
        }
    }

    fn log_problems(&mut self, d: &Desired) {
        let now: BTreeSet<String> = d.problems.iter().cloned().collect();
        for p in now.difference(&self.problems) {
            error!("{p}");
        }
        for p in self.problems.difference(&now) {
            info!("resolved: {p}");
        }
        self.problems = now;
    }

    /// Ports whose device went away leave the set; a device created again
    /// under a configured name joins it, as a reload would change the set.
    /// A device moved to another network namespace has gone away too, but
    /// the kernel keeps its XDP link (and the program on it) over the move:
    /// it is detached here, so that the namespace it went to gets it without
    /// our program, and a move back adopts it afresh. True when the set
    /// changed.
    fn follow_devices(&mut self, mut set: ifset::Attached<'_>, state: &KernelState) -> bool {
        let defunct: Vec<String> = set
            .attachments
            .iter()
            .filter(|a| a.defunct() || !state.links.contains_key(&a.ifindex))
            .map(|a| a.name.clone())
            .collect();
        let mut changed = false;
        if !defunct.is_empty() {
            let names: Vec<String> = self.existing(state).into_iter().filter(|n| !defunct.contains(n)).collect();
            let Some(c) = self.change_set(&mut set, &names) else { return false };
            changed = c;
        }
        // After the removal: a device created again with its old ifindex
        // is one we no longer manage now.
        if let Some(names) = self.recreated(state, set.ifaces) {
            changed |= self.change_set(&mut set, &names).unwrap_or(false);
        }
        changed
    }

    /// `set.change(names)`: whether the set changed, None (logged once per
    /// reason) if refused.
    fn change_set(&mut self, set: &mut ifset::Attached<'_>, names: &[String]) -> Option<bool> {
        match set.change(names, &self.writer.taken_slots()) {
            Ok(plan) => {
                self.readopt_refused = None;
                if plan.is_some() {
                    self.manage(set.ifaces);
                }
                Some(plan.is_some())
            }
            Err(reload::Refusal::Invalid(why) | reload::Refusal::Restart(why)) => {
                if self.readopt_refused.as_deref() != Some(why.as_str()) {
                    warn!("a managed interface went away or came back, and the interface set cannot follow: {why}; retrying every second");
                    self.readopt_refused = Some(why);
                }
                None
            }
        }
    }

    /// The configured interface names that name a device now.
    fn existing(&self, state: &KernelState) -> Vec<String> {
        self.configured.iter().filter(|n| state.links.values().any(|l| &l.name == *n)).cloned().collect()
    }

    /// When a configured name names a device we do not manage (one deleted
    /// and created again: a hot-plugged NIC, a recreated veth), the set to
    /// manage: the configured names that exist now. Those still missing
    /// stay out until they exist.
    fn recreated(&self, state: &KernelState, ifaces: &[Iface]) -> Option<Vec<String>> {
        let managed = |name: &str, ifindex: u32| ifaces.iter().any(|i| i.name == name && i.ifindex == ifindex);
        let back = state.links.values().any(|l| self.configured.contains(&l.name) && !managed(&l.name, l.ifindex));
        back.then(|| self.existing(state))
    }

    fn note_deleted(&mut self, state: &KernelState, ifaces: &[Iface]) {
        for i in ifaces {
            if !state.links.contains_key(&i.ifindex) && self.gone.insert(i.ifindex) {
                warn!(
                    "managed interface {} (ifindex {}) was deleted or left the network namespace; its entries are dropped, still running",
                    i.name, i.ifindex
                );
            }
        }
    }

    fn publish(&self, shared: &Shared, state: &KernelState, mirror: &Mirror, ifaces: &[Iface], att: &[Attachment]) {
        let infos = ifaces.iter().map(|i| iface_info(i, state, self.published.tables(), att)).collect();
        let snap = Snapshot {
            generation: self.reconciler.generation(),
            netlink_resyncs: mirror.resyncs(),
            neigh_keepalives: self.keepalives,
            ifaces: infos,
            applied: Arc::clone(self.published.tables()),
            caps: Some(self.caps),
            problems: self.problems.iter().cloned().collect(),
            dev_names: state.links.iter().map(|(k, l)| (*k, l.name.clone())).collect(),
            flow_timeout: self.flow_timeout,
            flow_entries: self.flow_entries,
            flow_key_addrs: self.flow_key_addrs,
            ops: self.ops.clone(),
            ct: self.ct_status,
            route_source: self.route_source.clone(),
            afxdp: self.afxdp.clone(),
            admission: self.admission.as_ref().map(|a| a.status()),
            fib4_dir24: self.writer.fib4_dir_usage(),
            fib6_multibit: self.writer.fib6_dir_usage(),
            device: self.admission.as_ref().filter(|a| a.kind() == fastpath_core::resources::TargetKind::SimAsic).map(|a| {
                crate::api::Device { target: Arc::clone(a.target()), model: Arc::clone(a.model()) }
            }),
        };
        match shared.lock() {
            Ok(mut g) => *g = Arc::new(snap),
            Err(p) => *p.into_inner() = Arc::new(snap),
        }
    }
}

/// What `status` shows for one interface: the flags fastpath wrote when it
/// has an entry (that is what the data path acts on), the kernel's view otherwise.
fn iface_info(i: &Iface, state: &KernelState, applied: &Desired, att: &[Attachment]) -> IfaceInfo {
    let link = state.links.get(&i.ifindex);
    let sys = state.if_sysctl.get(&i.ifindex);
    let a = att.iter().find(|a| a.ifindex == i.ifindex);
    let mode = a.map(|a| a.mode.name()).unwrap_or("none");
    let hash_variant = a.map(|a| a.hash.name()).unwrap_or("none");
    let (up, fwd4, fwd6, rp_filter) = match applied.ifaces.get(&i.ifindex) {
        Some(e) => {
            let f = e.flags as u32;
            let rpf = if f & intf::FP_IF_RPF_STRICT != 0 {
                1
            } else if f & intf::FP_IF_RPF_LOOSE != 0 {
                2
            } else {
                0
            };
            (f & intf::FP_IF_UP != 0, f & intf::FP_IF_FWD4 != 0, f & intf::FP_IF_FWD6 != 0, rpf)
        }
        None => (
            link.is_some_and(|l| l.admin_up && l.running),
            sys.is_some_and(|s| s.forwarding4),
            sys.is_some_and(|s| s.forwarding6),
            sys.map(|s| s.rp_filter).unwrap_or(0),
        ),
    };
    IfaceInfo {
        name: i.name.clone(),
        ifindex: i.ifindex,
        slot: i.slot,
        xdp_mode: mode,
        mac: link.and_then(|l| l.mac),
        mtu: link.map(|l| l.mtu).unwrap_or(0),
        up,
        fwd4,
        fwd6,
        rp_filter,
        hash_variant,
    }
}
