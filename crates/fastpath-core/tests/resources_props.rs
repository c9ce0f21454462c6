//! Property tests: no reservation model admits more than fits, also with
//! several threads adding at once, and the credit bucket never grants past
//! capacity while its refill thread runs concurrently.

use std::sync::Arc;

use fastpath_core::resources::{asic, new_model, AsicConfig, CreditConfig, Entry, ModelKind, SimAsic, Target};
use proptest::prelude::*;

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        (0u8..=32).prop_map(Entry::route4),
        prop_oneof![Just(48u8), Just(64), Just(96), Just(128)].prop_map(Entry::route6),
        Just(Entry::Neighbour { family: fastpath_core::model::Family::V4 }),
        Just(Entry::Neighbour { family: fastpath_core::model::Family::V6 }),
        Just(Entry::Nexthop),
    ]
}

fn kind() -> impl Strategy<Value = ModelKind> {
    prop_oneof![
        Just(ModelKind::Lockstep),
        (1u64..20).prop_map(|n| ModelKind::Prefetch { n }),
        (1u64..20, 1u64..4, 1u64..8).prop_map(|(max, min, share_div)| ModelKind::Credit(CreditConfig {
            max,
            min,
            share_div,
            period: std::time::Duration::from_millis(1),
            ..CreditConfig::default()
        })),
        any::<bool>().prop_map(|flat| ModelKind::Predictive { flat }),
    ]
}

/// Runs `entries` split over `threads` threads; returns the units admitted per pool.
fn run(kind: &ModelKind, target: Arc<SimAsic>, entries: &[Entry], threads: usize) -> Vec<u64> {
    let model = new_model(kind, target.clone());
    let admitted = std::sync::Mutex::new(vec![0u64; 3]);
    std::thread::scope(|s| {
        for chunk in entries.chunks(entries.len().div_ceil(threads).max(1)) {
            let (model, admitted, target) = (&model, &admitted, &target);
            s.spawn(move || {
                for e in chunk {
                    if model.admit(e).is_ok() {
                        model.commit(e).expect("an admitted entry must be writable");
                        let c = target.cost(e).unwrap();
                        admitted.lock().unwrap()[c.pool] += c.units;
                    }
                }
            });
        }
    });
    drop(model);
    admitted.into_inner().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn no_model_admits_more_than_fits(
        kind in kind(),
        hash in 1u64..60, lpm in 1u64..60, adj in 1u64..20,
        entries in prop::collection::vec(entry(), 1..200),
        threads in 1usize..5,
    ) {
        let cfg = AsicConfig { hash_units: hash, lpm_units: lpm, adj_entries: adj, ..AsicConfig::default() }.instant();
        let target = Arc::new(SimAsic::new(cfg));
        let admitted = run(&kind, target.clone(), &entries, threads);
        let usage = target.query();
        for (pool, cap) in [(asic::HASH, hash), (asic::LPM, lpm), (asic::ADJ, adj)] {
            prop_assert!(admitted[pool] <= cap, "{kind:?}: pool {pool} admitted {} > {cap}", admitted[pool]);
            prop_assert_eq!(usage[pool].used, admitted[pool], "written = admitted");
            prop_assert_eq!(usage[pool].reserved, 0, "the model gave its credit back");
        }
    }

    /// Cost-1 entries from concurrent threads: the credit bucket grants
    /// exactly what fits: never more, and no false refusals either.
    #[test]
    fn credit_bucket_is_exact_under_concurrent_adds(
        cap in 1u64..300, n in 1usize..400, threads in 1usize..6,
        max in 1u64..64, share_div in 1u64..8,
    ) {
        let cfg = AsicConfig { lpm_units: cap, ..AsicConfig::default() }.instant();
        let target = Arc::new(SimAsic::new(cfg));
        let kind = ModelKind::Credit(CreditConfig { max, share_div, period: std::time::Duration::from_millis(1), ..CreditConfig::default() });
        let admitted = run(&kind, target, &vec![Entry::route4(24); n], threads);
        prop_assert_eq!(admitted[asic::LPM], cap.min(n as u64));
    }
}
