//! The resource manager: target accounting and each reservation model's
//! answers and device accesses (no root, no kernel).

use std::sync::Arc;

use fastpath_core::model::Family;
use fastpath_core::resources::bpf_target::FIB4;
use fastpath_core::resources::{
    asic, new_model, view, AsicConfig, BpfTarget, BpfUsage, Denied, Entry, ModelKind, SimAsic, Target, Usage,
};
use fastpath_core::tables::{Capacities, Desired, RouteAction, RouteEntry};

fn asic(lpm: u64, hash: u64) -> Arc<SimAsic> {
    Arc::new(SimAsic::new(AsicConfig { lpm_units: lpm, hash_units: hash, ..AsicConfig::default() }.instant()))
}

#[test]
fn asic_costs_follow_the_prefix_kind() {
    let a = asic(100, 100);
    let c = |e| a.cost(&e).unwrap();
    assert_eq!((c(Entry::route4(24)).pool, c(Entry::route4(24)).units), (asic::LPM, 1));
    assert_eq!((c(Entry::route4(32)).pool, c(Entry::route4(32)).units), (asic::HASH, 1));
    assert_eq!((c(Entry::route6(64)).pool, c(Entry::route6(64)).units), (asic::LPM, 2));
    assert_eq!((c(Entry::route6(96)).pool, c(Entry::route6(96)).units), (asic::LPM, 4));
    assert_eq!((c(Entry::route6(128)).pool, c(Entry::route6(128)).units), (asic::HASH, 2));
    assert_eq!(c(Entry::Neighbour { family: Family::V6 }).pool, asic::HASH);
    assert!(matches!(a.cost(&Entry::route4(33)), Err(Denied::Unsupported { .. })));
}

#[test]
fn host_routes_and_neighbours_share_the_hash_memory() {
    let a = asic(100, 10);
    let m = new_model(&ModelKind::Lockstep, a.clone());
    for _ in 0..4 {
        m.admit(&Entry::route6(128)).unwrap(); // 2 units each
    }
    // 2 units left: two IPv4 neighbours, not three.
    m.admit(&Entry::Neighbour { family: Family::V4 }).unwrap();
    m.admit(&Entry::Neighbour { family: Family::V4 }).unwrap();
    let err = m.admit(&Entry::Neighbour { family: Family::V4 }).unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(err.to_string().contains("hash") && err.to_string().contains("ENOSPC"), "{err}");
    // ... while the LPM memory is untouched.
    m.admit(&Entry::route4(24)).unwrap();
}

/// Admits `n` cost-1 entries one by one, committing each; returns how many got in.
fn fill(kind: &ModelKind, target: Arc<dyn Target>, n: usize) -> (usize, fastpath_core::resources::models::Stats) {
    let m = new_model(kind, target);
    let mut ok = 0;
    for _ in 0..n {
        if m.admit(&Entry::route4(24)).is_ok() {
            m.commit(&Entry::route4(24)).unwrap();
            ok += 1;
        }
    }
    (ok, m.stats())
}

#[test]
fn every_model_admits_exactly_what_fits() {
    for kind in ModelKind::all_default() {
        let a = asic(50, 10);
        let (ok, _) = fill(&kind, a.clone(), 80);
        // Flat gives IPv4 a third of the LPM memory (three kinds share it).
        let want = if kind == (ModelKind::Predictive { flat: true }) { 50 / 3 } else { 50 };
        assert_eq!(ok, want, "{kind:?}");
        let u = a.query()[asic::LPM];
        assert_eq!(u, Usage { capacity: 50, used: want as u64, reserved: 0 }, "{kind:?}: model dropped, nothing left reserved");
    }
}

#[test]
fn device_accesses_on_the_admit_path() {
    let big = || asic(10_000, 10);
    assert_eq!(fill(&ModelKind::Lockstep, big(), 100).1.inline_accesses, 100);
    assert_eq!(fill(&ModelKind::Prefetch { n: 16 }, big(), 100).1.inline_accesses, 7);
    assert_eq!(fill(&ModelKind::Predictive { flat: false }, big(), 100).1.inline_accesses, 0);
    // The first bucket is filled before the first admission and holds
    // more than 100 entries: no admission touches the device.
    let s = fill(&"credit:256".parse().unwrap(), big(), 100).1;
    assert_eq!(s.inline_accesses, 0, "{s:?}");
}

