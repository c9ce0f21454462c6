//! The maps read back into the tables they hold, for a daemon taking over
//! pinned maps from a dead one (see `pin`). Everything the data path acts
//! on is in the maps; only what the old daemon kept for itself is not (the
//! kernel id behind a resilient group): such entries read back slightly
//! different from what `desired` computes and are simply rewritten.

use std::collections::BTreeMap;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use fastpath_bpf::intf::{self, fp_group, fp_iface, fp_lpm4_key, fp_lpm6_key, fp_neigh, fp_nexthop, fp_route, fp_runtime};
use fastpath_core::desired::reason;
use fastpath_core::tables::{
    Desired, GroupEntry, GroupKind, GroupPath, IfaceEntry, NeighEntry, NexthopEntry, RouteAction, RouteEntry, Switches,
};
use libbpf_rs::{MapCore, MapFlags, MapHandle};

use super::{ctx, decode_neigh4_key, decode_neigh6_key, from_bytes, MapResult, Maps};

/// What a dead daemon left in the maps.
pub struct ReadBack {
    /// The tables, as the reconciler's shadow.
    pub tables: Desired,
    /// fp_runtime as it was (generation, switches, clocks).
    pub rt: fp_runtime,
    /// The egress slot each next hop was written with; slots follow the
    /// managed interfaces, which may differ this time.
    pub nh_slots: BTreeMap<u32, u16>,
}

/// Every element of an array map (index, value bytes).
fn array(name: &'static str, m: &MapHandle) -> MapResult<Vec<(u32, Vec<u8>)>> {
    let n = ctx(name, m.info())?.info.max_entries;
    let mut out = Vec::new();
    for i in 0..n {
        if let Some(v) = ctx(name, m.lookup(&i.to_ne_bytes(), MapFlags::ANY))? {
            out.push((i, v));
        }
    }
    Ok(out)
}

/// Every element of a hash or LPM map. An entry deleted between the key
/// walk and its lookup is simply missing.
fn entries(name: &'static str, m: &MapHandle) -> MapResult<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    for k in m.keys() {
        if let Some(v) = ctx(name, m.lookup(&k, MapFlags::ANY))? {
            out.push((k, v));
        }
    }
    Ok(out)
}

fn route_entry(r: &fp_route) -> RouteEntry {
    use intf::fp_route_type as T;
    let t = u32::from(r.type_);
    let action = if t == T::FP_RT_FORWARD as u32 {
        RouteAction::Forward { nh_id: r.nh_id }
    } else if t == T::FP_RT_LOCAL as u32 {
        RouteAction::Local
    } else if t == T::FP_RT_BLACKHOLE as u32 {
        RouteAction::Blackhole
    } else if t == T::FP_RT_UNREACHABLE as u32 {
        RouteAction::Unreachable
    } else if t == T::FP_RT_PROHIBIT as u32 {
        RouteAction::Prohibit
    } else if t == T::FP_RT_PUNT as u32 {
        RouteAction::Punt { reason: r.punt_reason }
    } else if t == T::FP_RT_MULTIPATH as u32 {
        RouteAction::Multipath { group: r.nh_id }
    } else {
        // Not something we write; it differs from any desired entry, so
        // the first reconcile overwrites or deletes it.
        RouteAction::Punt { reason: reason::ROUTE_UNSUPPORTED }
    };
    RouteEntry { action, mtu: r.mtu }
}

fn nexthop_entry(n: &fp_nexthop) -> NexthopEntry {
    let gateway = match u32::from(n.gw_family) {
        f if f == libc::AF_INET as u32 => Some(IpAddr::V4(Ipv4Addr::new(n.gw[0], n.gw[1], n.gw[2], n.gw[3]))),
        f if f == libc::AF_INET6 as u32 => Some(IpAddr::V6(Ipv6Addr::from(n.gw))),
        _ => None,
    };
    NexthopEntry { ifindex: n.ifindex, gateway }
}

