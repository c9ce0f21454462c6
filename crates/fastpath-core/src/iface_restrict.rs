//! Interface entries written ahead of a full recompute. A managed link that
//! goes down (admin or carrier), goes away, stops forwarding or shrinks its
//! MTU makes the kernel flush or re-mark its routes without a message each,
//! so the mirror re-dumps every route and the daemon recomputes every table:
//! seconds with a full table, during which the data path would go on
//! redirecting cached flows into a dead port or past the new MTU. Whatever
//! the recompute finds, it cannot give the data path more than the
//! interface's new state allows, so taking that permission away first is
//! always safe: `restrictions` gives the entries with the lost flags
//! cleared (IPv6 turned off on the link: its V6_OFF set), the MTUs lowered
//! and a stricter rp_filter in force (each level
//! refuses every source the one below does, and the check reads only the
//! FIB, which such a change leaves as it is), which the daemon writes (and
//! bumps the generation, so cached flows go back through the checks) before
//! the re-dump or recompute. Anything that widens permission (a link coming
//! up, a larger MTU, a looser rp_filter) waits for the recompute. A new
//! MAC address goes ahead too: from the change on, the kernel drops frames
//! sent to the old one and sends from the new one, and the data path
//! should do neither otherwise.
//!
//! An ip rule added, or a managed interface enslaved to a VRF, is the same
//! kind of change for a whole family: the kernel stops looking up the main
//! table for (some of) its packets, and the recompute will punt the family
//! (`policy_punts` gives the switches that do it at once).

use std::collections::BTreeMap;

use crate::desired::{self, if_flags};
use crate::model::KernelState;
use crate::tables::{IfaceEntry, Switches};

/// Flags that allow forwarding: clearing one only ever punts more.
const PERMISSIONS: u16 = if_flags::UP | if_flags::FWD4 | if_flags::FWD6;
/// Flags from kernel state that forbid: setting one only ever punts more.
const DENIALS: u16 = if_flags::V6_OFF;
const RPF: u16 = if_flags::RPF_STRICT | if_flags::RPF_LOOSE;

/// rp_filter off < loose < strict.
fn rpf_level(flags: u16) -> u8 {
    if flags & if_flags::RPF_STRICT != 0 {
        2
    } else if flags & if_flags::RPF_LOOSE != 0 {
        1
    } else {
        0
    }
}

/// The switches with the families `state` punts for policy reasons added
/// (non-default ip rules, a managed interface enslaved to a VRF: the
/// kernel no longer looks the main table up), when `applied` lacks any of
/// them; None otherwise. Bits only ever added here: their removal waits.
pub fn policy_punts(applied: &Switches, state: &KernelState, managed: &BTreeMap<u32, u32>) -> Option<Switches> {
    let (bits, _) = desired::policy_punts(state, managed);
    (bits & !applied.policy_punt != 0).then_some(Switches { policy_punt: applied.policy_punt | bits, ..*applied })
}

/// The interface entries of `links`, whose carrier came back and which the
/// mirror found changed nothing else (`mirror::carrier_back_only`): what
/// `desired` computes for them, for those `applied` holds. Giving UP back
/// is then all the full recompute would write.
pub fn carrier_back(applied: &BTreeMap<u32, IfaceEntry>, state: &KernelState, links: &[u32]) -> Vec<(u32, IfaceEntry)> {
    links
        .iter()
        .filter_map(|i| {
            let old = applied.get(i)?;
            // The tc and veth peer marks are the daemon's, not the kernel state's: kept.
            desired::iface_entry(state, *i, old.slot).map(|mut e| {
                e.flags |= old.flags & if_flags::WATCHED;
                (*i, e)
            })
        })
        .collect()
}