#[test]
fn credit_bucket_shrinks_as_the_pool_fills() {
    let a = asic(1000, 10);
    let m = fastpath_core::resources::models::Credit::new(a.clone(), Default::default());
    let first = m.credit()[asic::LPM];
    assert_eq!(first, 1000 / 8, "an empty pool gets a big bucket");
    use fastpath_core::resources::Model;
    for _ in 0..900 {
        m.admit(&Entry::route4(24)).unwrap();
        m.commit(&Entry::route4(24)).unwrap();
    }
    // Let the refill thread re-size.
    std::thread::sleep(std::time::Duration::from_millis(150));
    let late = m.credit()[asic::LPM];
    assert!(late <= 100 / 8 + 1, "bucket {late} with 100 units left");
}

#[test]
fn cancel_gives_the_units_back() {
    for kind in ModelKind::all_default() {
        let a = asic(4, 10);
        let m = new_model(&kind, a.clone());
        let e = Entry::route4(24);
        let n = if kind == (ModelKind::Predictive { flat: true }) { 1 } else { 4 };
        for _ in 0..n {
            m.admit(&e).unwrap();
        }
        assert!(m.admit(&e).is_err(), "{kind:?}");
        m.cancel(&e);
        m.admit(&e).unwrap();
    }
}

#[test]
fn flat_profiles_refuse_what_the_shared_model_fits() {
    let mk = |flat| new_model(&ModelKind::Predictive { flat }, asic(30, 10));
    let (flat, shared) = (mk(true), mk(false));
    // 30 units shared by 3 kinds: flat gives IPv6 /64 10 units = 5 routes.
    let v6 = Entry::route6(64);
    assert_eq!((0..15).filter(|_| flat.admit(&v6).is_ok()).count(), 5);
    assert_eq!((0..15).filter(|_| shared.admit(&v6).is_ok()).count(), 15);
}

#[test]
fn bpf_target_counts_the_applied_tables() {
    let caps = Capacities { fib4: 10, fib6: 5, nexthops: 8, neigh: 4, ifaces: 2, groups: 3, buckets: 16 };
    let mut d = Desired::default();
    for i in 0..7u8 {
        d.fib4.insert(([198, 51, 100, i].into(), 32), RouteEntry { action: RouteAction::Blackhole, mtu: 0 });
    }
    let mut u = BpfUsage::of(&caps, &d);
    u.pools[FIB4].reserved = 1;
    let t: Arc<dyn Target> = Arc::new(BpfTarget::new(u));
    let m = new_model(&ModelKind::Predictive { flat: false }, t.clone());
    m.admit(&Entry::route4(24)).unwrap();
    m.admit(&Entry::route4(24)).unwrap();
    let err = m.admit(&Entry::route4(24)).unwrap_err();
    assert!(err.to_string().contains("fib4"), "{err}");
    let v = view(t.as_ref(), m.name(), &m.held());
    let fib4 = &v.resources[FIB4];
    assert_eq!((fib4.name.as_str(), fib4.size, fib4.used, fib4.reserved), ("fib4", 10, Some(7), 3));
    assert_eq!(fib4.unit, "entries");
    assert_eq!(v.resources[2].size, 7, "next-hop id 0 is never used");
}

#[test]
fn asic_view_lists_costs_of_shared_pools() {
    let a = asic(100, 10);
    let v = view(a.as_ref(), "lockstep", &[]);
    let lpm = &v.resources[asic::LPM];
    assert_eq!(lpm.unit, "units");
    assert_eq!(lpm.costs.get("ipv6_64"), Some(&2));
    assert_eq!(lpm.costs.get("ipv6_128"), Some(&4));
}

#[test]
fn model_names_parse() {
    assert_eq!("prefetch:8".parse::<ModelKind>(), Ok(ModelKind::Prefetch { n: 8 }));
    assert_eq!("predictive-flat".parse::<ModelKind>(), Ok(ModelKind::Predictive { flat: true }));
    assert!("credit:0".parse::<ModelKind>().is_err());
    assert!("bogus".parse::<ModelKind>().is_err());
}

#[test]
fn simulation_shows_where_each_model_waits() {
    use fastpath_core::resources::simulate::{ipv4_routes, run};
    let cfg = AsicConfig { lpm_units: 100, ..AsicConfig::default() }.instant();
    let routes = ipv4_routes(120);
    for kind in ModelKind::all_default() {
        let r = run(&kind, &cfg, &routes);
        let fits = if kind == (ModelKind::Predictive { flat: true }) { 33 } else { 100 };
        assert_eq!((r.admitted, r.refused), (fits, 120 - fits), "{kind:?}");
        assert!(r.written >= r.answered);
    }
}