fn group_entry(g: &fp_group) -> Option<GroupEntry> {
    let kind = match u32::from(g.kind) {
        k if k == intf::fp_group_kind::FP_GRP_HASH_THRESHOLD => GroupKind::HashThreshold,
        k if k == intf::fp_group_kind::FP_GRP_RESILIENT => GroupKind::Resilient,
        _ => return None,
    };
    let n = usize::from(g.n_paths).min(g.paths.len());
    let paths = g.paths[..n].iter().map(|p| GroupPath { upper_bound: p.upper_bound, nh_id: p.nh_id }).collect();
    Some(GroupEntry { kind, paths, n_buckets: g.n_buckets, origin: 0 })
}

impl Maps {
    /// Reads every table back. Costs one syscall per entry (two for hash
    /// and LPM maps): about a second per million routes.
    pub fn read_back(&self) -> MapResult<ReadBack> {
        let mut t = Desired::default();
        let mut nh_slots = BTreeMap::new();
        for (slot, v) in array("fp_ifaces", &self.ifaces)? {
            let i: fp_iface = from_bytes(&v);
            if i.flags & intf::FP_IF_PRESENT as u16 == 0 {
                continue;
            }
            let flags = i.flags & !(intf::FP_IF_PRESENT as u16);
            t.ifaces.insert(i.ifindex, IfaceEntry { mac: i.mac, flags, mtu: i.mtu, mtu6: i.mtu6, slot });
        }
        for (id, v) in array("fp_nexthops", &self.nexthops)? {
            let n: fp_nexthop = from_bytes(&v);
            // An array cannot delete: ifindex 0 is how a deleted one looks.
            if id == 0 || n.ifindex == 0 {
                continue;
            }
            t.nexthops.insert(id, nexthop_entry(&n));
            nh_slots.insert(id, n.slot);
        }
        for (id, v) in array("fp_groups", &self.groups)? {
            if id == 0 || v.len() < size_of::<fp_group>() {
                continue;
            }
            if let Some(g) = group_entry(&from_bytes(&v)) {
                t.groups.insert(id, g);
            }
        }
        for (k, v) in entries("fp_res_buckets", &self.res_buckets)? {
            t.res_buckets.insert(from_bytes::<u32>(&k), from_bytes::<u32>(&v));
        }
        for (k, v) in entries("fp_neigh4", &self.neigh4)? {
            t.neigh.insert(decode_neigh4_key(&from_bytes(&k)), NeighEntry { mac: from_bytes::<fp_neigh>(&v).mac });
        }
        for (k, v) in entries("fp_neigh6", &self.neigh6)? {
            t.neigh.insert(decode_neigh6_key(&from_bytes(&k)), NeighEntry { mac: from_bytes::<fp_neigh>(&v).mac });
        }
        for (k, v) in entries("fp_fib4", &self.fib4)? {
            let key: fp_lpm4_key = from_bytes(&k);
            let len = key.prefixlen.min(32) as u8;
            t.fib4.insert((Ipv4Addr::from(key.addr.to_ne_bytes()), len), route_entry(&from_bytes(&v)));
        }
        for (k, v) in entries("fp_fib6", &self.fib6)? {
            let key: fp_lpm6_key = from_bytes(&k);
            let len = key.prefixlen.min(128) as u8;
            t.fib6.insert((Ipv6Addr::from(key.addr), len), route_entry(&from_bytes(&v)));
        }
        for (k, v) in entries("fp_src_deny4", &self.src_deny4)? {
            let a: [u8; 4] = from_bytes(&k);
            t.src_deny4.insert(Ipv4Addr::from(a), from_bytes::<u32>(&v) as u8);
        }
        let rt: fp_runtime = from_bytes(&self.read_bss()?);
        t.switches = Switches {
            table_full: rt.table_full,
            policy_punt: rt.policy_punt,
            src_lpm: rt.src_lpm,
            mp_policy4: rt.mp_policy4,
            mp_policy6: rt.mp_policy6,
            mp_fields4: rt.mp_fields4,
            mp_fields6: rt.mp_fields6,
            mp_seed: rt.mp_seed,
        };
        Ok(ReadBack { tables: t, rt, nh_slots })
    }
}