/// Entries of `applied` (ifindex -> entry, as in `Desired::ifaces`) that
/// `state` takes permission from, restricted to what both allow: a lost
/// UP/FWD4/FWD6 cleared, a new V6_OFF set, each MTU at the lower of the
/// two, the stricter rp_filter; and the link's MAC address as it is now.
/// Everything else of an entry stays as applied.
pub fn restrictions(applied: &BTreeMap<u32, IfaceEntry>, state: &KernelState) -> Vec<(u32, IfaceEntry)> {
    applied
        .iter()
        .filter_map(|(ifindex, old)| {
            let now = desired::iface_entry(state, *ifindex, old.slot);
            let mut e = old.clone();
            match &now {
                Some(n) => {
                    e.mac = n.mac;
                    e.flags &= !(PERMISSIONS & !n.flags);
                    e.flags |= n.flags & DENIALS;
                    e.mtu = e.mtu.min(n.mtu);
                    e.mtu6 = e.mtu6.min(n.mtu6);
                    if rpf_level(n.flags) > rpf_level(e.flags) {
                        e.flags = (e.flags & !RPF) | (n.flags & RPF);
                    }
                }
                // Gone (or no Ethernet address any more): nothing goes out there.
                None => e.flags &= !PERMISSIONS,
            }
            (e != *old).then_some((*ifindex, e))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::fixtures::veth;
    use crate::model::IfSysctl;

    fn state(links: &[(u32, bool, bool, u32)]) -> KernelState {
        let mut st = KernelState::default();
        st.sysctl.forwarding6_all = true;
        for &(i, up, running, mtu) in links {
            let mut l = veth(i, &format!("v{i}"));
            l.admin_up = up;
            l.running = running;
            l.mtu = mtu;
            st.links.insert(i, l);
            st.if_sysctl.insert(i, IfSysctl { forwarding4: true, forwarding6: true, ..Default::default() });
        }
        st
    }

    fn applied(st: &KernelState) -> BTreeMap<u32, IfaceEntry> {
        st.links.keys().map(|&i| (i, desired::iface_entry(st, i, i * 10).unwrap())).collect()
    }

    #[test]
    fn carrier_back_keeps_the_daemons_tc_marks() {
        let down = state(&[(2, true, false, 1500)]);
        let mut a = applied(&down);
        a.get_mut(&2).unwrap().flags |= if_flags::TC_EGRESS;
        let up = state(&[(2, true, true, 1500)]);
        let e = carrier_back(&a, &up, &[2]);
        assert_eq!(e[0].1.flags & if_flags::TC, if_flags::TC_EGRESS);
        assert_ne!(e[0].1.flags & if_flags::UP, 0);
    }

    #[test]
    fn carrier_back_gives_up_back_to_the_links_the_maps_hold() {
        let down = state(&[(2, true, false, 1500), (3, true, false, 1500)]);
        let mut a = applied(&down);
        a.remove(&3); // not managed
        let up = state(&[(2, true, true, 1500), (3, true, true, 1500)]);
        let e = carrier_back(&a, &up, &[2, 3]);
        assert_eq!(e.len(), 1);
        assert_eq!((e[0].0, e[0].1.flags), (2, a[&2].flags | if_flags::UP));
        assert_eq!(e[0].1.slot, a[&2].slot);
        // The reconciler writes just that entry, as the full plan would.
        let before = crate::tables::Desired { ifaces: a, ..Default::default() };
        let d = crate::route_delta::FibDelta { ifaces: e.iter().cloned().collect(), ..Default::default() };
        let mut full = before.clone();
        d.apply_to(&mut full);
        let caps = crate::tables::Capacities { fib4: 8, fib6: 8, nexthops: 8, neigh: 8, ifaces: 8, groups: 8, buckets: 8 };
        let (want, got, _) = crate::fixtures::delta_ops(caps, &before, &full, &d);
        assert_eq!(got, want);
        assert_eq!(got, vec![crate::tables::Op::UpsertIface(2, e[0].1.clone()), crate::tables::Op::BumpGeneration]);
    }

    #[test]
    fn down_gone_and_smaller_mtu_restrict_the_rest_waits() {
        let before = state(&[(2, true, true, 1500), (3, true, true, 1500), (4, true, true, 1500), (5, false, false, 1500)]);
        let a = applied(&before);
        assert!(a[&2].flags & if_flags::UP != 0 && a[&5].flags & if_flags::UP == 0);

        // 2 loses carrier, 3 goes away, 4 shrinks its MTU, 5 comes up (waits).
        let mut after = state(&[(2, true, false, 1500), (4, true, true, 1400), (5, true, true, 9000)]);
        after.if_sysctl.get_mut(&4).unwrap().mtu6 = 1280;
        let r: BTreeMap<_, _> = restrictions(&a, &after).into_iter().collect();
        assert_eq!(r.keys().copied().collect::<Vec<_>>(), vec![2, 3, 4]);
        assert_eq!(r[&2].flags, a[&2].flags & !if_flags::UP);
        assert_eq!(r[&3].flags & PERMISSIONS, 0);
        assert_eq!((r[&4].flags, r[&4].mtu, r[&4].mtu6), (a[&4].flags, 1400, 1280));
        for (i, e) in &r {
            assert_eq!((e.mac, e.slot), (a[i].mac, a[i].slot));
        }
        // Nothing changed: nothing to write.
        assert!(restrictions(&a, &before).is_empty());
    }

    #[test]
    fn a_new_mac_address_is_written_ahead() {
        let before = state(&[(2, true, true, 1500), (3, true, true, 1500)]);
        let a = applied(&before);
        let mut after = before.clone();
        let new = [2, 0, 0, 0, 0x99, 0x99];
        after.links.get_mut(&2).unwrap().mac = Some(new);
        let r = restrictions(&a, &after);
        assert_eq!(r, vec![(2, IfaceEntry { mac: new, ..a[&2].clone() })]);
    }

    #[test]
    fn ipv6_turned_off_is_written_ahead_and_turned_on_waits() {
        let before = state(&[(2, true, true, 1500)]);
        let a = applied(&before);
        let mut off = before.clone();
        off.if_sysctl.get_mut(&2).unwrap().disable_ipv6 = true;
        let r = restrictions(&a, &off);
        assert_eq!(r.len(), 1);
        // FWD6 goes with it: IPv6 neither in nor out.
        assert_eq!(r[0].1.flags, (a[&2].flags | if_flags::V6_OFF) & !if_flags::FWD6);
        let turned_off = applied(&off);
        assert!(restrictions(&turned_off, &before).is_empty());
    }

    #[test]
    fn forwarding_off_clears_its_family_only() {
        let before = state(&[(2, true, true, 1500)]);
        let a = applied(&before);
        let mut after = before.clone();
        after.if_sysctl.get_mut(&2).unwrap().forwarding4 = false;
        let r = restrictions(&a, &after);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].1.flags, a[&2].flags & !if_flags::FWD4);
        // rp_filter stricter: written ahead; looser: waits.
        let mut rpf = before.clone();
        for (level, flag) in [(2, if_flags::RPF_LOOSE), (1, if_flags::RPF_STRICT)] {
            rpf.if_sysctl.get_mut(&2).unwrap().rp_filter = level;
            let r = restrictions(&a, &rpf);
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].1.flags, a[&2].flags | flag);
        }
        let mut strict = a.clone();
        strict.get_mut(&2).unwrap().flags |= if_flags::RPF_STRICT;
        rpf.if_sysctl.get_mut(&2).unwrap().rp_filter = 2;
        assert!(restrictions(&strict, &rpf).is_empty());
        rpf.if_sysctl.get_mut(&2).unwrap().rp_filter = 0;
        assert!(restrictions(&strict, &rpf).is_empty());
    }

    #[test]
    fn a_new_rule_or_vrf_punts_the_family_ahead_and_its_removal_waits() {
        use crate::fixtures::{default_rules, plain_rule};
        use crate::model::Family;

        let mut st = state(&[(2, true, true, 1500), (3, true, true, 1500)]);
        st.rules = default_rules();
        let managed: BTreeMap<u32, u32> = [(2, 1), (3, 2)].into();
        let none = Switches::default();
        assert_eq!(policy_punts(&none, &st, &managed), None);

        // `ip rule add ... table 100`: IPv4 is no longer main-table only.
        let mut ruled = st.clone();
        ruled.rules.push(plain_rule(Family::V4, 100, 100));
        let s = policy_punts(&none, &ruled, &managed).expect("a new rule punts");
        assert_eq!(s.policy_punt, Family::V4.bit());
        // Other switches stay as applied; bits already punted write nothing.
        let applied = Switches { src_lpm: 1, mp_seed: 7, ..none };
        assert_eq!(policy_punts(&applied, &ruled, &managed), Some(Switches { policy_punt: Family::V4.bit(), ..applied }));
        let punted = Switches { policy_punt: Family::V4.bit(), ..none };
        assert_eq!(policy_punts(&punted, &ruled, &managed), None);
        // The rule gone again: no write ahead (the recompute lifts the punt).
        assert_eq!(policy_punts(&punted, &st, &managed), None);

        // A managed interface enslaved to a VRF: both families.
        let mut vrf = st.clone();
        let mut master = veth(9, "blue");
        master.kind = Some("vrf".into());
        vrf.links.insert(9, master);
        vrf.links.get_mut(&3).unwrap().master = Some(9);
        assert_eq!(policy_punts(&punted, &vrf, &managed).map(|s| s.policy_punt), Some(Family::V4.bit() | Family::V6.bit()));
    }

    proptest! {
        /// Whatever the change, a restricted entry allows nothing that
        /// either the old entry or the new state's own entry forbids.
        #[test]
        fn never_widens(
            old in proptest::collection::vec((any::<bool>(), any::<bool>(), 1280u32..9000, any::<bool>(), any::<bool>(), 0u8..6), 1..5),
            new in proptest::collection::vec((any::<bool>(), any::<bool>(), 1280u32..9000, any::<bool>(), any::<bool>(), 0u8..6, any::<bool>()), 1..5),
        ) {
            // The last number: rp_filter (mod 3), and disable_ipv6 from 3 up.
            let mk = |v: &[(bool, bool, u32, bool, bool, u8)]| {
                let mut st = state(&v.iter().enumerate().map(|(i, l)| (i as u32 + 2, l.0, l.1, l.2)).collect::<Vec<_>>());
                for (i, l) in v.iter().enumerate() {
                    let s = st.if_sysctl.get_mut(&(i as u32 + 2)).unwrap();
                    s.forwarding4 = l.3;
                    s.forwarding6 = l.4;
                    s.rp_filter = l.5 % 3;
                    s.disable_ipv6 = l.5 >= 3;
                }
                st
            };
            let before = mk(&old);
            let a = applied(&before);
            let mut after = mk(&new.iter().map(|l| (l.0, l.1, l.2, l.3, l.4, l.5)).collect::<Vec<_>>());
            for (i, l) in new.iter().enumerate() {
                if l.6 {
                    after.links.remove(&(i as u32 + 2));
                }
            }
            let r: BTreeMap<_, _> = restrictions(&a, &after).into_iter().collect();
            for (i, old) in &a {
                let got = r.get(i).unwrap_or(old);
                let now = desired::iface_entry(&after, *i, old.slot);
                prop_assert_eq!(got.flags & PERMISSIONS & !old.flags, 0);
                prop_assert_eq!(old.flags & DENIALS & !got.flags, 0);
                prop_assert!(got.mtu <= old.mtu && got.mtu6 <= old.mtu6);
                prop_assert!(rpf_level(got.flags) >= rpf_level(old.flags));
                prop_assert!(got.flags & RPF != RPF, "strict and loose at once");
                match now {
                    Some(n) => {
                        prop_assert_eq!(got.mac, n.mac);
                        prop_assert_eq!(got.flags & PERMISSIONS & !n.flags, 0);
                        prop_assert_eq!(n.flags & DENIALS & !got.flags, 0);
                        prop_assert!(got.mtu <= n.mtu && got.mtu6 <= n.mtu6);
                        prop_assert!(rpf_level(got.flags) >= rpf_level(n.flags));
                    }
                    None => prop_assert_eq!(got.flags & PERMISSIONS, 0),
                }
                // Only what must change is written.
                prop_assert_eq!(r.contains_key(i), got != old);
            }
        }
    }
}
