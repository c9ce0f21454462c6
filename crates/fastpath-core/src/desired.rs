//! Kernel state -> the tables fastpath should hold.
//!
//! The kernel is the oracle. Every FIB entry says what the kernel would do
//! with a packet to that destination; wherever that cannot be known from the
//! mirrored state, the entry punts. A punt costs speed, a wrong forward costs
//! correctness, so every doubt below resolves to a punt.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::overflow;
use crate::resources::Admission;
use crate::model::{
    Family, KernelState, NextHop, Route, RouteKind, RouteTarget, Rule, NUD_USABLE, RT_TABLE_LOCAL,
    RT_TABLE_MAIN,
};
use crate::tables::{
    bucket_key, Capacities, Desired, GroupEntry, GroupKind, GroupPath, IfaceEntry, NeighEntry,
    NeighKey, NexthopEntry, RouteAction, RouteEntry,
};

/// The `enum fp_reason` values this crate writes into punt routes. The crate
/// must not depend on the BPF crate, so they are repeated here; a unit test
/// checks each one against bpf/include/fastpath.h so they cannot drift.
pub mod reason {
    pub const MULTICAST: u8 = 4;
    pub const MARTIAN: u8 = 11;
    pub const RP_FILTER: u8 = 13;
    pub const POLICY_ROUTING: u8 = 14;
    pub const TABLE_FULL: u8 = 15;
    pub const LOCAL: u8 = 16;
    pub const NO_ROUTE: u8 = 17;
    pub const BLACKHOLE: u8 = 18;
    pub const UNREACHABLE: u8 = 19;
    pub const PROHIBIT: u8 = 20;
    pub const ROUTE_UNSUPPORTED: u8 = 21;
    pub const ECMP: u8 = 22;

    /// (C enumerator, value) of every constant above, for the drift test.
    pub const ALL: &[(&str, u8)] = &[
        ("FP_R_MULTICAST", MULTICAST),
        ("FP_R_MARTIAN", MARTIAN),
        ("FP_R_RP_FILTER", RP_FILTER),
        ("FP_R_POLICY_ROUTING", POLICY_ROUTING),
        ("FP_R_TABLE_FULL", TABLE_FULL),
        ("FP_R_LOCAL", LOCAL),
        ("FP_R_NO_ROUTE", NO_ROUTE),
        ("FP_R_BLACKHOLE", BLACKHOLE),
        ("FP_R_UNREACHABLE", UNREACHABLE),
        ("FP_R_PROHIBIT", PROHIBIT),
        ("FP_R_ROUTE_UNSUPPORTED", ROUTE_UNSUPPORTED),
        ("FP_R_ECMP", ECMP),
    ];
}

/// FP_IF_* bits of `fp_iface.flags` (checked against fastpath.h by a test).
pub mod if_flags {
    pub const UP: u16 = 1 << 0;
    pub const FWD4: u16 = 1 << 1;
    pub const FWD6: u16 = 1 << 2;
    pub const RPF_STRICT: u16 = 1 << 3;
    pub const RPF_LOOSE: u16 = 1 << 4;
    /// tc policy on the port (set by the daemon's tc watch, not from kernel state).
    pub const TC_INGRESS: u16 = 1 << 6;
    pub const TC_EGRESS: u16 = 1 << 7;
    pub const TC: u16 = TC_INGRESS | TC_EGRESS;
    /// A veth whose peer cannot receive XDP frames (set by the daemon's veth peer watch).
    pub const PEER_NO_XDP: u16 = 1 << 8;
    /// The bits the daemon's watchers set, not derived from kernel link state.
    pub const WATCHED: u16 = TC | PEER_NO_XDP;
    /// Lost its last IPv4 address: written ahead of the re-dump (the
    /// kernel flushes its IPv4 routes unannounced), never computed, so the
    /// recompute after the re-dump clears it.
    pub const V4_FLUSH: u16 = 1 << 9;
    /// net.ipv6.conf.<dev>.disable_ipv6: the kernel drops IPv6 leaving by
    /// it (ip6_output). Unlike the bits above, one that forbids.
    pub const V6_OFF: u16 = 1 << 10;

    pub const ALL: &[(&str, u16)] = &[
        ("FP_IF_UP", UP),
        ("FP_IF_FWD4", FWD4),
        ("FP_IF_FWD6", FWD6),
        ("FP_IF_RPF_STRICT", RPF_STRICT),
        ("FP_IF_RPF_LOOSE", RPF_LOOSE),
        ("FP_IF_TC_INGRESS", TC_INGRESS),
        ("FP_IF_TC_EGRESS", TC_EGRESS),
        ("FP_IF_PEER_NO_XDP", PEER_NO_XDP),
        ("FP_IF_V4_FLUSH", V4_FLUSH),
        ("FP_IF_V6_OFF", V6_OFF),
    ];
}

/// rtnh_flags / nhm_flags bits that make the kernel skip a next hop.
const RTNH_F_DEAD: u32 = 1;
const RTNH_F_LINKDOWN: u32 = 16;

/// FR_ACT_TO_TBL
const FR_ACT_TO_TBL: u8 = 1;

/// FP_GROUP_MAX_PATHS (checked against fastpath.h by a test).
pub const FP_GROUP_MAX_PATHS: usize = 64;

/// Stable ids for table entries (next hops, ECMP groups): content-addressed,
/// never re-pointed while a written route may still reference them.
///
/// An id stays reserved for its entry as long as the last `compute` wanted
/// it or the applied tables hold it; only `release_unused` frees ids. The
/// daemon calls it with the reconciler's shadow after each apply.
#[derive(Debug)]
pub struct IdAlloc<E> {
    capacity: u32,
    /// Every reserved id and the entry it stands for.
    by_id: BTreeMap<u32, E>,
    /// The id an entry gets when a route wants it.
    by_entry: BTreeMap<E, u32>,
    /// Ids the last `compute` put into the desired table.
    wanted: BTreeSet<u32>,
    /// The last `compute` found no free id for some entry.
    starved: bool,
    /// Some entry may own several ids (only through adoption); until then
    /// releasing an id needs no search for another one.
    shared_entries: bool,
}

impl<E> Default for IdAlloc<E> {
    fn default() -> Self {
        IdAlloc {
            capacity: 0,
            by_id: BTreeMap::new(),
            by_entry: BTreeMap::new(),
            wanted: BTreeSet::new(),
            starved: false,
            shared_entries: false,
        }
    }
}

/// Next-hop ids (fp_nexthops index).
pub type NexthopIds = IdAlloc<NexthopEntry>;
/// ECMP group ids (fp_groups index).
pub type GroupIds = IdAlloc<GroupEntry>;

impl<E: Ord + Clone + std::fmt::Debug> IdAlloc<E> {
    /// Ids come from 1..capacity (0 is never used: the data plane treats it as "none").
    pub fn new(capacity: u32) -> Self {
        IdAlloc {
            capacity,
            ..Default::default()
        }
    }

    /// Forget ids that are neither in `desired` nor in the `applied` tables.
    pub fn release_unused(&mut self, applied: &BTreeMap<u32, E>) {
        // Ids in the maps we did not hand out (a reconciler older than this
        // allocator): adopt them so they are never handed to something else.
        for (id, entry) in applied {
            match self.by_id.get(id) {
                None => {
                    self.by_id.insert(*id, entry.clone());
                    if *self.by_entry.entry(entry.clone()).or_insert(*id) != *id {
                        self.shared_entries = true;
                    }
                }
                Some(mine) if mine != entry => {
                    log::error!("id {id} holds {entry:?} in the maps but is allocated to {mine:?}");
                }
                Some(_) => {}
            }
        }
        let gone: Vec<u32> = self
            .by_id
            .keys()
            .filter(|id| !self.wanted.contains(id) && !applied.contains_key(id))
            .copied()
            .collect();
        for id in gone {
            let Some(entry) = self.by_id.remove(&id) else {
                continue;
            };
            if self.by_entry.get(&entry) == Some(&id) {
                self.by_entry.remove(&entry);
                // Another reserved id for the same entry (adopted) can serve it.
                if self.shared_entries {
                    if let Some((other, _)) = self.by_id.iter().find(|(_, e)| **e == entry) {
                        self.by_entry.insert(entry, *other);
                    }
                }
            }
        }
    }

    /// Ids reserved (wanted or still in the maps).
    pub fn reserved(&self) -> usize {
        self.by_id.len()
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// True if the last `compute` had to punt routes for lack of a free id.
    /// Ids held only by the maps come free after the next apply and
    /// `release_unused`; the daemon should then compute again.
    pub fn starved(&self) -> bool {
        self.starved
    }

    /// The id `assign` gives `e` while it stays reserved.
    pub(crate) fn id_of(&self, e: &E) -> Option<u32> {
        self.by_entry.get(e).copied()
    }

    /// The lowest id above `after` that `assign` could hand out, below
    /// `cap` as well as the allocator's capacity.
    pub(crate) fn free_after(&self, after: u32, cap: u32) -> Option<u32> {
        let end = self.capacity.min(cap);
        (after + 1..end).find(|id| !self.by_id.contains_key(id))
    }

    /// Takes `id` for `e`, as `assign` would have: a delta wrote it
    /// (`route_delta`), and the next full compute must give it the same id.
    pub fn reserve(&mut self, id: u32, e: E) {
        if let Some(old) = self.by_id.insert(id, e.clone()) {
            if self.by_entry.get(&old) == Some(&id) {
                self.by_entry.remove(&old);
            }
        }
        self.by_entry.insert(e, id);
        self.wanted.insert(id);
    }

    /// Ids for `entries`, reusing reserved ones; entries missing from the
    /// result found no free id.
    fn assign(&mut self, entries: &BTreeSet<E>) -> BTreeMap<E, u32> {
        let mut out = BTreeMap::new();
        let mut fresh = Vec::new();
        for e in entries {
            match self.by_entry.get(e) {
                Some(id) => {
                    out.insert(e.clone(), *id);
                }
                None => fresh.push(e),
            }
        }
        self.starved = false;
        let mut cursor = 1u32;
        for e in fresh {
            while cursor < self.capacity && self.by_id.contains_key(&cursor) {
                cursor += 1;
            }
            if cursor >= self.capacity {
                self.starved = true;
                break;
            }
            self.by_id.insert(cursor, e.clone());
            self.by_entry.insert(e.clone(), cursor);
            out.insert(e.clone(), cursor);
            cursor += 1;
        }
        self.wanted = out.values().copied().collect();
        out
    }
}

/// The group ids fp_res_buckets keys can hold: (group << 16) | bucket.
const MAX_GROUP_IDS: u32 = 1 << 16;

/// Every id allocator `compute` needs.
#[derive(Debug, Default)]
pub struct Ids {
    pub nexthops: NexthopIds,
    pub groups: GroupIds,
}

impl Ids {
    /// `nexthops`, `groups`: the map sizes (ids 1..size).
    pub fn new(nexthops: u32, groups: u32) -> Ids {
        Ids {
            nexthops: NexthopIds::new(nexthops),
            groups: GroupIds::new(groups.min(MAX_GROUP_IDS)),
        }
    }

    /// See `IdAlloc::release_unused`; `applied`: what the maps hold.
    pub fn release_unused(&mut self, applied: &Desired) {
        self.nexthops.release_unused(&applied.nexthops);
        self.groups.release_unused(&applied.groups);
    }

    /// Some route was punted for lack of an id (see `IdAlloc::starved`).
    pub fn starved(&self) -> bool {
        self.nexthops.starved() || self.groups.starved()
    }

    /// Takes the ids of the next hops and groups a written delta added.
    pub fn reserve_delta(&mut self, d: &crate::route_delta::FibDelta) {
        for (id, e) in &d.nexthops {
            if let Some(e) = e {
                self.nexthops.reserve(*id, e.clone());
            }
        }
        for (id, e) in &d.groups {
            if let Some(e) = e {
                self.groups.reserve(*id, e.clone());
            }
        }
    }
}

/// A prefix of either family, address bits left-aligned in a u128 so that
/// IPv4 and IPv6 share the containment arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Prefix {
    pub(crate) bits: u128,
    pub(crate) len: u8,
}

fn mask(bits: u128, len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        bits & (u128::MAX << (128 - u32::from(len)))
    }
}

impl Prefix {
    pub(crate) fn new(fam: Family, addr: &IpAddr, len: u8) -> Option<Prefix> {
        let (bits, width) = match (fam, addr) {
            (Family::V4, IpAddr::V4(a)) => (u128::from(u32::from(*a)) << 96, 32),
            (Family::V6, IpAddr::V6(a)) => (u128::from(*a), 128),
            _ => return None,
        };
        if len > width {
            return None;
        }
        Some(Prefix {
            bits: mask(bits, len),
            len,
        })
    }

    pub(crate) fn truncate(self, len: u8) -> Prefix {
        Prefix {
            bits: mask(self.bits, len),
            len,
        }
    }

    /// The prefix's last address, as a host prefix of `fam`.
    pub(crate) fn last(self, fam: Family) -> Prefix {
        let width = match fam {
            Family::V4 => 32,
            Family::V6 => 128,
        };
        let below = |n: u8| u128::MAX.checked_shr(u32::from(n)).unwrap_or(0);
        Prefix {
            bits: self.bits | (below(self.len) & !below(width)),
            len: width,
        }
    }

    pub(crate) fn v4(self) -> (Ipv4Addr, u8) {
        (Ipv4Addr::from((self.bits >> 96) as u32), self.len)
    }

    pub(crate) fn v6(self) -> (Ipv6Addr, u8) {
        (Ipv6Addr::from(self.bits), self.len)
    }
}

/// What a prefix should do, before next-hop and group ids are assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Intent {
    Forward { hop: NexthopEntry, mtu: u32 },
    Multipath { group: GroupIntent, mtu: u32 },
    Act(RouteAction),
}

/// An ECMP group before ids are assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupIntent {
    kind: GroupKind,
    /// (upper bound, next hop); None: a path we cannot forward by (its
    /// flows are punted and the kernel chooses for them).
    paths: Vec<(i32, Option<NexthopEntry>)>,
    n_buckets: u16,
    origin: u32,
    /// Resilient: (bucket index, index into `paths`), buckets we know of.
    buckets: Vec<(u16, usize)>,
}

impl GroupIntent {
    /// The group's table entry, with `nh` giving each path's next-hop id
    /// (0 for a path we cannot forward by).
    pub(crate) fn entry(&self, mut nh: impl FnMut(&NexthopEntry) -> u32) -> GroupEntry {
        GroupEntry {
            kind: self.kind,
            paths: self
                .paths
                .iter()
                .map(|(b, h)| GroupPath { upper_bound: *b, nh_id: h.as_ref().map_or(0, &mut nh) })
                .collect(),
            n_buckets: self.n_buckets,
            origin: self.origin,
        }
    }

    /// The next hops of the paths we can forward by.
    pub(crate) fn hops(&self) -> impl Iterator<Item = &NexthopEntry> {
        self.paths.iter().filter_map(|(_, h)| h.as_ref())
    }

    /// Resilient with buckets to write (`fp_res_buckets`).
    pub(crate) fn has_buckets(&self) -> bool {
        !self.buckets.is_empty()
    }
}

fn punt(reason: u8) -> Intent {
    Intent::Act(RouteAction::Punt { reason })
}

/// The route the kernel would pick among those of one table with the same
/// prefix, as an intent.
pub(crate) fn select(fam: Family, routes: &[&Route], state: &KernelState) -> Intent {
    // The kernel matches TOS-specific routes against the packet's TOS, which
    // the FIB here does not look at.
    if routes.iter().any(|r| r.key.tos != 0) {
        return punt(reason::ROUTE_UNSUPPORTED);
    }
    let Some(best) = routes.iter().map(|r| r.key.priority).min() else {
        return punt(reason::ROUTE_UNSUPPORTED);
    };
    let winners: Vec<&&Route> = routes.iter().filter(|r| r.key.priority == best).collect();
    match winners.as_slice() {
        [one] => route_intent(fam, one, state),
        // Same metric in one table: IPv6 siblings, i.e. multipath.
        _ => punt(reason::ECMP),
    }
}

fn route_intent(fam: Family, route: &Route, state: &KernelState) -> Intent {
    if route.encap {
        return punt(reason::ROUTE_UNSUPPORTED);
    }
    match route.kind {
        RouteKind::Unicast => {}
        RouteKind::Local | RouteKind::Anycast => return Intent::Act(RouteAction::Local),
        RouteKind::Broadcast | RouteKind::Multicast => return punt(reason::MULTICAST),
        RouteKind::Blackhole => return Intent::Act(RouteAction::Blackhole),
        RouteKind::Unreachable => return Intent::Act(RouteAction::Unreachable),
        RouteKind::Prohibit => return Intent::Act(RouteAction::Prohibit),
        RouteKind::Throw | RouteKind::Other(_) => return punt(reason::ROUTE_UNSUPPORTED),
    }
    // A locked MTU (or ip_forward_use_pmtu for IPv4) makes the kernel use a
    // learnt path MTU for forwarded packets, which netlink does not show us.
    if route.mtu_locked || (fam == Family::V4 && state.sysctl.ip_forward_use_pmtu) {
        return punt(reason::ROUTE_UNSUPPORTED);
    }
    let hop = match &route.target {
        RouteTarget::None => return punt(reason::ROUTE_UNSUPPORTED),
        RouteTarget::Single(nh) => nh,
        RouteTarget::Multipath(hops) => match hops.as_slice() {
            [] => return punt(reason::ROUTE_UNSUPPORTED),
            [one] => one,
            _ => return classic_multipath(fam, hops, route.mtu, state),
        },
        RouteTarget::Object(id) => match state.nexthops.get(id) {
            None => return punt(reason::ROUTE_UNSUPPORTED),
            Some(obj) if obj.unsupported => return punt(reason::ROUTE_UNSUPPORTED),
            Some(obj) if !obj.group.is_empty() => return object_group(fam, obj, route.mtu, state),
            Some(obj) if obj.blackhole => return Intent::Act(RouteAction::Blackhole),
            Some(obj) => match &obj.hop {
                Some(h) => h,
                None => return punt(reason::ROUTE_UNSUPPORTED),
            },
        },
    };
    hop_intent(hop, route.mtu, state)
}

fn hop_intent(hop: &NextHop, route_mtu: u32, state: &KernelState) -> Intent {
    // A dead next hop makes the kernel skip to another route, a link-down
    // one too where ignore_routes_with_linkdown says so.
    if hop.flags & RTNH_F_DEAD != 0 || hop.ifindex == 0 {
        return punt(reason::ROUTE_UNSUPPORTED);
    }
    // Link-down while the link is down: the interface entry (no FP_IF_UP)
    // punts whatever would leave through it, so the route keeps its entry.
    // Punting it here rewrote every route through a link on each carrier
    // flap (550k FIB entries each way with a full table, 1.3 s of writes).
    // Link-down on a link we see up is a route from before the link came
    // back (the re-dump is on its way): punt it until then.
    let link_down = state.links.get(&hop.ifindex).is_none_or(|l| !(l.admin_up && l.running));
    if hop.flags & RTNH_F_LINKDOWN != 0 && !link_down {
        return punt(reason::ROUTE_UNSUPPORTED);
    }
    // The route MTU is honoured for both families: the differential test
    // (tests/test_differential.py, route MTU case) shows this kernel answers
    // Packet Too Big for an IPv6 datagram above an unlocked route MTU, and a
    // lower limit can only make us punt more, never forward wrongly.
    let mtu = route_mtu;
    Intent::Forward {
        hop: NexthopEntry {
            ifindex: hop.ifindex,
            gateway: hop.gateway,
        },
        mtu,
    }
}

/// Why the kernel's multipath hash of `fam` cannot be reproduced, if it cannot.
fn mp_block(fam: Family, state: &KernelState) -> Option<String> {
    let (policy, proto) = match fam {
        Family::V4 => (state.sysctl.mp_policy4, "ipv4"),
        Family::V6 => (state.sysctl.mp_policy6, "ipv6"),
    };
    let name = family_name(fam);
    if state.sysctl.mp_seed == 0 {
        return Some(format!(
            "{name} multipath routes punted: set net.ipv4.fib_multipath_hash_seed to a non-zero value to fast-path ECMP: the kernel's random seed cannot be reproduced"
        ));
    }
    if !crate::mphash::reproduced(policy) {
        return Some(format!(
            "{name} multipath routes punted: net.{proto}.fib_multipath_hash_policy is {policy}; only 0 (L3), 1 (L4), 2 (L3 or inner L3) and 3 (custom fields) are implemented, set it to one of them to fast-path ECMP"
        ));
    }
    None
}

/// DIV_ROUND_CLOSEST_ULL(w << 31, total) - 1: the last hash of a path whose
/// cumulative weight is `w` (fib_rebalance, rt6_upper_bound_set,
/// nh_hthr_group_rebalance all compute it so).
fn upper_bound(w: u64, total: u64) -> i32 {
    let b = ((w << 31) + total / 2) / total;
    // b <= 2^31, so b - 1 fits.
    (b as i64 - 1) as i32
}

/// A member we can forward by: a plain next hop on an interface.
fn path_hop(hop: &NextHop) -> Option<NexthopEntry> {
    if hop.ifindex == 0 || hop.flags & (RTNH_F_DEAD | RTNH_F_LINKDOWN) != 0 {
        return None;
    }
    Some(NexthopEntry {
        ifindex: hop.ifindex,
        gateway: hop.gateway,
    })
}

/// A multipath route (RTA_MULTIPATH), in the order netlink reports the
/// members, which is the order the kernel rebalances and selects in (IPv4:
/// fib_info's nexthops; IPv6: the first sibling, then its sibling list).
///
/// A member is dead for the hash when it has RTNH_F_DEAD, or RTNH_F_LINKDOWN
/// while the device ignores link-down routes (IPv4: all || dev, IPv6: dev);
/// dead members get -1 and the live ones share 2^31 by weight.
fn classic_multipath(fam: Family, hops: &[NextHop], mtu: u32, state: &KernelState) -> Intent {
    if hops.len() > FP_GROUP_MAX_PATHS {
        return punt(reason::ECMP);
    }
    if mp_block(fam, state).is_some() {
        return punt(reason::ECMP);
    }
    let mut dead = Vec::with_capacity(hops.len());
    for h in hops {
        let d = if h.flags & RTNH_F_DEAD != 0 {
            true
        } else if h.flags & RTNH_F_LINKDOWN != 0 {
            // Without the device's sysctls we cannot tell how the kernel
            // weighs this path.
            let Some(sys) = state.if_sysctl.get(&h.ifindex) else {
                return punt(reason::ROUTE_UNSUPPORTED);
            };
            match fam {
                Family::V4 => state.sysctl.ignore_linkdown4_all || sys.ignore_linkdown4,
                Family::V6 => sys.ignore_linkdown6,
            }
        } else {
            false
        };
        dead.push(d);
    }
    let total: u64 = hops
        .iter()
        .zip(&dead)
        .filter(|(_, d)| !**d)
        .map(|(h, _)| u64::from(h.weight))
        .sum();
    let mut w = 0u64;
    let mut paths = Vec::with_capacity(hops.len());
    for (h, d) in hops.iter().zip(&dead) {
        if *d || total == 0 {
            paths.push((-1, None));
            continue;
        }
        w += u64::from(h.weight);
        paths.push((upper_bound(w, total), path_hop(h)));
    }
    Intent::Multipath {
        group: GroupIntent {
            kind: GroupKind::HashThreshold,
            paths,
            n_buckets: 0,
            origin: 0,
            buckets: Vec::new(),
        },
        mtu,
    }
}

/// A route to a next-hop group object (`ip nexthop add id N group ...`).
///
/// Hash-threshold: bounds over all members (nh_hthr_group_rebalance; the
/// kernel removes a member whose device goes down rather than marking it).
/// Resilient: the bucket table as dumped; a bucket we do not know, or whose
/// member we cannot forward by, is left out and its flows punt.
fn object_group(
    fam: Family,
    obj: &crate::model::NexthopObject,
    mtu: u32,
    state: &KernelState,
) -> Intent {
    if obj.group.len() > FP_GROUP_MAX_PATHS {
        return punt(reason::ECMP);
    }
    if mp_block(fam, state).is_some() {
        return punt(reason::ECMP);
    }
    let member = |id: u32| -> Option<NexthopEntry> {
        let m = state.nexthops.get(&id)?;
        if m.blackhole || m.unsupported || !m.group.is_empty() {
            return None;
        }
        path_hop(m.hop.as_ref()?)
    };
    if !obj.resilient {
        let total: u64 = obj.group.iter().map(|(_, w)| u64::from(*w)).sum();
        if total == 0 {
            return punt(reason::ROUTE_UNSUPPORTED);
        }
        let mut w = 0u64;
        let paths = obj
            .group
            .iter()
            .map(|(id, weight)| {
                w += u64::from(*weight);
                (upper_bound(w, total), member(*id))
            })
            .collect();
        return Intent::Multipath {
            group: GroupIntent {
                kind: GroupKind::HashThreshold,
                paths,
                n_buckets: 0,
                origin: 0,
                buckets: Vec::new(),
            },
            mtu,
        };
    }
    let known = state.res_buckets.get(&obj.id);
    let (n, Some(known)) = (obj.n_buckets, known) else {
        return punt(reason::ECMP);
    };
    if n == 0 || known.is_empty() {
        return punt(reason::ECMP);
    }
    let paths: Vec<(i32, Option<NexthopEntry>)> =
        obj.group.iter().map(|(id, _)| (0, member(*id))).collect();
    let buckets = known
        .iter()
        .filter(|(index, _)| **index < n)
        .filter_map(|(index, nh)| {
            let pos = obj.group.iter().position(|(id, _)| id == nh)?;
            paths[pos].1.as_ref()?;
            Some((*index, pos))
        })
        .collect();
    Intent::Multipath {
        group: GroupIntent {
            kind: GroupKind::Resilient,
            paths,
            n_buckets: n,
            origin: obj.id,
            buckets,
        },
        mtu,
    }
}

/// The FIB of one family: local and main tables merged so that one LPM
/// lookup gives what the default rules (local, then main) give. Sorted by
/// prefix, so the caller can build its map in one pass.
fn fib_intents(state: &KernelState, fam: Family) -> Vec<(Prefix, Intent)> {
    // Grouping by sorting one vector instead of a map of vectors: at a
    // million routes the per-prefix allocations and hashing dominated.
    let mut local: Vec<(Prefix, &Route)> = Vec::new();
    let mut main: Vec<(Prefix, &Route)> = Vec::with_capacity(state.routes.len());
    for ((f, key), route) in &state.routes {
        if *f != fam {
            continue;
        }
        // Other tables are reachable only through non-default rules, which
        // punt the whole family (see `policy_problem`).
        let table = match key.table {
            RT_TABLE_LOCAL => &mut local,
            RT_TABLE_MAIN => &mut main,
            _ => continue,
        };
        let Some(p) = Prefix::new(fam, &key.dst, key.prefix_len) else {
            log::debug!("ignoring route with a malformed key {key:?}");
            continue;
        };
        table.push((p, route));
    }
    let local = pick(fam, local, state);
    let local_idx: HashMap<Prefix, &Intent> = local.iter().map(|(p, i)| (*p, i)).collect();
    let mut local_lens: Vec<u8> = local.iter().map(|(p, _)| p.len).collect();
    local_lens.sort_unstable_by(|a, b| b.cmp(a));
    local_lens.dedup();

    // Merge main's intents, in prefix order as they are picked, with the
    // sorted local ones; a local route wins an identical prefix. Merged as
    // they come, not from a second vector of main's intents: with a full
    // table that vector (~96 MB) made the daemon's peak memory.
    let mut out = Vec::with_capacity(local.len() + main.len());
    let mut locals = local.iter().peekable();
    pick_each(fam, main, state, |p, m| {
        while let Some((lp, li)) = locals.peek() {
            if *lp >= p {
                break;
            }
            out.push((*lp, (*li).clone()));
            locals.next();
        }
        if local_idx.contains_key(&p) {
            return;
        }
        let cover = local_lens
            .iter()
            .filter(|l| **l <= p.len)
            .find_map(|l| local_idx.get(&p.truncate(*l)));
        let intent = match cover {
            None => m,
            Some(l) => merge_covered(fam, l, m),
        };
        out.push((p, intent));
    });
    out.extend(locals.cloned());
    out
}

/// The intent of each prefix of one table, sorted by prefix.
pub(crate) fn pick(fam: Family, routes: Vec<(Prefix, &Route)>, state: &KernelState) -> Vec<(Prefix, Intent)> {
    let mut out = Vec::with_capacity(routes.len());
    pick_each(fam, routes, state, |p, i| out.push((p, i)));
    out
}

/// `pick`, handing each prefix's intent to `each` in prefix order.
fn pick_each(fam: Family, mut routes: Vec<(Prefix, &Route)>, state: &KernelState, mut each: impl FnMut(Prefix, Intent)) {
    // The mirror's order must not leak into the choice: within a prefix
    // the routes come sorted by key.
    routes.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.key.cmp(&b.1.key)));
    let mut group: Vec<&Route> = Vec::new();
    let mut i = 0;
    while i < routes.len() {
        let p = routes[i].0;
        group.clear();
        while i < routes.len() && routes[i].0 == p {
            group.push(routes[i].1);
            i += 1;
        }
        each(p, select(fam, &group, state));
    }
}

/// The entry for a main-table prefix that lies inside a shorter local-table
/// prefix `l`.
///
/// IPv6 always looks in local first, so the address gets `l`. IPv4 is not so
/// simple: while no ip rule was ever added or deleted in the namespace the
/// kernel keeps local and main in one trie and does a plain longest match
/// over both (fib_has_custom_rules false), so `m` would win; once rules were
/// touched the tables are split for good and `l` wins, even after the rules
/// are back to the defaults. Netlink does not tell which, so take `l` only
/// when that is safe either way: `l` is a punt of some kind (the usual case:
/// local, broadcast), or forwards exactly like `m`.
pub(crate) fn merge_covered(fam: Family, l: &Intent, m: Intent) -> Intent {
    match (fam, l) {
        (Family::V4, Intent::Forward { .. } | Intent::Multipath { .. }) if *l != m => {
            punt(reason::ROUTE_UNSUPPORTED)
        }
        _ => l.clone(),
    }
}

fn family_name(fam: Family) -> &'static str {
    match fam {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

/// The families punted because the kernel's lookup is not the main table's
/// (`Switches::policy_punt`), and why.
pub(crate) fn policy_punts(state: &KernelState, managed: &BTreeMap<u32, u32>) -> (u32, Vec<String>) {
    let (mut bits, mut problems) = (0, Vec::new());
    for fam in [Family::V4, Family::V6] {
        if let Some(p) = policy_problem(&state.rules, fam) {
            bits |= fam.bit();
            problems.push(p);
        }
    }
    // A VRF slave's traffic is looked up in the VRF's table via the l3mdev
    // rule; whatever the rules look like, we do not mirror that.
    for ifindex in managed.keys() {
        let Some(master) = state.links.get(ifindex).and_then(|l| l.master) else {
            continue;
        };
        let name = state.links.get(ifindex).map(|l| l.name.as_str()).unwrap_or("?");
        let m = state.links.get(&master);
        if let Some(vrf) = m.filter(|m| m.kind.as_deref() == Some("vrf")) {
            bits |= BOTH;
            problems.push(format!("{name} is enslaved to VRF {}: IPv4 and IPv6 punted", vrf.name));
        } else {
            // (A master not seen yet is named by its ifindex: iface_flags
            // treats the port as one already.)
            let (mname, kind) = m.map_or((format!("ifindex {master}"), "master"), |m| {
                (m.name.clone(), m.kind.as_deref().unwrap_or("master"))
            });
            problems.push(format!(
                "{name} is a port of {mname} ({kind}): what arrives on it is {mname}'s, to the kernel, and nothing is forwarded out of it"
            ));
        }
    }
    (bits, problems)
}

/// The rules the kernel installs in a fresh namespace: (priority, table).
fn default_rules(fam: Family) -> &'static [(u32, u32)] {
    match fam {
        Family::V4 => &[(0, 255), (32766, 254), (32767, 253)],
        Family::V6 => &[(0, 255), (32766, 254)],
    }
}

/// Why the rules of `fam` are not the defaults, if they are not.
///
/// For IPv4 the default rule set ends with `32767: lookup default` (table
/// 253). Routes in that table never matter to us: the kernel reaches it only
/// when main has no match at all, and then our FIB has no match either and
/// the packet is punted as NO_ROUTE, so the kernel consults table 253 itself.
fn policy_problem(rules: &[Rule], fam: Family) -> Option<String> {
    let mut missing: Vec<(u32, u32)> = default_rules(fam).to_vec();
    let mut extra = Vec::new();
    for r in rules.iter().filter(|r| r.family == fam) {
        let plain = r.action == FR_ACT_TO_TBL && !r.has_selectors && !r.invert;
        let pos = missing.iter().position(|d| *d == (r.priority, r.table));
        match pos {
            Some(i) if plain => {
                missing.remove(i);
            }
            _ => extra.push(format!(
                "{}: table {} action {}",
                r.priority, r.table, r.action
            )),
        }
    }
    if missing.is_empty() && extra.is_empty() {
        return None;
    }
    let mut why = Vec::new();
    if !extra.is_empty() {
        why.push(format!("non-default rules [{}]", extra.join(", ")));
    }
    if !missing.is_empty() {
        let m: Vec<String> = missing
            .iter()
            .map(|(p, t)| format!("{p}: lookup {t}"))
            .collect();
        why.push(format!("missing default rules [{}]", m.join(", ")));
    }
    let name = family_name(fam);
    Some(format!(
        "{name} policy routing: {}: {name} punted",
        why.join("; ")
    ))
}

/// The fp_ifaces entry of managed interface `ifindex` in `slot`; None while
/// the link is unknown or has no Ethernet address.
pub(crate) fn iface_entry(state: &KernelState, ifindex: u32, slot: u32) -> Option<IfaceEntry> {
    let link = state.links.get(&ifindex)?;
    let mac = link.mac?;
    let mtu6 = match state.if_sysctl.get(&ifindex).map(|s| s.mtu6) {
        Some(m) if m != 0 => m,
        _ => link.mtu,
    };
    Some(IfaceEntry {
        mac,
        flags: iface_flags(state, ifindex, link.admin_up, link.running),
        mtu: link.mtu,
        mtu6,
        slot,
    })
}

fn iface_flags(state: &KernelState, ifindex: u32, admin_up: bool, running: bool) -> u16 {
    let sys = state.if_sysctl.get(&ifindex).cloned().unwrap_or_default();
    // A bridge or bond port is no L3 interface: the kernel hands what
    // arrives on it to its master (whose ports, filters and sysctls are not
    // ours) and routes out through the master, not the port. No permission
    // to forward in or out, so both ways punt (forwarding_disabled,
    // egress_down). A VRF member stays an L3 interface; its family punts.
    let port = state
        .links
        .get(&ifindex)
        .and_then(|l| l.master)
        .is_some_and(|m| state.links.get(&m).is_none_or(|m| m.kind.as_deref() != Some("vrf")));
    if port {
        return rpf_flags(sys.rp_filter);
    }
    let mut flags = 0;
    if admin_up && running {
        flags |= if_flags::UP;
    }
    if sys.forwarding4 {
        flags |= if_flags::FWD4;
    }
    if sys.forwarding6 && state.sysctl.forwarding6_all && !sys.disable_ipv6 {
        flags |= if_flags::FWD6;
    }
    // Its routes go with it, but only announced by default
    // (net.ipv6.route.skip_notify_on_dev_down).
    if sys.disable_ipv6 {
        flags |= if_flags::V6_OFF;
    }
    flags | rpf_flags(sys.rp_filter)
}

fn rpf_flags(rp_filter: u8) -> u16 {
    // The kernel treats any non-zero value other than 1 as loose.
    match rp_filter {
        0 => 0,
        1 => if_flags::RPF_STRICT,
        _ => if_flags::RPF_LOOSE,
    }
}

const BOTH: u32 = 1 | 2;

/// Source classes the data path punts before any lookup
/// (fp_ip4_addr_reason): 0/8, 127/8, 224/4 (with 240/4 and the limited
/// broadcast), 169.254/16. A reject route inside them never meets a source.
const SRC_PUNTED4: &[(u32, u8)] = &[
    (0x0000_0000, 8),
    (0x7F00_0000, 8),
    (0xE000_0000, 3),
    (0xA9FE_0000, 16),
];

/// How the data path should validate IPv4 sources with rp_filter off
/// (fib_validate_source, see fp_ip4_rpf_reason in bpf/lib/fib.h).
///
/// The kernel refuses its own addresses, and (once local routes were ever
/// customised, which netlink does not show) every source whose route is not
/// unicast. Returns the deny set of exact addresses, and whether a hash of
/// addresses cannot express the rule because a non-unicast entry shorter
/// than /32 exists, in which case sources need the LPM lookup. The same
/// route classification as the data path's LPM mode: FORWARD and ECMP punts
/// are unicast; local refuses as martian; anything else, including other
/// punts (broadcast, throw, TOS-specific, ...), as rp_filter.
fn src_check4(fib4: &BTreeMap<(Ipv4Addr, u8), RouteEntry>, state: &KernelState) -> (BTreeMap<Ipv4Addr, u8>, bool) {
    let refusal = |e: &RouteEntry| src_refusal(&e.action);
    let mut deny = BTreeMap::new();
    let mut needs_lpm = false;
    for ((addr, len), e) in fib4 {
        let Some(r) = refusal(e) else { continue };
        if *len >= 32 {
            deny.insert(*addr, r);
            continue;
        }
        let a = u32::from(*addr);
        let inside_punted = SRC_PUNTED4
            .iter()
            .any(|(net, plen)| *len >= *plen && a & (u32::MAX << (32 - u32::from(*plen))) == *net);
        if !inside_punted {
            needs_lpm = true;
        }
    }
    // inet_lookup_ifaddr_rcu() looks at addresses, not routes: an address
    // whose local route was deleted is still refused.
    for a in state.addrs.keys() {
        if let IpAddr::V4(v4) = a.addr {
            deny.insert(v4, reason::MARTIAN);
        }
    }
    (deny, needs_lpm)
}

/// How the source check treats a source whose route is `a` (see
/// `src_check4`): None accepts, else the refusal reason.
pub(crate) fn src_refusal(a: &RouteAction) -> Option<u8> {
    match a {
        RouteAction::Forward { .. } | RouteAction::Multipath { .. } => None,
        RouteAction::Punt { reason: r } if *r == reason::ECMP => None,
        RouteAction::Local => Some(reason::MARTIAN),
        _ => Some(reason::RP_FILTER),
    }
}

/// The action class of an intent, ids left out: enough for `src_check4`.
fn intent_class(i: &Intent) -> RouteEntry {
    let action = match i {
        Intent::Forward { .. } => RouteAction::Forward { nh_id: 0 },
        Intent::Multipath { .. } => RouteAction::Multipath { group: 0 },
        Intent::Act(a) => *a,
    };
    RouteEntry { action, mtu: 0 }
}

/// The IPv4 FIB as the kernel has it, for the source check, from the
/// trimmed one and what trimming took out of it.
fn source_classes(fib4: &[(Prefix, Intent)], t: &overflow::Trimmed<Intent>) -> BTreeMap<(Ipv4Addr, u8), RouteEntry> {
    let mut out: BTreeMap<(Ipv4Addr, u8), RouteEntry> = fib4.iter().map(|(p, i)| (p.v4(), intent_class(i))).collect();
    for (p, i) in t.left_out.iter().chain(t.covers.iter()) {
        out.insert(p.v4(), intent_class(i));
    }
    out
}

/// A left-out IPv4 prefix whose sources the kernel refuses and that no
/// installed prefix covers, if there is one.
fn uncovered_refusal(t: &overflow::Trimmed<Intent>, fib4: &BTreeMap<(Ipv4Addr, u8), RouteEntry>) -> Option<String> {
    let (p, _) = t.left_out.iter().find(|(p, i)| {
        src_refusal(&intent_class(i).action).is_some()
            && !(0..p.len).any(|l| fib4.contains_key(&p.truncate(l).v4()))
    })?;
    let (a, l) = p.v4();
    Some(format!(
        "IPv4 FIB overflow left out {a}/{l}, whose sources the kernel refuses, with no installed route covering it: IPv4 punted"
    ))
}

/// The neighbour entries the maps should hold, before the capacity check:
/// usable neighbours with a MAC on managed interfaces. Nothing else in the
/// desired state depends on neighbours (`neigh_delta` relies on that).
pub(crate) fn neigh_entries(state: &KernelState, managed: &BTreeMap<u32, u32>) -> BTreeMap<NeighKey, NeighEntry> {
    let mut out = BTreeMap::new();
    for n in state.neighbours.values() {
        let Some(mac) = n.mac else { continue };
        if n.state & NUD_USABLE == 0 || !managed.contains_key(&n.ifindex) {
            continue;
        }
        out.insert(NeighKey { ifindex: n.ifindex, addr: n.addr }, NeighEntry { mac });
    }
    out
}

/// `managed`: ifindex -> fp_stats slot of every interface fastpath runs on.
pub fn compute(
    state: &KernelState,
    managed: &BTreeMap<u32, u32>,
    caps: &Capacities,
    ids: &mut Ids,
) -> Desired {
    compute_gated(state, managed, caps, ids, None)
}

/// `compute` with every FIB prefix that fits the maps put to a reservation
/// model first (`--reservation-model`/`--resource-target`): refused and
/// not-yet-written prefixes stay out of the maps, their covers punted.
pub fn compute_gated(
    state: &KernelState,
    managed: &BTreeMap<u32, u32>,
    caps: &Capacities,
    ids: &mut Ids,
    mut gate: Option<&mut Admission>,
) -> Desired {
    let mut d = Desired::default();

    for (ifindex, slot) in managed {
        if let Some(e) = iface_entry(state, *ifindex, *slot) {
            d.ifaces.insert(*ifindex, e);
        }
    }

    let mut fib4 = fib_intents(state, Family::V4);
    let mut fib6 = fib_intents(state, Family::V6);
    let (need4, need6) = (fib4.len(), fib6.len());
    // Over capacity: some prefixes stay out and their installed covers punt,
    // before next hops are counted, so left-out routes take no next-hop id.
    let punt_cover = |i: &mut Intent| match i {
        Intent::Forward { .. } | Intent::Multipath { .. } => {
            Some(std::mem::replace(i, punt(reason::TABLE_FULL)))
        }
        Intent::Act(_) => None,
    };
    let trim4 = overflow::trim_gated(&mut fib4, caps.fib4 as usize, punt_cover, gate.as_deref_mut().map(|g| (g, Family::V4)));
    let trim6 = overflow::trim_gated(&mut fib6, caps.fib6 as usize, punt_cover, gate.as_deref_mut().map(|g| (g, Family::V6)));
    if let Some(g) = gate {
        g.end_pass();
    }
    // A next-hop or group id beyond the map cannot be written.
    ids.nexthops.capacity = ids.nexthops.capacity.min(caps.nexthops);
    ids.groups.capacity = ids.groups.capacity.min(caps.groups);
    // Few distinct next hops behind many prefixes: dedup by hash first.
    let mut hops: HashSet<&NexthopEntry> = HashSet::new();
    for (_, i) in fib4.iter().chain(fib6.iter()) {
        match i {
            Intent::Forward { hop, .. } => {
                hops.insert(hop);
            }
            Intent::Multipath { group, .. } => {
                hops.extend(group.hops());
            }
            Intent::Act(_) => {}
        }
    }
    let hops: BTreeSet<NexthopEntry> = hops.into_iter().cloned().collect();
    let assigned = ids.nexthops.assign(&hops);
    for (hop, id) in &assigned {
        d.nexthops.insert(*id, hop.clone());
    }
    // Groups with their next-hop ids; a member that found no id gets 0.
    let group_entry = |g: &GroupIntent| -> GroupEntry { g.entry(|h| assigned.get(h).copied().unwrap_or(0)) };
    let mut groups: BTreeMap<GroupEntry, &GroupIntent> = BTreeMap::new();
    for (_, i) in fib4.iter().chain(fib6.iter()) {
        if let Intent::Multipath { group, .. } = i {
            groups.insert(group_entry(group), group);
        }
    }
    let group_set: BTreeSet<GroupEntry> = groups.keys().cloned().collect();
    let mut group_ids = ids.groups.assign(&group_set);
    // Resilient groups whose buckets do not all fit are not used (their
    // routes punt); the rest keep every bucket, in id order.
    let mut buckets_need = 0usize;
    let mut bucket_less = Vec::new();
    let by_gid: BTreeMap<u32, GroupEntry> = group_ids.iter().map(|(e, g)| (*g, e.clone())).collect();
    for (gid, entry) in &by_gid {
        let gid = *gid;
        let Some(g) = groups.get(entry) else { continue };
        if g.buckets.is_empty() {
            continue;
        }
        let mine: Vec<(u32, u32)> = g
            .buckets
            .iter()
            .filter_map(|(index, pos)| {
                let nh = entry.paths.get(*pos).map(|p| p.nh_id).unwrap_or(0);
                (nh != 0).then(|| (bucket_key(gid, *index), nh))
            })
            .collect();
        buckets_need += mine.len();
        if d.res_buckets.len() + mine.len() > caps.buckets as usize {
            bucket_less.push(entry.clone());
            continue;
        }
        d.res_buckets.extend(mine);
    }
    for e in &bucket_less {
        group_ids.remove(e);
    }
    for (entry, gid) in &group_ids {
        d.groups.insert(*gid, entry.clone());
    }
    let table_full = RouteEntry {
        action: RouteAction::Punt {
            reason: reason::TABLE_FULL,
        },
        mtu: 0,
    };
    let entry = |i: Intent| -> RouteEntry {
        match i {
            Intent::Forward { hop, mtu } => match assigned.get(&hop) {
                Some(id) => RouteEntry {
                    action: RouteAction::Forward { nh_id: *id },
                    mtu,
                },
                // No id to give: this prefix must not fall back to a shorter route.
                None => table_full,
            },
            Intent::Multipath { group, mtu } => match group_ids.get(&group_entry(&group)) {
                Some(gid) => RouteEntry {
                    action: RouteAction::Multipath { group: *gid },
                    mtu,
                },
                None => table_full,
            },
            Intent::Act(action) => RouteEntry { action, mtu: 0 },
        }
    };
    // The source check must follow the kernel's FIB, not the trimmed one.
    let truth4 = (!trim4.left_out.is_empty()).then(|| source_classes(&fib4, &trim4));
    let covers4: HashSet<Prefix> = trim4.covers.iter().map(|(p, _)| *p).collect();
    let covers6: HashSet<Prefix> = trim6.covers.iter().map(|(p, _)| *p).collect();
    let mut o = overflow::Offload::default();
    for (p, i) in fib4 {
        let e = entry(i);
        if e == table_full && !covers4.contains(&p) {
            o.failed4.insert(p.v4());
        }
        d.fib4.insert(p.v4(), e);
    }
    for (p, i) in fib6 {
        let e = entry(i);
        if e == table_full && !covers6.contains(&p) {
            o.failed6.insert(p.v6());
        }
        d.fib6.insert(p.v6(), e);
    }
    o.failed4.extend(trim4.left_out.iter().filter(|(p, _)| !trim4.pending.contains(p)).map(|(p, _)| p.v4()));
    o.failed6.extend(trim6.left_out.iter().filter(|(p, _)| !trim6.pending.contains(p)).map(|(p, _)| p.v6()));
    o.covers4 = trim4.covers.iter().map(|(p, _)| p.v4()).collect();
    o.covers6 = trim6.covers.iter().map(|(p, _)| p.v6()).collect();
    let (deny, needs_lpm) = src_check4(truth4.as_ref().unwrap_or(&d.fib4), state);
    // The map is sized like fib4. With LPM checks the set is not read, so
    // it is not kept either.
    if needs_lpm || deny.len() > caps.fib4 as usize {
        d.switches.src_lpm |= Family::V4.bit();
        // An LPM check that misses accepts the source; a left-out prefix
        // the kernel refuses sources of, with no installed cover to punt
        // them, would be accepted wrongly. Rare enough to punt the family.
        if let Some(why) = uncovered_refusal(&trim4, &d.fib4) {
            d.switches.table_full |= Family::V4.bit();
            d.problems.push(why);
        }
    } else {
        d.src_deny4 = deny;
    }
    for (name, need, cap, failed) in [
        ("IPv4 FIB", need4, caps.fib4, trim4.left_out.len() - trim4.pending.len()),
        ("IPv6 FIB", need6, caps.fib6, trim6.left_out.len() - trim6.pending.len()),
    ] {
        if failed > 0 {
            d.problems.push(format!(
                "{name} needs {need} entries, capacity {cap}: {failed} routes not offloaded (their traffic goes to the kernel)"
            ));
        }
    }
    // Every distinct next hop counts, including those that found no id;
    // +1 because id 0 is never used.
    if hops.len() + 1 > caps.nexthops as usize {
        d.problems.push(format!(
            "next-hop table needs {} entries, capacity {}: routes whose next hop found no slot are punted (offload failed)",
            hops.len() + 1,
            caps.nexthops
        ));
    } else if ids.nexthops.starved() {
        d.problems.push(format!(
            "next-hop ids exhausted (capacity {}): some routes punted until ids are released",
            ids.nexthops.capacity()
        ));
    }
    if group_set.len() + 1 > caps.groups as usize {
        d.problems.push(format!(
            "ECMP group table needs {} entries, capacity {}: multipath routes whose group found no slot are punted (offload failed)",
            group_set.len() + 1,
            caps.groups
        ));
    } else if ids.groups.starved() {
        d.problems.push(format!(
            "ECMP group ids exhausted (capacity {}): some multipath routes punted until ids are released",
            ids.groups.capacity()
        ));
    }
    if !bucket_less.is_empty() {
        d.problems.push(format!(
            "resilient bucket table needs {buckets_need} entries, capacity {}: {} groups' routes punted",
            caps.buckets,
            bucket_less.len()
        ));
    }
    d.offload = o;
    d.switches.mp_policy4 = state.sysctl.mp_policy4;
    d.switches.mp_policy6 = state.sysctl.mp_policy6;
    d.switches.mp_fields4 = state.sysctl.mp_fields4;
    d.switches.mp_fields6 = state.sysctl.mp_fields6;
    d.switches.mp_seed = state.sysctl.mp_seed;
    for (fam, fib_ecmp) in [
        (Family::V4, d.fib4.values().filter(|e| e.action == RouteAction::Punt { reason: reason::ECMP }).count()),
        (Family::V6, d.fib6.values().filter(|e| e.action == RouteAction::Punt { reason: reason::ECMP }).count()),
    ] {
        if fib_ecmp == 0 {
            continue;
        }
        if let Some(why) = mp_block(fam, state) {
            d.problems.push(why);
        }
    }

    d.neigh = neigh_entries(state, managed);

    let (bits, problems) = policy_punts(state, managed);
    d.switches.policy_punt |= bits;
    d.problems.extend(problems);

    // A missing neighbour punts (no_neigh) and the kernel, which has it,
    // forwards: the ones that do not fit are left out.
    let need = d.neigh.len();
    if need > caps.neigh as usize {
        d.neigh = std::mem::take(&mut d.neigh).into_iter().take(caps.neigh as usize).collect();
        d.problems.push(format!(
            "neighbour table needs {need} entries, capacity {}: {} neighbours left out (traffic to them is punted)",
            caps.neigh,
            need - caps.neigh as usize
        ));
    }
    // Interfaces are not per route: too many and both families punt.
    if d.ifaces.len() > caps.ifaces as usize {
        d.switches.table_full |= BOTH;
        d.problems.push(format!(
            "interface table needs {} entries, capacity {}: IPv4 and IPv6 punted",
            d.ifaces.len(),
            caps.ifaces
        ));
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{default_rules, ip, main_route, plain_rule};
    use crate::overflow::Offload;
    use crate::model::{
        IfSysctl, Link, Neighbour, NexthopObject, NUD_DELAY, NUD_FAILED, NUD_INCOMPLETE,
        NUD_NOARP, NUD_PERMANENT, NUD_PROBE, NUD_REACHABLE, NUD_STALE, RT_TABLE_DEFAULT,
    };

    const FASTPATH_H: &str = include_str!("../../../bpf/include/fastpath.h");

    // ---- drift checks against the C header ----

    /// The enumerators of `enum fp_reason`, in order.
    fn header_reasons() -> Vec<String> {
        let start = FASTPATH_H
            .find("enum fp_reason {")
            .expect("enum fp_reason in fastpath.h");
        let body = &FASTPATH_H[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find("};").unwrap()];
        let mut out = Vec::new();
        for line in body.lines() {
            let code = line.split("/*").next().unwrap().trim();
            for item in code.split(',') {
                let item = item.trim();
                if item.is_empty() {
                    continue;
                }
                let (name, value) = match item.split_once('=') {
                    Some((n, v)) => (n.trim(), Some(v.trim().parse::<usize>().unwrap())),
                    None => (item, None),
                };
                if let Some(v) = value {
                    assert_eq!(
                        v,
                        out.len(),
                        "{name} has an explicit value that breaks the sequence"
                    );
                }
                out.push(name.to_string());
            }
        }
        out
    }

    fn header_define(name: &str) -> u32 {
        for line in FASTPATH_H.lines() {
            let mut words = line.split_whitespace();
            if words.next() == Some("#define") && words.next() == Some(name) {
                let expr: String = words.take_while(|w| !w.starts_with("/*")).collect();
                let shift = expr.strip_prefix("(1U<<").and_then(|e| e.strip_suffix(')'));
                return shift
                    .expect("(1U << n)")
                    .parse::<u32>()
                    .map(|n| 1 << n)
                    .unwrap();
            }
        }
        panic!("{name} not in fastpath.h");
    }

    #[test]
    fn reason_values_match_header() {
        let names = header_reasons();
        assert_eq!(names[0], "FP_R_FORWARDED");
        for (name, value) in reason::ALL {
            let pos = names
                .iter()
                .position(|n| n == name)
                .unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(pos, *value as usize, "{name}");
        }
    }

    #[test]
    fn iface_flags_and_families_match_header() {
        for (name, bit) in if_flags::ALL {
            assert_eq!(header_define(name), u32::from(*bit), "{name}");
        }
        assert_eq!(header_define("FP_FAM_V4"), Family::V4.bit());
        assert_eq!(header_define("FP_FAM_V6"), Family::V6.bit());
    }

    // ---- builders ----

    fn mac(n: u8) -> [u8; 6] {
        [2, 0, 0, 0, 0, n]
    }

    fn link(ifindex: u32, name: &str) -> Link {
        Link {
            ifindex,
            name: name.into(),
            mac: Some(mac(ifindex as u8)),
            mtu: 1500,
            admin_up: true,
            running: true,
            arphrd: 1,
            kind: Some("veth".into()),
            master: None,
        }
    }

    /// lo (1), eth0 (2), eth1 (3), eth2 (4, unmanaged); forwarding on; default rules.
    fn base() -> KernelState {
        let mut st = KernelState::default();
        let mut lo = link(1, "lo");
        lo.mac = None;
        lo.arphrd = 772;
        lo.kind = None;
        lo.mtu = 65536;
        for l in [lo, link(2, "eth0"), link(3, "eth1"), link(4, "eth2")] {
            st.if_sysctl.insert(
                l.ifindex,
                IfSysctl {
                    forwarding4: true,
                    forwarding6: true,
                    rp_filter: 0,
                    mtu6: l.mtu,
                    disable_ipv6: false,
                    ..Default::default()
                },
            );
            st.links.insert(l.ifindex, l);
        }
        st.sysctl.forwarding6_all = true;
        st.rules = default_rules();
        st
    }

    fn managed() -> BTreeMap<u32, u32> {
        [(2, 1), (3, 2)].into_iter().collect()
    }

    fn caps() -> Capacities {
        Capacities {
            fib4: 1000,
            fib6: 1000,
            nexthops: 100,
            neigh: 1000,
            ifaces: 256,
            groups: 64,
            buckets: 1024,
        }
    }

    fn hop(ifindex: u32, gw: Option<&str>) -> NextHop {
        NextHop {
            ifindex,
            gateway: gw.map(ip),
            flags: 0,
            weight: 1,
        }
    }

    /// A unicast main-table route to `dst/len` with no target yet.
    fn rt(dst: &str, len: u8) -> Route {
        main_route(dst, len, RouteTarget::None)
    }

    fn via(mut r: Route, ifindex: u32, gw: Option<&str>) -> Route {
        r.target = RouteTarget::Single(hop(ifindex, gw));
        r
    }

    fn kind(mut r: Route, k: RouteKind) -> Route {
        r.kind = k;
        r
    }

    fn table(mut r: Route, t: u32) -> Route {
        r.key.table = t;
        r
    }

    fn prio(mut r: Route, p: u32) -> Route {
        r.key.priority = p;
        r
    }

    fn add(st: &mut KernelState, r: Route) {
        st.routes.insert((Family::of(&r.key.dst), r.key.clone()), r);
    }

    fn run(st: &KernelState) -> Desired {
        compute(
            st,
            &managed(),
            &caps(),
            &mut Ids::new(caps().nexthops, 64),
        )
    }

    fn r4(d: &Desired, dst: &str, len: u8) -> Option<RouteEntry> {
        let IpAddr::V4(a) = ip(dst) else { panic!() };
        d.fib4.get(&(a, len)).copied()
    }

    fn r6(d: &Desired, dst: &str, len: u8) -> Option<RouteEntry> {
        let IpAddr::V6(a) = ip(dst) else { panic!() };
        d.fib6.get(&(a, len)).copied()
    }

    fn act(d: &Desired, dst: &str, len: u8) -> RouteAction {
        let e = if dst.contains(':') {
            r6(d, dst, len)
        } else {
            r4(d, dst, len)
        };
        e.unwrap_or_else(|| panic!("no entry for {dst}/{len}"))
            .action
    }

    /// The next hop a Forward entry resolves to.
    fn fwd(d: &Desired, dst: &str, len: u8) -> NexthopEntry {
        match act(d, dst, len) {
            RouteAction::Forward { nh_id } => {
                d.nexthops.get(&nh_id).cloned().expect("nh in desired")
            }
            a => panic!("{dst}/{len}: expected forward, got {a:?}"),
        }
    }

    fn p(reason: u8) -> RouteAction {
        RouteAction::Punt { reason }
    }

    fn nh(ifindex: u32, gw: Option<&str>) -> NexthopEntry {
        NexthopEntry {
            ifindex,
            gateway: gw.map(ip),
        }
    }

    // ---- interfaces ----

    #[test]
    fn iface_flags_table() {
        struct Case {
            up: bool,
            running: bool,
            fwd4: bool,
            fwd6: bool,
            all6: bool,
            dis6: bool,
            rpf: u8,
            want: u16,
        }
        use if_flags::*;
        let c = |up, running, fwd4, fwd6, all6, dis6, rpf, want| Case {
            up,
            running,
            fwd4,
            fwd6,
            all6,
            dis6,
            rpf,
            want,
        };
        let cases = [
            c(true, true, true, true, true, false, 0, UP | FWD4 | FWD6),
            c(true, false, true, true, true, false, 0, FWD4 | FWD6),
            c(false, true, true, true, true, false, 0, FWD4 | FWD6),
            c(true, true, false, true, true, false, 0, UP | FWD6),
            c(true, true, true, false, true, false, 0, UP | FWD4),
            c(true, true, true, true, false, false, 0, UP | FWD4),
            c(true, true, true, true, true, true, 0, UP | FWD4 | V6_OFF),
            c(
                true,
                true,
                true,
                true,
                true,
                false,
                1,
                UP | FWD4 | FWD6 | RPF_STRICT,
            ),
            c(
                true,
                true,
                true,
                true,
                true,
                false,
                2,
                UP | FWD4 | FWD6 | RPF_LOOSE,
            ),
            c(false, false, false, false, false, false, 1, RPF_STRICT),
        ];
        for (i, k) in cases.iter().enumerate() {
            let mut st = base();
            let l = st.links.get_mut(&2).unwrap();
            l.admin_up = k.up;
            l.running = k.running;
            st.if_sysctl.insert(
                2,
                IfSysctl {
                    forwarding4: k.fwd4,
                    forwarding6: k.fwd6,
                    rp_filter: k.rpf,
                    mtu6: 1400,
                    disable_ipv6: k.dis6,
                    ..Default::default()
                },
            );
            st.sysctl.forwarding6_all = k.all6;
            let d = run(&st);
            assert_eq!(d.ifaces[&2].flags, k.want, "case {i}");
        }
    }

    #[test]
    fn iface_entries() {
        let mut st = base();
        st.if_sysctl.get_mut(&3).unwrap().mtu6 = 0;
        st.links.get_mut(&3).unwrap().mtu = 9000;
        st.if_sysctl.get_mut(&2).unwrap().mtu6 = 1280;
        let mut m = managed();
        m.insert(1, 7); // lo: no MAC, no entry
        m.insert(99, 8); // vanished link
        let d = compute(&st, &m, &caps(), &mut Ids::new(100, 64));
        assert_eq!(d.ifaces.keys().copied().collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(
            d.ifaces[&2],
            IfaceEntry {
                mac: mac(2),
                flags: 7,
                mtu: 1500,
                mtu6: 1280,
                slot: 1
            }
        );
        assert_eq!(
            d.ifaces[&3].mtu6, 9000,
            "mtu6 0 falls back to the device MTU"
        );
        assert_eq!(d.ifaces[&3].slot, 2);
        // no sysctls known: no forwarding flags
        st.if_sysctl.remove(&2);
        let d = run(&st);
        assert_eq!(d.ifaces[&2].flags, if_flags::UP);
        assert_eq!(d.switches, Default::default());
    }

    // ---- routes ----

    #[test]
    fn connected_and_gateway_routes() {
        let mut st = base();
        add(&mut st, via(rt("192.0.2.0", 24), 2, None));
        add(&mut st, via(rt("0.0.0.0", 0), 2, Some("192.0.2.1")));
        add(&mut st, via(rt("198.51.100.0", 24), 3, None));
        add(&mut st, via(rt("203.0.113.0", 24), 2, Some("192.0.2.1")));
        add(&mut st, via(rt("2001:db8:1::", 64), 2, None));
        add(&mut st, via(rt("::", 0), 3, Some("fe80::1")));
        // RFC 5549: IPv4 route via an IPv6 gateway
        add(&mut st, via(rt("203.0.113.128", 25), 3, Some("fe80::1")));
        let d = run(&st);
        assert_eq!(fwd(&d, "192.0.2.0", 24), nh(2, None));
        assert_eq!(fwd(&d, "0.0.0.0", 0), nh(2, Some("192.0.2.1")));
        assert_eq!(fwd(&d, "198.51.100.0", 24), nh(3, None));
        assert_eq!(fwd(&d, "2001:db8:1::", 64), nh(2, None));
        assert_eq!(fwd(&d, "::", 0), nh(3, Some("fe80::1")));
        assert_eq!(fwd(&d, "203.0.113.128", 25), nh(3, Some("fe80::1")));
        // identical next hops share one id, across families too
        assert_eq!(act(&d, "0.0.0.0", 0), act(&d, "203.0.113.0", 24));
        assert_eq!(act(&d, "::", 0), act(&d, "203.0.113.128", 25));
        assert_eq!(act(&d, "192.0.2.0", 24), act(&d, "2001:db8:1::", 64));
        assert_eq!(d.nexthops.len(), 4);
        assert!(!d.nexthops.contains_key(&0));
        assert_eq!(d.fib4.len(), 5);
        assert_eq!(d.fib6.len(), 2);
        assert_eq!(d.switches, Default::default());
        assert!(d.problems.is_empty(), "{:?}", d.problems);
    }

    #[test]
    fn host_bits_are_masked() {
        let mut st = base();
        add(&mut st, via(rt("192.0.2.77", 24), 2, None));
        let d = run(&st);
        assert!(r4(&d, "192.0.2.0", 24).is_some());
    }

    #[test]
    fn forward_via_unmanaged_interface_still_forwards() {
        let mut st = base();
        add(&mut st, via(rt("203.0.113.0", 24), 4, Some("203.0.113.1")));
        let d = run(&st);
        assert_eq!(fwd(&d, "203.0.113.0", 24), nh(4, Some("203.0.113.1")));
    }

    #[test]
    fn route_kinds() {
        use RouteKind::*;
        let cases = [
            (Local, RouteAction::Local),
            (Anycast, RouteAction::Local),
            (Broadcast, p(reason::MULTICAST)),
            (Multicast, p(reason::MULTICAST)),
            (Blackhole, RouteAction::Blackhole),
            (Unreachable, RouteAction::Unreachable),
            (Prohibit, RouteAction::Prohibit),
            (Throw, p(reason::ROUTE_UNSUPPORTED)),
            (Other(10), p(reason::ROUTE_UNSUPPORTED)),
        ];
        for (k, want) in cases {
            for (dst, len) in [("198.51.100.0", 24), ("2001:db8:5::", 48)] {
                for t in [RT_TABLE_MAIN, RT_TABLE_LOCAL] {
                    let mut st = base();
                    add(&mut st, table(kind(rt(dst, len), k), t));
                    let d = run(&st);
                    assert_eq!(act(&d, dst, len), want, "{k:?} {dst} table {t}");
                    assert!(d.nexthops.is_empty());
                }
            }
        }
        // a unicast route with no next hop at all
        let mut st = base();
        add(&mut st, rt("198.51.100.0", 24));
        assert_eq!(
            act(&run(&st), "198.51.100.0", 24),
            p(reason::ROUTE_UNSUPPORTED)
        );
    }

    #[test]
    fn typical_local_table() {
        let mut st = base();
        let local = |dst, len, k| table(kind(via(rt(dst, len), 2, None), k), RT_TABLE_LOCAL);
        add(&mut st, local("192.0.2.10", 32, RouteKind::Local));
        add(&mut st, local("192.0.2.255", 32, RouteKind::Broadcast));
        add(&mut st, local("127.0.0.0", 8, RouteKind::Local));
        add(&mut st, local("2001:db8:1::10", 128, RouteKind::Local));
        add(&mut st, local("2001:db8:1::", 128, RouteKind::Anycast));
        add(&mut st, local("ff00::", 8, RouteKind::Multicast));
        add(&mut st, via(rt("192.0.2.0", 24), 2, None));
        add(&mut st, via(rt("2001:db8:1::", 64), 2, None));
        let d = run(&st);
        assert_eq!(act(&d, "192.0.2.10", 32), RouteAction::Local);
        assert_eq!(act(&d, "192.0.2.255", 32), p(reason::MULTICAST));
        assert_eq!(act(&d, "127.0.0.0", 8), RouteAction::Local);
        assert_eq!(act(&d, "2001:db8:1::10", 128), RouteAction::Local);
        assert_eq!(act(&d, "2001:db8:1::", 128), RouteAction::Local);
        assert_eq!(act(&d, "ff00::", 8), p(reason::MULTICAST));
        assert_eq!(fwd(&d, "192.0.2.0", 24), nh(2, None));
        assert_eq!(fwd(&d, "2001:db8:1::", 64), nh(2, None));
        assert_eq!(d.nexthops.len(), 1, "local routes need no next hop");
    }

    #[test]
    fn source_deny_set_and_src_lpm_switch() {
        let mut st = base();
        let local = |dst, len, k| table(kind(via(rt(dst, len), 2, None), k), RT_TABLE_LOCAL);
        add(&mut st, local("192.0.2.10", 32, RouteKind::Local));
        add(&mut st, local("192.0.2.255", 32, RouteKind::Broadcast));
        add(&mut st, local("127.0.0.0", 8, RouteKind::Local));
        add(&mut st, via(rt("192.0.2.0", 24), 2, None));
        add(&mut st, kind(rt("198.51.100.66", 32), RouteKind::Blackhole));
        add(&mut st, kind(rt("224.0.0.0", 4), RouteKind::Unreachable));
        // An address whose local route is gone is still refused by the kernel.
        st.addrs.insert(
            crate::model::Addr {
                ifindex: 2,
                addr: ip("203.0.113.9"),
                prefix_len: 24,
            },
            (),
        );
        let d = run(&st);
        let a = |s: &str| -> Ipv4Addr { s.parse().unwrap() };
        assert_eq!(d.switches.src_lpm, 0, "only /32s and punted classes: the hash suffices");
        assert_eq!(d.src_deny4.get(&a("192.0.2.10")), Some(&reason::MARTIAN));
        assert_eq!(d.src_deny4.get(&a("192.0.2.255")), Some(&reason::RP_FILTER));
        assert_eq!(d.src_deny4.get(&a("198.51.100.66")), Some(&reason::RP_FILTER));
        assert_eq!(d.src_deny4.get(&a("203.0.113.9")), Some(&reason::MARTIAN));
        assert!(!d.src_deny4.contains_key(&a("192.0.2.0")));

        // A shorter reject prefix outside the punted classes needs the LPM;
        // the deny set is then not kept.
        let mut st2 = st.clone();
        add(&mut st2, kind(rt("10.0.0.0", 8), RouteKind::Blackhole));
        let d = run(&st2);
        assert_eq!(d.switches.src_lpm, Family::V4.bit());
        assert!(d.src_deny4.is_empty());
        assert!(d.problems.is_empty(), "src_lpm is a mode, not a problem");

        // ECMP sources are unicast: no LPM needed for them.
        let mut st3 = st.clone();
        let mut m = via(rt("10.0.0.0", 8), 2, Some("192.0.2.1"));
        m.target = RouteTarget::Multipath(vec![hop(2, Some("192.0.2.1")), hop(2, Some("192.0.2.2"))]);
        add(&mut st3, m);
        let d = run(&st3);
        assert_eq!(act(&d, "10.0.0.0", 8), p(reason::ECMP));
        assert_eq!(d.switches.src_lpm, 0);

        // A deny set larger than the map falls back to the LPM too.
        let mut c = caps();
        c.fib4 = 3;
        let mut ids = Ids::new(c.nexthops, 64);
        let d = compute(&st, &managed(), &c, &mut ids);
        assert_eq!(d.switches.src_lpm, Family::V4.bit());
        assert!(d.src_deny4.is_empty());
    }

    #[test]
    fn local_table_covers_longer_main_routes() {
        let mut st = base();
        let local = |dst, len| {
            table(
                kind(via(rt(dst, len), 1, None), RouteKind::Local),
                RT_TABLE_LOCAL,
            )
        };
        // AnyIP: a whole /24 (and a /48) local
        add(&mut st, local("198.51.100.0", 24));
        add(&mut st, local("2001:db8:7::", 48));
        // main routes inside them, equal to them, and around them
        add(&mut st, via(rt("198.51.100.128", 25), 2, Some("192.0.2.1")));
        add(&mut st, via(rt("198.51.100.7", 32), 3, None));
        add(&mut st, via(rt("198.51.100.0", 24), 2, Some("192.0.2.1")));
        add(&mut st, via(rt("198.51.0.0", 16), 2, Some("192.0.2.1")));
        add(&mut st, via(rt("2001:db8:7:1::", 64), 2, Some("fe80::1")));
        add(&mut st, via(rt("2001:db8::", 32), 2, Some("fe80::1")));
        // a host local route longer than a main one: plain LPM already right
        add(&mut st, local("192.0.2.10", 32));
        add(&mut st, via(rt("192.0.2.0", 24), 2, None));
        let d = run(&st);
        assert_eq!(
            act(&d, "198.51.100.0", 24),
            RouteAction::Local,
            "local wins an identical prefix"
        );
        assert_eq!(act(&d, "198.51.100.128", 25), RouteAction::Local);
        assert_eq!(act(&d, "198.51.100.7", 32), RouteAction::Local);
        assert_eq!(
            fwd(&d, "198.51.0.0", 16),
            nh(2, Some("192.0.2.1")),
            "shorter main route stays"
        );
        assert_eq!(act(&d, "2001:db8:7::", 48), RouteAction::Local);
        assert_eq!(act(&d, "2001:db8:7:1::", 64), RouteAction::Local);
        assert_eq!(fwd(&d, "2001:db8::", 32), nh(2, Some("fe80::1")));
        assert_eq!(act(&d, "192.0.2.10", 32), RouteAction::Local);
        assert_eq!(fwd(&d, "192.0.2.0", 24), nh(2, None));
        assert_eq!(d.fib4.len(), 6);
        assert_eq!(d.fib6.len(), 3);
        // only next hops of entries that still forward are wanted
        assert_eq!(d.nexthops.len(), 3);
    }

    #[test]
    fn local_cover_takes_the_longest_local_prefix() {
        let mut st = base();
        let lt = |r| table(r, RT_TABLE_LOCAL);
        add(&mut st, lt(kind(rt("10.0.0.0", 8), RouteKind::Local)));
        add(&mut st, lt(kind(rt("10.1.0.0", 16), RouteKind::Broadcast)));
        add(&mut st, via(rt("10.1.2.0", 24), 2, None));
        add(&mut st, via(rt("10.2.2.0", 24), 2, None));
        let d = run(&st);
        assert_eq!(act(&d, "10.1.2.0", 24), p(reason::MULTICAST));
        assert_eq!(act(&d, "10.2.2.0", 24), RouteAction::Local);
    }

    #[test]
    fn forwarding_local_table_route_over_main_route() {
        // A unicast route someone put in table local, covering a different
        // main route: IPv6 takes local first; IPv4 depends on whether the
        // tables are merged (invisible to netlink), so punt.
        let mut st = base();
        add(
            &mut st,
            table(
                via(rt("198.51.100.0", 24), 2, Some("192.0.2.1")),
                RT_TABLE_LOCAL,
            ),
        );
        add(&mut st, via(rt("198.51.100.0", 25), 3, Some("203.0.113.1")));
        add(&mut st, via(rt("198.51.100.128", 25), 2, Some("192.0.2.1"))); // same as local: fine
        add(
            &mut st,
            table(
                via(rt("2001:db8:9::", 48), 2, Some("fe80::1")),
                RT_TABLE_LOCAL,
            ),
        );
        add(&mut st, via(rt("2001:db8:9:1::", 64), 3, Some("fe80::2")));
        let d = run(&st);
        assert_eq!(fwd(&d, "198.51.100.0", 24), nh(2, Some("192.0.2.1")));
        assert_eq!(act(&d, "198.51.100.0", 25), p(reason::ROUTE_UNSUPPORTED));
        assert_eq!(fwd(&d, "198.51.100.128", 25), nh(2, Some("192.0.2.1")));
        assert_eq!(fwd(&d, "2001:db8:9:1::", 64), nh(2, Some("fe80::1")));
        assert!(
            !d.nexthops.values().any(|n| n.ifindex == 3),
            "unused next hops are not wanted"
        );
    }

    #[test]
    fn other_tables_are_ignored() {
        let mut st = base();
        add(&mut st, table(via(rt("198.51.100.0", 24), 2, None), 100));
        add(
            &mut st,
            table(
                via(rt("0.0.0.0", 0), 2, Some("192.0.2.1")),
                RT_TABLE_DEFAULT,
            ),
        );
        add(&mut st, table(via(rt("2001:db8::", 32), 2, None), 100));
        let d = run(&st);
        assert!(d.fib4.is_empty() && d.fib6.is_empty() && d.nexthops.is_empty());
        assert_eq!(
            d.switches,
            Default::default(),
            "routes in table 253 do not matter"
        );
    }

    #[test]
    fn lowest_metric_wins() {
        let mut st = base();
        add(
            &mut st,
            prio(via(rt("198.51.100.0", 24), 2, Some("192.0.2.1")), 200),
        );
        add(
            &mut st,
            prio(via(rt("198.51.100.0", 24), 3, Some("203.0.113.1")), 100),
        );
        add(
            &mut st,
            prio(kind(rt("198.51.100.0", 24), RouteKind::Unreachable), 300),
        );
        add(&mut st, prio(via(rt("2001:db8:1::", 64), 2, None), 1024));
        add(
            &mut st,
            prio(kind(rt("2001:db8:1::", 64), RouteKind::Blackhole), 256),
        );
        let d = run(&st);
        assert_eq!(fwd(&d, "198.51.100.0", 24), nh(3, Some("203.0.113.1")));
        assert_eq!(act(&d, "2001:db8:1::", 64), RouteAction::Blackhole);
        assert_eq!(d.nexthops.len(), 1);
    }

    #[test]
    fn equal_metric_in_one_table_is_ecmp() {
        let st = base();
        let a = prio(via(rt("2001:db8:1::", 64), 2, Some("fe80::1")), 1024);
        let b = prio(via(rt("2001:db8:1::", 64), 3, Some("fe80::2")), 1024);
        let c = prio(via(rt("2001:db8:1::", 64), 3, Some("fe80::3")), 2048);
        assert_eq!(select(Family::V6, &[&a, &b, &c], &st), punt(reason::ECMP));
        assert!(matches!(
            select(Family::V6, &[&a, &c], &st),
            Intent::Forward { .. }
        ));
        assert_eq!(
            select(Family::V6, &[], &st),
            punt(reason::ROUTE_UNSUPPORTED)
        );
    }

    #[test]
    fn tos_routes_punt_the_prefix() {
        let mut st = base();
        let mut t = via(rt("198.51.100.0", 24), 3, None);
        t.key.tos = 0x10;
        add(&mut st, t);
        add(&mut st, via(rt("198.51.100.0", 24), 2, None));
        add(&mut st, via(rt("198.51.0.0", 16), 2, None));
        let d = run(&st);
        assert_eq!(act(&d, "198.51.100.0", 24), p(reason::ROUTE_UNSUPPORTED));
        assert_eq!(fwd(&d, "198.51.0.0", 16), nh(2, None));
        // only a tos route for the prefix: still punted, never the /16
        let mut st = base();
        let mut t = via(rt("198.51.100.0", 24), 3, None);
        t.key.tos = 0x10;
        add(&mut st, t);
        add(&mut st, via(rt("198.51.0.0", 16), 2, None));
        assert_eq!(
            act(&run(&st), "198.51.100.0", 24),
            p(reason::ROUTE_UNSUPPORTED)
        );
    }

    fn obj(id: u32) -> NexthopObject {
        NexthopObject {
            id,
            blackhole: false,
            hop: None,
            group: vec![],
            resilient: false,
            n_buckets: 0,
            unsupported: false,
        }
    }

    #[test]
    fn prefix_last_address() {
        let last4 = |a: &str, l| Prefix::new(Family::V4, &ip(a), l).unwrap().last(Family::V4).v4();
        let last6 = |a: &str, l| Prefix::new(Family::V6, &ip(a), l).unwrap().last(Family::V6).v6();
        assert_eq!(last4("198.51.100.0", 25), ("198.51.100.127".parse().unwrap(), 32));
        assert_eq!(last4("0.0.0.0", 0), ("255.255.255.255".parse().unwrap(), 32));
        assert_eq!(last4("192.0.2.7", 32), ("192.0.2.7".parse().unwrap(), 32));
        assert_eq!(last6("2001:db8::", 32), ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap(), 128));
        assert_eq!(last6("2001:db8::1", 128), ("2001:db8::1".parse().unwrap(), 128));
    }

    /// A carrier flap must not rewrite every route through the link: while
    /// the link is down its interface entry punts them (no FP_IF_UP), so a
    /// link-down route keeps its forward entry; only a link-down flag on a
    /// link that is up (a route from before the link came back) is punted.
    #[test]
    fn link_down_routes_keep_their_entries_while_the_link_is_down() {
        let mut st = base();
        let mut h = hop(3, Some("203.0.113.1"));
        h.flags = RTNH_F_LINKDOWN;
        let mut r = rt("10.0.2.0", 24);
        r.target = RouteTarget::Single(h);
        add(&mut st, r);
        add(&mut st, via(rt("10.0.3.0", 24), 3, Some("203.0.113.1")));
        let up = run(&st);
        assert_eq!(act(&up, "10.0.2.0", 24), p(reason::ROUTE_UNSUPPORTED));
        for (admin_up, running) in [(true, false), (false, false)] {
            let mut down = st.clone();
            let l = down.links.get_mut(&3).unwrap();
            (l.admin_up, l.running) = (admin_up, running);
            let d = run(&down);
            assert_eq!(fwd(&d, "10.0.2.0", 24), nh(3, Some("203.0.113.1")));
            // The interface entry is what punts them now.
            assert_eq!(d.ifaces[&3].flags & if_flags::UP, 0);
            assert_eq!(d.fib4, {
                let mut no_flag = down.clone();
                for r in no_flag.routes.values_mut() {
                    if let RouteTarget::Single(h) = &mut r.target {
                        h.flags = 0;
                    }
                }
                run(&no_flag).fib4
            });
        }
    }

    #[test]
    fn targets() {
        let mut st = base();
        st.nexthops.insert(
            10,
            NexthopObject {
                hop: Some(hop(2, Some("192.0.2.1"))),
                ..obj(10)
            },
        );
        st.nexthops.insert(
            11,
            NexthopObject {
                hop: Some(hop(3, Some("203.0.113.1"))),
                ..obj(11)
            },
        );
        st.nexthops.insert(
            12,
            NexthopObject {
                group: vec![(10, 1), (11, 1)],
                ..obj(12)
            },
        );
        st.nexthops.insert(
            13,
            NexthopObject {
                blackhole: true,
                ..obj(13)
            },
        );
        st.nexthops.insert(
            14,
            NexthopObject {
                hop: Some(hop(2, None)),
                unsupported: true,
                ..obj(14)
            },
        );
        st.nexthops.insert(
            15,
            NexthopObject {
                group: vec![(10, 1)],
                resilient: true,
                ..obj(15)
            },
        );
        let mut dead = hop(2, Some("192.0.2.9"));
        dead.flags = RTNH_F_DEAD;
        st.nexthops.insert(
            16,
            NexthopObject {
                hop: Some(dead),
                ..obj(16)
            },
        );
        st.nexthops.insert(17, obj(17)); // neither hop nor group

        let with = |dst: &str, t: RouteTarget| {
            let mut r = rt(dst, 24);
            r.target = t;
            r
        };
        let mut linkdown = hop(3, Some("203.0.113.1"));
        linkdown.flags = RTNH_F_LINKDOWN;
        let mut dead = hop(3, Some("203.0.113.1"));
        dead.flags = RTNH_F_DEAD | 4;
        let mut onlink = hop(3, Some("198.51.100.1"));
        onlink.flags = 4; // RTNH_F_ONLINK is fine
        let cases: Vec<(&str, RouteTarget, Result<NexthopEntry, RouteAction>)> = vec![
            (
                "10.0.1.0",
                RouteTarget::Single(hop(2, Some("192.0.2.1"))),
                Ok(nh(2, Some("192.0.2.1"))),
            ),
            (
                "10.0.2.0",
                RouteTarget::Single(linkdown),
                Err(p(reason::ROUTE_UNSUPPORTED)),
            ),
            (
                "10.0.3.0",
                RouteTarget::Single(dead),
                Err(p(reason::ROUTE_UNSUPPORTED)),
            ),
            (
                "10.0.4.0",
                RouteTarget::Single(hop(0, Some("192.0.2.1"))),
                Err(p(reason::ROUTE_UNSUPPORTED)),
            ),
            (
                "10.0.5.0",
                RouteTarget::Single(onlink),
                Ok(nh(3, Some("198.51.100.1"))),
            ),
            (
                "10.0.6.0",
                RouteTarget::Multipath(vec![
                    hop(2, Some("192.0.2.1")),
                    hop(3, Some("203.0.113.1")),
                ]),
                Err(p(reason::ECMP)),
            ),
            (
                "10.0.7.0",
                RouteTarget::Multipath(vec![hop(3, None)]),
                Ok(nh(3, None)),
            ),
            (
                "10.0.8.0",
                RouteTarget::Multipath(vec![]),
                Err(p(reason::ROUTE_UNSUPPORTED)),
            ),
            (
                "10.1.0.0",
                RouteTarget::Object(10),
                Ok(nh(2, Some("192.0.2.1"))),
            ),
            ("10.1.1.0", RouteTarget::Object(12), Err(p(reason::ECMP))),
            (
                "10.1.2.0",
                RouteTarget::Object(13),
                Err(RouteAction::Blackhole),
            ),
            (
                "10.1.3.0",
                RouteTarget::Object(14),
                Err(p(reason::ROUTE_UNSUPPORTED)),
            ),
            ("10.1.4.0", RouteTarget::Object(15), Err(p(reason::ECMP))),
            (
                "10.1.5.0",
                RouteTarget::Object(16),
                Err(p(reason::ROUTE_UNSUPPORTED)),
            ),
            (
                "10.1.6.0",
                RouteTarget::Object(17),
                Err(p(reason::ROUTE_UNSUPPORTED)),
            ),
            (
                "10.1.7.0",
                RouteTarget::Object(99),
                Err(p(reason::ROUTE_UNSUPPORTED)),
            ),
        ];
        for (dst, target, _) in &cases {
            add(&mut st, with(dst, target.clone()));
        }
        let d = run(&st);
        for (dst, _, want) in &cases {
            match want {
                Ok(n) => assert_eq!(&fwd(&d, dst, 24), n, "{dst}"),
                Err(a) => assert_eq!(act(&d, dst, 24), *a, "{dst}"),
            }
        }
        // the object's hop and the inline hop with the same content share an id
        assert_eq!(act(&d, "10.0.1.0", 24), act(&d, "10.1.0.0", 24));
        assert_eq!(d.nexthops.len(), 3);
    }

    #[test]
    fn mtu_lock_pmtu_and_encap() {
        let mut st = base();
        let mut m = via(rt("198.51.100.0", 24), 2, None);
        m.mtu = 1400;
        add(&mut st, m.clone());
        let mut m6 = via(rt("2001:db8:1::", 64), 2, None);
        m6.mtu = 1400;
        add(&mut st, m6.clone());
        let mut locked = via(rt("203.0.113.0", 24), 2, None);
        locked.mtu = 1300;
        locked.mtu_locked = true;
        add(&mut st, locked);
        let mut locked6 = via(rt("2001:db8:2::", 64), 2, None);
        locked6.mtu_locked = true;
        add(&mut st, locked6);
        let mut enc = via(rt("192.0.2.0", 24), 2, None);
        enc.encap = true;
        add(&mut st, enc);
        let mut enc6 = via(rt("2001:db8:3::", 64), 2, None);
        enc6.encap = true;
        add(&mut st, enc6);
        let d = run(&st);
        assert_eq!(
            r4(&d, "198.51.100.0", 24).unwrap().mtu,
            1400,
            "IPv4 honours the route MTU"
        );
        assert_eq!(
            r6(&d, "2001:db8:1::", 64).unwrap().mtu,
            1400,
            "IPv6 honours an unlocked route MTU too (checked on 6.18: Packet Too Big at the route MTU)"
        );
        assert_eq!(act(&d, "2001:db8:1::", 64), act(&d, "198.51.100.0", 24));
        assert_eq!(act(&d, "203.0.113.0", 24), p(reason::ROUTE_UNSUPPORTED));
        assert_eq!(act(&d, "2001:db8:2::", 64), p(reason::ROUTE_UNSUPPORTED));
        assert_eq!(act(&d, "192.0.2.0", 24), p(reason::ROUTE_UNSUPPORTED));
        assert_eq!(act(&d, "2001:db8:3::", 64), p(reason::ROUTE_UNSUPPORTED));

        // ip_forward_use_pmtu: every IPv4 forward punts, IPv6 and non-forward routes do not care
        st.sysctl.ip_forward_use_pmtu = true;
        add(&mut st, kind(rt("10.9.0.0", 16), RouteKind::Blackhole));
        let d = run(&st);
        assert_eq!(act(&d, "198.51.100.0", 24), p(reason::ROUTE_UNSUPPORTED));
        assert_eq!(act(&d, "10.9.0.0", 16), RouteAction::Blackhole);
        assert!(matches!(
            act(&d, "2001:db8:1::", 64),
            RouteAction::Forward { .. }
        ));
    }

    // ---- neighbours ----

    #[test]
    fn neighbour_states() {
        let cases = [
            (NUD_REACHABLE, true),
            (NUD_STALE, true),
            (NUD_DELAY, true),
            (NUD_PROBE, true),
            (NUD_PERMANENT, true),
            (NUD_INCOMPLETE, false),
            (NUD_FAILED, false),
            (NUD_NOARP, false),
            (0, false),
        ];
        for (state, usable) in cases {
            for addr in ["192.0.2.1", "fe80::1"] {
                let mut st = base();
                st.neighbours.insert(
                    (2, ip(addr)),
                    Neighbour {
                        ifindex: 2,
                        addr: ip(addr),
                        mac: Some(mac(9)),
                        state,
                        flags: 0,
                    },
                );
                let d = run(&st);
                let k = NeighKey {
                    ifindex: 2,
                    addr: ip(addr),
                };
                assert_eq!(d.neigh.contains_key(&k), usable, "state {state:#x} {addr}");
                if usable {
                    assert_eq!(d.neigh[&k], NeighEntry { mac: mac(9) });
                }
            }
        }
        let mut st = base();
        let n = |ifindex, m| Neighbour {
            ifindex,
            addr: ip("192.0.2.1"),
            mac: m,
            state: NUD_REACHABLE,
            flags: 0,
        };
        st.neighbours.insert((2, ip("192.0.2.1")), n(2, None));
        st.neighbours
            .insert((4, ip("192.0.2.1")), n(4, Some(mac(9))));
        st.neighbours
            .insert((3, ip("192.0.2.1")), n(3, Some(mac(8))));
        let d = run(&st);
        assert_eq!(
            d.neigh.keys().map(|k| k.ifindex).collect::<Vec<_>>(),
            vec![3],
            "no MAC / unmanaged dropped"
        );
    }

    // ---- policy ----

    #[test]
    fn policy_rules() {
        let both = Family::V4.bit() | Family::V6.bit();
        let mut cases: Vec<(&str, Vec<Rule>, u32)> = vec![("defaults", default_rules(), 0)];
        let mut extra4 = default_rules();
        extra4.push(plain_rule(Family::V4, 100, 10));
        cases.push(("extra v4 rule", extra4, Family::V4.bit()));
        let mut extra6 = default_rules();
        extra6.push(plain_rule(Family::V6, 32765, 254));
        cases.push(("extra v6 rule", extra6, Family::V6.bit()));
        let mut missing4 = default_rules();
        missing4.retain(|r| !(r.family == Family::V4 && r.priority == 32767));
        cases.push(("v4 default rule deleted", missing4, Family::V4.bit()));
        let mut missing6 = default_rules();
        missing6.retain(|r| r.family != Family::V6);
        cases.push(("no v6 rules", missing6, Family::V6.bit()));
        let mut sel = default_rules();
        sel[1].has_selectors = true;
        cases.push(("selector on main rule", sel, Family::V4.bit()));
        let mut inv = default_rules();
        inv[3].invert = true;
        cases.push(("inverted v6 local rule", inv, Family::V6.bit()));
        let mut goto = default_rules();
        goto[1].action = 2;
        cases.push(("goto instead of lookup", goto, Family::V4.bit()));
        let mut dup = default_rules();
        dup.push(plain_rule(Family::V4, 32766, 254));
        cases.push(("duplicate rule", dup, Family::V4.bit()));
        let mut moved = default_rules();
        moved[1].priority = 1000;
        cases.push(("main rule moved", moved, Family::V4.bit()));
        let mut bh = default_rules();
        bh.push(Rule {
            action: 6,
            ..plain_rule(Family::V6, 10, 0)
        });
        bh.push(plain_rule(Family::V4, 5, 100));
        cases.push(("both", bh, both));
        for (name, rules, want) in cases {
            let mut st = base();
            st.rules = rules;
            add(&mut st, via(rt("198.51.100.0", 24), 2, None));
            let d = run(&st);
            assert_eq!(d.switches.policy_punt, want, "{name}");
            assert_eq!(d.switches.table_full, 0, "{name}");
            assert_eq!(
                d.problems.len(),
                want.count_ones() as usize,
                "{name}: {:?}",
                d.problems
            );
            assert_eq!(d.fib4.len(), 1, "{name}: tables are still computed");
        }
        let mut st = base();
        st.rules.push(plain_rule(Family::V4, 100, 10));
        let d = run(&st);
        assert!(d.problems[0].contains("100: table 10"), "{:?}", d.problems);
        assert!(d.problems[0].ends_with("IPv4 punted"), "{:?}", d.problems);
    }

    #[test]
    fn vrf_slave_punts_both_families() {
        let mut st = base();
        let mut vrf = link(10, "blue");
        vrf.kind = Some("vrf".into());
        st.links.insert(10, vrf);
        let mut br = link(11, "br0");
        br.kind = Some("bridge".into());
        st.links.insert(11, br);
        st.links.get_mut(&3).unwrap().master = Some(11);
        let d = run(&st);
        assert_eq!(d.switches.policy_punt, 0, "a bridge master is not a VRF");
        st.links.get_mut(&4).unwrap().master = Some(10);
        assert_eq!(run(&st).switches.policy_punt, 0, "unmanaged VRF slave");
        st.links.get_mut(&2).unwrap().master = Some(10);
        let d = run(&st);
        assert_eq!(d.switches.policy_punt, 3);
        assert_eq!(d.problems[0], "eth0 is enslaved to VRF blue: IPv4 and IPv6 punted");
        // A VRF member keeps its interface's permissions.
        assert_eq!(d.ifaces[&2].flags & if_flags::UP, if_flags::UP);
    }

    #[test]
    fn bridge_or_bond_port_forwards_nothing_in_or_out() {
        let mut st = base();
        st.if_sysctl.get_mut(&3).unwrap().rp_filter = 2;
        let before = run(&st).ifaces[&3].flags;
        assert_eq!(before & (if_flags::UP | if_flags::FWD4 | if_flags::FWD6), if_flags::UP | if_flags::FWD4 | if_flags::FWD6);
        for kind in [Some("bridge"), Some("bond"), None] {
            let mut st = st.clone();
            let mut m = link(11, "m0");
            m.kind = kind.map(Into::into);
            st.links.insert(11, m);
            st.links.get_mut(&3).unwrap().master = Some(11);
            let d = run(&st);
            // Only its rp_filter is left: every permission is gone.
            assert_eq!(d.ifaces[&3].flags, if_flags::RPF_LOOSE, "{kind:?}");
            assert_eq!(d.switches.policy_punt, 0, "{kind:?}");
            assert_eq!(d.problems.len(), 1, "{kind:?}: {:?}", d.problems);
            assert!(d.problems[0].starts_with("eth1 is a port of m0"), "{:?}", d.problems);
            // Ahead of the recompute too: the lost permissions are restrictions.
            let applied: BTreeMap<u32, IfaceEntry> = run(&st_without_master(&st)).ifaces;
            let r = crate::iface_restrict::restrictions(&applied, &st);
            assert_eq!(r, vec![(3, d.ifaces[&3].clone())], "{kind:?}");
        }
        // A master we have not seen yet (its link message still to come) counts too.
        st.links.get_mut(&3).unwrap().master = Some(99);
        let d = run(&st);
        assert_eq!(d.ifaces[&3].flags, if_flags::RPF_LOOSE);
        assert!(d.problems[0].starts_with("eth1 is a port of ifindex 99 (master)"), "{:?}", d.problems);
    }

    fn st_without_master(st: &KernelState) -> KernelState {
        let mut st = st.clone();
        for l in st.links.values_mut() {
            l.master = None;
        }
        st
    }

    // ---- capacity ----

    fn many_routes(st: &mut KernelState, n4: u32, n6: u32, hops: u32) {
        for i in 0..n4 {
            let gw = format!("192.0.2.{}", i % hops + 1);
            add(
                st,
                via(
                    rt(&format!("10.{}.{}.0", i / 256, i % 256), 24),
                    2,
                    Some(&gw),
                ),
            );
        }
        for i in 0..n6 {
            add(st, via(rt(&format!("2001:db8:{i:x}::"), 48), 3, None));
        }
    }

    #[test]
    fn capacity_overflow() {
        let mut st = base();
        many_routes(&mut st, 10, 4, 3);
        let c = Capacities {
            fib4: 10,
            fib6: 4,
            nexthops: 5,
            neigh: 2,
            ifaces: 2,
            groups: 64,
            buckets: 1024,
        };
        let d = compute(&st, &managed(), &c, &mut Ids::new(5, 64));
        assert_eq!(d.switches.table_full, 0, "{:?}", d.problems);
        assert_eq!(d.offload, Offload::default());

        // one /24 too many: the last one stays out; nothing covers it, so
        // nothing else changes (a miss punts)
        let c9 = Capacities { fib4: 9, ..c };
        let d = compute(&st, &managed(), &c9, &mut Ids::new(5, 64));
        assert_eq!(d.switches.table_full, 0);
        assert_eq!(
            d.problems,
            vec!["IPv4 FIB needs 10 entries, capacity 9: 1 routes not offloaded (their traffic goes to the kernel)".to_string()]
        );
        assert_eq!(d.fib4.len(), 9);
        assert!(r4(&d, "10.0.9.0", 24).is_none());
        assert_eq!(d.offload.failed4, [(Ipv4Addr::new(10, 0, 9, 0), 24)].into_iter().collect());
        assert!(d.offload.covers4.is_empty());
        assert_eq!(d.fib6.len(), 4, "the other family is untouched");

        let c3 = Capacities { fib6: 3, ..c };
        let d = compute(&st, &managed(), &c3, &mut Ids::new(5, 64));
        assert_eq!(d.switches.table_full, 0);
        assert_eq!(d.fib6.len(), 3);
        assert_eq!(d.offload.failed6.len(), 1);
        assert_eq!(d.offload.failed(), 1);

        // 4 next hops + the unused id 0 do not fit 4: the routes of the
        // next hop without an id punt by themselves, nothing else does
        let c4 = Capacities { nexthops: 4, ..c };
        let d = compute(&st, &managed(), &c4, &mut Ids::new(4, 64));
        assert_eq!(d.switches.table_full, 0);
        assert!(d
            .problems
            .iter()
            .any(|p| p == "next-hop table needs 5 entries, capacity 4: routes whose next hop found no slot are punted (offload failed)"));
        let punted = d
            .fib4
            .values()
            .chain(d.fib6.values())
            .filter(|e| e.action == p(reason::TABLE_FULL))
            .count();
        assert!(punted > 0);
        assert_eq!(d.offload.failed(), punted);
        assert!(d.nexthops.keys().all(|id| *id >= 1 && *id < 4));
        assert!(d.fib4.values().chain(d.fib6.values()).all(|e| match e.action {
            RouteAction::Forward { nh_id } => d.nexthops.contains_key(&nh_id),
            _ => true,
        }));

        // neighbours beyond the table are left out (a missing one punts)
        for i in 0..3u8 {
            let a = ip(&format!("192.0.2.{}", i + 1));
            st.neighbours.insert(
                (2, a),
                Neighbour {
                    ifindex: 2,
                    addr: a,
                    mac: Some(mac(i)),
                    state: NUD_STALE,
                    flags: 0,
                },
            );
        }
        let d = compute(&st, &managed(), &c, &mut Ids::new(5, 64));
        assert_eq!(d.switches.table_full, 0);
        assert_eq!(
            d.problems,
            vec!["neighbour table needs 3 entries, capacity 2: 1 neighbours left out (traffic to them is punted)".to_string()]
        );
        assert_eq!(d.neigh.len(), 2);

        // interfaces are the one table that still punts whole families
        let c1 = Capacities { ifaces: 1, ..c };
        let d = compute(&st, &managed(), &c1, &mut Ids::new(5, 64));
        assert_eq!(d.switches.table_full, 3);
    }

    /// Every address decided by the full FIB and by `d` (trimmed): `d`
    /// punts it or forwards it the same way. None = punt.
    fn way(d: &Desired, a: IpAddr) -> Option<RouteAction> {
        let e = match a {
            IpAddr::V4(_) => (0..=32u8).rev().find_map(|l| d.fib4.get(&Prefix::new(Family::V4, &a, l).unwrap().v4())),
            IpAddr::V6(_) => (0..=128u8).rev().find_map(|l| d.fib6.get(&Prefix::new(Family::V6, &a, l).unwrap().v6())),
        }?;
        match e.action {
            RouteAction::Forward { nh_id } => Some(RouteAction::Forward { nh_id }),
            RouteAction::Multipath { group } => Some(RouteAction::Multipath { group }),
            _ => None,
        }
    }

    fn nh_of(d: &Desired, a: Option<RouteAction>) -> Option<NexthopEntry> {
        match a? {
            RouteAction::Forward { nh_id } => d.nexthops.get(&nh_id).cloned(),
            _ => None,
        }
    }

    #[test]
    fn overflow_punts_the_nearest_cover_and_recovers_after_a_delete() {
        let mut st = base();
        add(&mut st, via(rt("0.0.0.0", 0), 2, Some("192.0.2.1")));
        add(&mut st, via(rt("198.51.100.0", 24), 2, Some("192.0.2.2")));
        add(&mut st, via(rt("198.51.100.0", 25), 3, Some("203.0.113.1")));
        add(&mut st, via(rt("198.51.100.0", 26), 3, Some("203.0.113.2")));
        add(&mut st, via(rt("203.0.113.0", 24), 3, None));
        add(&mut st, via(rt("2001:db8::", 32), 2, Some("fe80::1")));
        add(&mut st, via(rt("2001:db8:1::", 48), 3, Some("fe80::2")));
        add(&mut st, via(rt("2001:db8:1:1::", 64), 3, Some("fe80::3")));
        let c = Capacities { fib4: 3, fib6: 2, ..caps() };
        let mut ids = Ids::new(100, 64);
        let d = compute(&st, &managed(), &c, &mut ids);
        let k4 = |a: &str, l: u8| (a.parse::<Ipv4Addr>().unwrap(), l);
        let k6 = |a: &str, l: u8| (a.parse::<Ipv6Addr>().unwrap(), l);
        // shortest first: 0/0 and both /24s stay; the /25 and /26 share the /24 as cover
        assert_eq!(d.fib4.len(), 3);
        assert_eq!(d.offload.failed4, [k4("198.51.100.0", 25), k4("198.51.100.0", 26)].into_iter().collect());
        assert_eq!(d.offload.covers4, [k4("198.51.100.0", 24)].into_iter().collect());
        assert_eq!(act(&d, "198.51.100.0", 24), p(reason::TABLE_FULL));
        assert_eq!(fwd(&d, "0.0.0.0", 0), nh(2, Some("192.0.2.1")), "only the nearest cover punts");
        assert_eq!(fwd(&d, "203.0.113.0", 24), nh(3, None));
        assert_eq!(d.offload.status4(&k4("198.51.100.0", 24)), overflow::PUNTED_COVER);
        assert_eq!(d.offload.status4(&k4("198.51.100.0", 25)), overflow::FAILED);
        assert_eq!(d.offload.status4(&k4("203.0.113.0", 24)), overflow::OK);
        // left-out routes take no next-hop id
        assert!(!d.nexthops.values().any(|n| n.gateway == Some(ip("203.0.113.1"))));
        // v6: nested covers, the /48 is the nearest installed cover of the /64
        assert_eq!(d.offload.failed6, [k6("2001:db8:1:1::", 64)].into_iter().collect());
        assert_eq!(d.offload.covers6, [k6("2001:db8:1::", 48)].into_iter().collect());
        assert_eq!(act(&d, "2001:db8:1::", 48), p(reason::TABLE_FULL));
        assert_eq!(fwd(&d, "2001:db8::", 32), nh(2, Some("fe80::1")));
        assert!(d.problems.iter().any(|p| p.starts_with("IPv4 FIB needs 5 entries, capacity 3: 2 routes")));
        // the source check still follows the kernel: no refusal anywhere
        assert_eq!(d.switches.src_lpm, 0);
        ids.release_unused(&d);

        // a delete makes room: the /25 goes in, its cover stays punted for the /26
        st.routes.retain(|_, r| !(r.key.dst == ip("203.0.113.0") && r.key.prefix_len == 24));
        let d = compute(&st, &managed(), &c, &mut ids);
        assert_eq!(act(&d, "198.51.100.0", 25), p(reason::TABLE_FULL));
        assert_eq!(d.offload.failed4, [k4("198.51.100.0", 26)].into_iter().collect());
        assert_eq!(d.offload.covers4, [k4("198.51.100.0", 25)].into_iter().collect());
        assert_eq!(fwd(&d, "198.51.100.0", 24), nh(2, Some("192.0.2.2")), "cover restored");
        ids.release_unused(&d);

        // another: everything fits, every cover restored
        st.routes.retain(|_, r| !(r.key.dst == ip("0.0.0.0") && r.key.prefix_len == 0));
        let d = compute(&st, &managed(), &c, &mut ids);
        assert!(d.offload.failed4.is_empty() && d.offload.covers4.is_empty());
        assert_eq!(fwd(&d, "198.51.100.0", 26), nh(3, Some("203.0.113.2")));
        assert_eq!(fwd(&d, "198.51.100.0", 25), nh(3, Some("203.0.113.1")));
        assert!(!d.problems.iter().any(|p| p.contains("IPv4 FIB needs")));
    }

    #[test]
    fn overflow_source_check_follows_the_kernel_fib() {
        let mut st = base();
        add(&mut st, via(rt("198.51.100.0", 24), 2, Some("192.0.2.1")));
        add(&mut st, via(rt("203.0.113.0", 24), 2, Some("192.0.2.1")));
        add(&mut st, kind(rt("198.51.100.7", 32), RouteKind::Blackhole));
        let c = Capacities { fib4: 2, ..caps() };
        let d = compute(&st, &managed(), &c, &mut Ids::new(100, 64));
        // the left-out blackhole still refuses its source, by the deny set
        assert_eq!(d.offload.failed4.len(), 1);
        assert_eq!(d.switches.src_lpm, 0);
        assert_eq!(d.src_deny4.get(&"198.51.100.7".parse().unwrap()), Some(&reason::RP_FILTER));
        assert_eq!(d.switches.table_full, 0);

        // LPM mode (a shorter reject route) and a left-out reject route with
        // no installed cover: a miss would accept its sources, so IPv4 punts
        add(&mut st, kind(rt("10.0.0.0", 8), RouteKind::Unreachable));
        add(&mut st, kind(rt("192.0.2.128", 25), RouteKind::Prohibit));
        let c = Capacities { fib4: 3, ..caps() };
        let d = compute(&st, &managed(), &c, &mut Ids::new(100, 64));
        assert_eq!(d.switches.src_lpm, 1);
        assert_eq!(d.switches.table_full, Family::V4.bit());
        assert!(d.problems.iter().any(|p| p.starts_with("IPv4 FIB overflow left out 192.0.2.128/25")), "{:?}", d.problems);
    }

    #[test]
    fn overflow_never_forwards_by_a_less_specific_route() {
        // random FIBs trimmed to random sizes: every probe address is either
        // punted or forwarded to the same next hop as with room for all
        let mut seed = 0x9e37_79b9_u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for _ in 0..40 {
            let mut st = base();
            for _ in 0..60 {
                let len = [0u8, 8, 16, 24, 25, 26, 32][(next() % 7) as usize];
                let a = Ipv4Addr::new(198, 51, (next() % 2) as u8, (next() % 256) as u8);
                let r = rt(&a.to_string(), len);
                let r = match next() % 5 {
                    0 => kind(r, RouteKind::Blackhole),
                    1 => via(r, 3, None),
                    n => via(r, 2, Some(&format!("192.0.2.{n}"))),
                };
                add(&mut st, r);
                let v6 = format!("2001:db8:{:x}::{:x}", next() % 4, next() % 4);
                add(&mut st, via(rt(&v6, [32u8, 48, 64, 127, 128][(next() % 5) as usize]), 2, Some(&format!("fe80::{}", next() % 3 + 1))));
            }
            let full = run(&st);
            let cap4 = (next() as usize % full.fib4.len().max(1)) as u32;
            let cap6 = (next() as usize % full.fib6.len().max(1)) as u32;
            let c = Capacities { fib4: cap4, fib6: cap6, ..caps() };
            let d = compute(&st, &managed(), &c, &mut Ids::new(100, 64));
            assert!(d.fib4.len() <= cap4 as usize && d.fib6.len() <= cap6 as usize);
            assert_eq!(d.offload.failed4.len(), full.fib4.len() - d.fib4.len());
            assert_eq!(d.offload.failed6.len(), full.fib6.len() - d.fib6.len());
            let mut probes = BTreeSet::new();
            for (a, l) in full.fib4.keys() {
                let x = u32::from(*a);
                let last = x | u32::MAX.checked_shr(u32::from(*l)).unwrap_or(0);
                for y in [x, x.wrapping_add(1), last, last.wrapping_add(1)] {
                    probes.insert(IpAddr::V4(Ipv4Addr::from(y)));
                }
            }
            for (a, l) in full.fib6.keys() {
                let x = u128::from(*a);
                let last = x | u128::MAX.checked_shr(u32::from(*l)).unwrap_or(0);
                for y in [x, x.wrapping_add(1), last, last.wrapping_add(1)] {
                    probes.insert(IpAddr::V6(Ipv6Addr::from(y)));
                }
            }
            for a in probes {
                let got = way(&d, a);
                if got.is_none() {
                    continue;
                }
                assert_eq!(nh_of(&d, got), nh_of(&full, way(&full, a)), "{a} with caps {cap4}/{cap6}");
            }
        }
    }

    // ---- next-hop ids ----

    #[test]
    fn nexthop_ids_are_stable_and_never_repointed_while_applied() {
        let mut ids = Ids::new(8, 64);
        let mut st = base();
        add(&mut st, via(rt("10.0.1.0", 24), 2, Some("192.0.2.1")));
        add(&mut st, via(rt("10.0.2.0", 24), 2, Some("192.0.2.2")));
        let d1 = compute(&st, &managed(), &caps(), &mut ids);
        let id_a = match act(&d1, "10.0.1.0", 24) {
            RouteAction::Forward { nh_id } => nh_id,
            a => panic!("{a:?}"),
        };
        let applied = d1.nexthops.clone();

        // stable across recomputes
        let d1b = compute(&st, &managed(), &caps(), &mut ids);
        assert_eq!(d1b.nexthops, d1.nexthops);

        // A's route goes away, a new next hop C appears: C must not get A's id
        // while the applied tables still hold it
        st.routes.retain(|_, r| r.key.dst != ip("10.0.1.0"));
        add(&mut st, via(rt("10.0.3.0", 24), 3, Some("203.0.113.1")));
        let d2 = compute(&st, &managed(), &caps(), &mut ids);
        assert!(!d2.nexthops.contains_key(&id_a));
        let id_c = match act(&d2, "10.0.3.0", 24) {
            RouteAction::Forward { nh_id } => nh_id,
            a => panic!("{a:?}"),
        };
        assert_ne!(id_c, id_a);
        ids.nexthops.release_unused(&applied); // A still applied: stays reserved
        add(&mut st, via(rt("10.0.5.0", 24), 3, Some("203.0.113.5")));
        let d2b = compute(&st, &managed(), &caps(), &mut ids);
        assert!(
            !d2b.nexthops.contains_key(&id_a),
            "A's id handed out while the maps hold it"
        );
        st.routes.retain(|_, r| r.key.dst != ip("10.0.5.0"));
        let d2c = compute(&st, &managed(), &caps(), &mut ids);
        assert_eq!(d2c.nexthops, d2.nexthops);

        // A comes back before it was ever released: same id again
        add(&mut st, via(rt("10.0.1.0", 24), 2, Some("192.0.2.1")));
        let d3 = compute(&st, &managed(), &caps(), &mut ids);
        assert_eq!(d3.nexthops.get(&id_a), Some(&nh(2, Some("192.0.2.1"))));
        st.routes.retain(|_, r| r.key.dst != ip("10.0.1.0"));
        let d4 = compute(&st, &managed(), &caps(), &mut ids);
        assert!(!d4.nexthops.contains_key(&id_a));

        // once the maps no longer hold A, its id can be reused
        ids.nexthops.release_unused(&d4.nexthops);
        assert_eq!(ids.nexthops.reserved(), d4.nexthops.len());
        add(&mut st, via(rt("10.0.4.0", 24), 3, Some("203.0.113.9")));
        let d5 = compute(&st, &managed(), &caps(), &mut ids);
        assert_eq!(d5.nexthops.get(&id_a), Some(&nh(3, Some("203.0.113.9"))));
    }

    #[test]
    fn nexthop_id_starvation_punts_and_recovers() {
        let mut ids = Ids::new(3, 64); // ids 1 and 2
        let mut st = base();
        add(&mut st, via(rt("10.0.1.0", 24), 2, Some("192.0.2.1")));
        add(&mut st, via(rt("10.0.2.0", 24), 2, Some("192.0.2.2")));
        let c = Capacities {
            nexthops: 3,
            ..caps()
        };
        let d1 = compute(&st, &managed(), &c, &mut ids);
        assert!(!ids.starved());
        ids.nexthops.release_unused(&d1.nexthops);
        // replace both next hops: the old ids are still in the maps
        st.routes.clear();
        add(&mut st, via(rt("10.0.1.0", 24), 3, Some("203.0.113.1")));
        add(&mut st, via(rt("10.0.2.0", 24), 3, Some("203.0.113.2")));
        let d2 = compute(&st, &managed(), &c, &mut ids);
        assert!(ids.starved());
        assert_eq!(act(&d2, "10.0.1.0", 24), p(reason::TABLE_FULL));
        assert_eq!(act(&d2, "10.0.2.0", 24), p(reason::TABLE_FULL));
        assert!(d2.nexthops.is_empty());
        assert!(d2
            .problems
            .iter()
            .any(|p| p.starts_with("next-hop ids exhausted")));
        assert_eq!(d2.switches.table_full, 0, "the table itself fits");
        // the reconciler wrote d2 (old ids deleted), release, compute again
        ids.nexthops.release_unused(&d2.nexthops);
        let d3 = compute(&st, &managed(), &c, &mut ids);
        assert!(!ids.starved());
        assert_eq!(fwd(&d3, "10.0.1.0", 24), nh(3, Some("203.0.113.1")));
        assert_eq!(fwd(&d3, "10.0.2.0", 24), nh(3, Some("203.0.113.2")));
    }

    #[test]
    fn nexthop_ids_adopt_what_the_maps_hold() {
        let mut ids = Ids::new(8, 64);
        let applied: BTreeMap<u32, NexthopEntry> =
            [(1, nh(2, None)), (2, nh(3, None))].into_iter().collect();
        ids.nexthops.release_unused(&applied);
        let mut st = base();
        add(&mut st, via(rt("10.0.1.0", 24), 3, None));
        add(&mut st, via(rt("10.0.2.0", 24), 2, Some("192.0.2.1")));
        let d = compute(&st, &managed(), &caps(), &mut ids);
        assert_eq!(
            d.nexthops.get(&2),
            Some(&nh(3, None)),
            "adopted id reused for its own entry"
        );
        assert!(
            !d.nexthops.contains_key(&1),
            "id 1 is still in the maps with other content"
        );
        assert_eq!(d.nexthops.get(&3), Some(&nh(2, Some("192.0.2.1"))));
    }

    #[test]
    fn compute_is_deterministic() {
        let mut st = base();
        many_routes(&mut st, 300, 50, 7);
        let a = run(&st);
        let mut st2 = st.clone();
        // rebuild the hash maps in another order
        let routes: Vec<_> = st2.routes.drain(..).collect();
        for (k, v) in routes.into_iter().rev() {
            st2.routes.insert(k, v);
        }
        assert_eq!(run(&st2), a);
    }

    /// The map-of-vectors grouping fib_intents used before it was made
    /// fast for full tables; kept as the reference it must agree with.
    fn fib_intents_by_maps(state: &KernelState, fam: Family) -> BTreeMap<Prefix, Intent> {
        let mut local: HashMap<Prefix, Vec<&Route>> = HashMap::new();
        let mut main: HashMap<Prefix, Vec<&Route>> = HashMap::new();
        for ((f, key), route) in &state.routes {
            if *f != fam {
                continue;
            }
            // Other tables are reachable only through non-default rules, which
            // punt the whole family (see `policy_problem`).
            let table = match key.table {
                RT_TABLE_LOCAL => &mut local,
                RT_TABLE_MAIN => &mut main,
                _ => continue,
            };
            let Some(p) = Prefix::new(fam, &key.dst, key.prefix_len) else {
                log::debug!("ignoring route with a malformed key {key:?}");
                continue;
            };
            table.entry(p).or_default().push(route);
        }
        let pick = |t: HashMap<Prefix, Vec<&Route>>| -> BTreeMap<Prefix, Intent> {
            t.into_iter()
                .map(|(p, mut routes)| {
                    // HashMap order must not leak into the choice.
                    routes.sort_by(|a, b| a.key.cmp(&b.key));
                    (p, select(fam, &routes, state))
                })
                .collect()
        };
        let local = pick(local);
        let main = pick(main);
        let local_lens: BTreeSet<u8> = local.keys().map(|p| p.len).collect();

        let mut out = local.clone();
        for (p, m) in main {
            if local.contains_key(&p) {
                continue; // the local route wins an identical prefix
            }
            let cover = local_lens
                .iter()
                .rev()
                .filter(|l| **l <= p.len)
                .find_map(|l| local.get(&p.truncate(*l)));
            let intent = match cover {
                None => m,
                Some(l) => merge_covered(fam, l, m),
            };
            out.insert(p, intent);
        }
        out
    }

    #[test]
    fn fib_intents_match_the_reference_grouping() {
        // Small address space so prefixes collide across tables, metrics,
        // TOS values and lengths, with local covers of both kinds.
        let mut seed = 0x1234_5678_u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for _ in 0..20 {
            let mut st = base();
            for _ in 0..300 {
                let len = [8u8, 16, 23, 24, 24, 25, 32][(next() % 7) as usize];
                let a = Ipv4Addr::new(198, 51, (next() % 4) as u8, (next() % 256) as u8);
                let mut r = rt(&a.to_string(), len);
                r = match next() % 4 {
                    0 => via(r, 2, Some("192.0.2.1")),
                    1 => via(r, 3, Some("192.0.2.2")),
                    2 => kind(r, RouteKind::Local),
                    _ => kind(r, RouteKind::Blackhole),
                };
                if next() % 3 == 0 {
                    r = table(r, RT_TABLE_LOCAL);
                }
                r = prio(r, next() % 3);
                if next() % 20 == 0 {
                    r.key.tos = 4;
                }
                add(&mut st, r);
                let v6 = format!("2001:db8:{:x}::", next() % 8);
                let r6 = via(rt(&v6, [32u8, 48, 64][(next() % 3) as usize]), 3, None);
                add(&mut st, if next() % 4 == 0 { table(r6, RT_TABLE_LOCAL) } else { r6 });
            }
            for fam in [Family::V4, Family::V6] {
                let fast: Vec<(Prefix, Intent)> = fib_intents(&st, fam);
                let reference: Vec<(Prefix, Intent)> = fib_intents_by_maps(&st, fam).into_iter().collect();
                assert_eq!(fast, reference);
            }
        }
    }


    /// `base` with a user hash seed, so that multipath can be fast-pathed.
    fn ecmp_base() -> KernelState {
        let mut st = base();
        st.sysctl.mp_seed = 0x1234;
        st
    }

    #[test]
    fn group_max_paths_matches_header() {
        let line = FASTPATH_H
            .lines()
            .find(|l| l.starts_with("#define FP_GROUP_MAX_PATHS"))
            .expect("FP_GROUP_MAX_PATHS");
        assert_eq!(line.split_whitespace().nth(2), Some(&*FP_GROUP_MAX_PATHS.to_string()));
    }

    fn weighted(ifindex: u32, gw: &str, weight: u32, flags: u32) -> NextHop {
        NextHop {
            ifindex,
            gateway: Some(ip(gw)),
            flags,
            weight,
        }
    }

    fn mp(dst: &str, len: u8, hops: Vec<NextHop>) -> Route {
        let mut r = rt(dst, len);
        r.target = RouteTarget::Multipath(hops);
        r
    }

    /// The group a multipath route resolves to, with next hops instead of ids.
    fn group_of(d: &Desired, dst: &str, len: u8) -> (GroupKind, Vec<(i32, Option<NexthopEntry>)>) {
        let RouteAction::Multipath { group } = act(d, dst, len) else {
            panic!("{dst}/{len}: expected multipath, got {:?}", act(d, dst, len));
        };
        let g = &d.groups[&group];
        let paths = g
            .paths
            .iter()
            .map(|p| (p.upper_bound, (p.nh_id != 0).then(|| d.nexthops[&p.nh_id].clone())))
            .collect();
        (g.kind, paths)
    }

    #[test]
    fn upper_bounds_like_the_kernel() {
        // DIV_ROUND_CLOSEST_ULL(w << 31, total) - 1
        assert_eq!(upper_bound(1, 2), (1 << 30) - 1);
        assert_eq!(upper_bound(2, 2), i32::MAX);
        assert_eq!(upper_bound(1, 3), 715_827_882); // round(2^31/3) = 715827883
        assert_eq!(upper_bound(2, 3), 1_431_655_764); // round(2^32/3) = 1431655765
        assert_eq!(upper_bound(65536 * 64, 65536 * 64), i32::MAX);
    }

    #[test]
    fn classic_multipath_v4_v6_weights_and_dead_members() {
        let mut st = ecmp_base();
        add(
            &mut st,
            mp("198.51.100.0", 24, vec![weighted(2, "192.0.2.1", 1, 0), weighted(3, "203.0.113.1", 2, 0)]),
        );
        add(
            &mut st,
            mp("2001:db8:1::", 64, vec![weighted(2, "fe80::1", 1, 0), weighted(3, "fe80::2", 1, 0)]),
        );
        // a dead member keeps its place with -1, the live ones share 2^31
        add(
            &mut st,
            mp(
                "203.0.113.128",
                25,
                vec![
                    weighted(2, "192.0.2.1", 1, RTNH_F_DEAD | RTNH_F_LINKDOWN),
                    weighted(3, "203.0.113.1", 1, 0),
                    weighted(3, "203.0.113.2", 3, 0),
                ],
            ),
        );
        let d = run(&st);
        let (k, paths) = group_of(&d, "198.51.100.0", 24);
        assert_eq!(k, GroupKind::HashThreshold);
        assert_eq!(
            paths,
            vec![
                (715_827_882, Some(nh(2, Some("192.0.2.1")))),
                (i32::MAX, Some(nh(3, Some("203.0.113.1")))),
            ]
        );
        let (_, paths) = group_of(&d, "2001:db8:1::", 64);
        assert_eq!(
            paths,
            vec![((1 << 30) - 1, Some(nh(2, Some("fe80::1")))), (i32::MAX, Some(nh(3, Some("fe80::2"))))]
        );
        let (_, paths) = group_of(&d, "203.0.113.128", 25);
        assert_eq!(
            paths,
            vec![
                (-1, None),
                ((1 << 29) - 1, Some(nh(3, Some("203.0.113.1")))),
                (i32::MAX, Some(nh(3, Some("203.0.113.2")))),
            ]
        );
        // multipath routes are unicast for the source check
        assert!(d.switches.src_lpm == 0 || d.src_deny4.is_empty());
        assert_eq!(d.switches.mp_seed, 0x1234);

        // link-down: dead only where the device ignores link-down routes
        let linkdown = |st: &KernelState| {
            let mut st = st.clone();
            st.routes.clear();
            add(
                &mut st,
                mp("198.51.100.0", 24, vec![weighted(2, "192.0.2.1", 1, RTNH_F_LINKDOWN), weighted(3, "203.0.113.1", 1, 0)]),
            );
            add(
                &mut st,
                mp("2001:db8:1::", 64, vec![weighted(2, "fe80::1", 1, RTNH_F_LINKDOWN), weighted(3, "fe80::2", 1, 0)]),
            );
            let d = run(&st);
            (group_of(&d, "198.51.100.0", 24).1[0].0, group_of(&d, "2001:db8:1::", 64).1[0].0)
        };
        // not ignored: the kernel still hashes to it (we punt its flows: the path is not forwardable)
        assert_eq!(linkdown(&st), ((1 << 30) - 1, (1 << 30) - 1));
        let mut ign = st.clone();
        ign.sysctl.ignore_linkdown4_all = true;
        assert_eq!(linkdown(&ign), (-1, (1 << 30) - 1));
        let mut ign = st.clone();
        ign.if_sysctl.get_mut(&2).unwrap().ignore_linkdown6 = true;
        assert_eq!(linkdown(&ign), ((1 << 30) - 1, -1));
        let mut ign = st.clone();
        ign.if_sysctl.get_mut(&2).unwrap().ignore_linkdown4 = true;
        assert_eq!(linkdown(&ign), (-1, (1 << 30) - 1));
    }

    #[test]
    fn unforwardable_member_gets_no_next_hop_but_keeps_its_share() {
        let mut st = ecmp_base();
        add(&mut st, mp("198.51.100.0", 24, vec![weighted(0, "192.0.2.1", 1, 0), weighted(3, "203.0.113.1", 1, 0)]));
        let d = run(&st);
        assert_eq!(
            group_of(&d, "198.51.100.0", 24).1,
            vec![((1 << 30) - 1, None), (i32::MAX, Some(nh(3, Some("203.0.113.1"))))]
        );
        let RouteAction::Multipath { group } = act(&d, "198.51.100.0", 24) else { panic!() };
        assert_eq!(d.groups[&group].paths[0].nh_id, 0);
    }

    #[test]
    fn identical_groups_share_an_id_and_changed_ones_get_a_new_one() {
        let mut st = ecmp_base();
        let hops = vec![weighted(2, "192.0.2.1", 1, 0), weighted(3, "203.0.113.1", 1, 0)];
        add(&mut st, mp("198.51.100.0", 24, hops.clone()));
        add(&mut st, mp("203.0.113.0", 24, hops.clone()));
        let mut ids = Ids::new(100, 64);
        let d1 = compute(&st, &managed(), &caps(), &mut ids);
        assert_eq!(d1.groups.len(), 1);
        assert_eq!(act(&d1, "198.51.100.0", 24), act(&d1, "203.0.113.0", 24));
        ids.release_unused(&d1);
        let mut hops2 = hops.clone();
        hops2[0].weight = 2;
        add(&mut st, mp("203.0.113.0", 24, hops2));
        let d2 = compute(&st, &managed(), &caps(), &mut ids);
        assert_eq!(d2.groups.len(), 2);
        assert_ne!(act(&d2, "198.51.100.0", 24), act(&d2, "203.0.113.0", 24));
        assert_eq!(act(&d2, "198.51.100.0", 24), act(&d1, "198.51.100.0", 24), "unchanged group keeps its id");
    }

    #[test]
    fn hash_settings_we_cannot_reproduce_punt_with_a_problem() {
        let mut st = ecmp_base();
        add(&mut st, mp("198.51.100.0", 24, vec![weighted(2, "192.0.2.1", 1, 0), weighted(3, "203.0.113.1", 1, 0)]));
        add(&mut st, mp("2001:db8:1::", 64, vec![weighted(2, "fe80::1", 1, 0), weighted(3, "fe80::2", 1, 0)]));
        add(&mut st, via(rt("192.0.2.0", 24), 2, None));

        let mut seed0 = st.clone();
        seed0.sysctl.mp_seed = 0;
        let d = run(&seed0);
        assert_eq!(act(&d, "198.51.100.0", 24), p(reason::ECMP));
        assert_eq!(act(&d, "2001:db8:1::", 64), p(reason::ECMP));
        assert_eq!(fwd(&d, "192.0.2.0", 24), nh(2, None), "single-path routes are unaffected");
        assert!(d.groups.is_empty());
        assert_eq!(d.problems.len(), 2, "{:?}", d.problems);
        assert!(d.problems.iter().all(|p| p.contains("set net.ipv4.fib_multipath_hash_seed to a non-zero value")));
        assert_eq!(d.switches.table_full | d.switches.policy_punt, 0);

        // A policy past the four the kernel has now (a future kernel's)
        // is punted; 2 and 3 are hashed.
        let mut pol = st.clone();
        pol.sysctl.mp_policy6 = 4;
        pol.sysctl.mp_policy4 = 2;
        let d = run(&pol);
        assert!(matches!(act(&d, "198.51.100.0", 24), RouteAction::Multipath { .. }), "policy 2 is hashed");
        assert_eq!(act(&d, "2001:db8:1::", 64), p(reason::ECMP));
        assert_eq!(d.switches.mp_policy4, 2);
        assert_eq!(d.problems.len(), 1);
        assert!(d.problems[0].starts_with("IPv6 multipath routes punted: net.ipv6.fib_multipath_hash_policy is 4"));
        pol.sysctl.mp_policy4 = 3;
        pol.sysctl.mp_fields4 = crate::mphash::FIELD_DST_IP;
        let d = run(&pol);
        assert!(matches!(act(&d, "198.51.100.0", 24), RouteAction::Multipath { .. }), "policy 3 is hashed");
        assert_eq!((d.switches.mp_policy4, d.switches.mp_fields4), (3, crate::mphash::FIELD_DST_IP));

        // no multipath route: no problem line for a random seed
        let mut plain = ecmp_base();
        plain.sysctl.mp_seed = 0;
        add(&mut plain, via(rt("192.0.2.0", 24), 2, None));
        assert!(run(&plain).problems.is_empty());
    }

    #[test]
    fn more_paths_than_the_data_plane_holds_punt() {
        let mut st = ecmp_base();
        let many: Vec<NextHop> = (0..65).map(|i| weighted(2, &format!("192.0.2.{}", i + 1), 1, 0)).collect();
        add(&mut st, mp("198.51.100.0", 24, many.clone()));
        add(&mut st, mp("203.0.113.0", 24, many[..64].to_vec()));
        let d = run(&st);
        assert_eq!(act(&d, "198.51.100.0", 24), p(reason::ECMP));
        assert_eq!(group_of(&d, "203.0.113.0", 24).1.len(), 64);
        let mut st = ecmp_base();
        for i in 0..65u32 {
            st.nexthops.insert(100 + i, NexthopObject { hop: Some(hop(2, Some(&format!("192.0.2.{}", i + 1)))), ..obj(100 + i) });
        }
        st.nexthops.insert(1, NexthopObject { group: (100..165).map(|i| (i, 1)).collect(), ..obj(1) });
        let mut r = rt("198.51.100.0", 24);
        r.target = RouteTarget::Object(1);
        add(&mut st, r);
        assert_eq!(act(&run(&st), "198.51.100.0", 24), p(reason::ECMP));
    }

    fn group_objects(st: &mut KernelState) {
        st.nexthops.insert(10, NexthopObject { hop: Some(hop(2, Some("192.0.2.1"))), ..obj(10) });
        st.nexthops.insert(11, NexthopObject { hop: Some(hop(3, Some("203.0.113.1"))), ..obj(11) });
        st.nexthops.insert(12, NexthopObject { blackhole: true, ..obj(12) });
        st.nexthops.insert(20, NexthopObject { group: vec![(10, 1), (11, 300)], ..obj(20) });
        st.nexthops.insert(
            21,
            NexthopObject { group: vec![(10, 1), (11, 1)], resilient: true, n_buckets: 4, ..obj(21) },
        );
        st.res_buckets.insert(21, [(0, 10), (1, 11), (2, 10), (3, 11)].into_iter().collect());
        let mut r = rt("198.51.100.0", 24);
        r.target = RouteTarget::Object(20);
        add(st, r);
        let mut r = rt("2001:db8:1::", 64);
        r.target = RouteTarget::Object(21);
        add(st, r);
    }

    #[test]
    fn next_hop_group_objects_hash_threshold_and_resilient() {
        let mut st = ecmp_base();
        group_objects(&mut st);
        let d = run(&st);
        let (k, paths) = group_of(&d, "198.51.100.0", 24);
        assert_eq!(k, GroupKind::HashThreshold);
        assert_eq!(
            paths,
            vec![(upper_bound(1, 301), Some(nh(2, Some("192.0.2.1")))), (i32::MAX, Some(nh(3, Some("203.0.113.1"))))]
        );
        let RouteAction::Multipath { group } = act(&d, "2001:db8:1::", 64) else { panic!() };
        let g = &d.groups[&group];
        assert_eq!((g.kind, g.n_buckets, g.origin), (GroupKind::Resilient, 4, 21));
        let ids: Vec<u32> = g.paths.iter().map(|p| p.nh_id).collect();
        let want: BTreeMap<u32, u32> = [(0, ids[0]), (1, ids[1]), (2, ids[0]), (3, ids[1])]
            .into_iter()
            .map(|(i, n)| (bucket_key(group, i), n))
            .collect();
        assert_eq!(d.res_buckets, want);

        // a bucket still naming a member that left the group is left out (punts)
        let mut st2 = st.clone();
        st2.res_buckets.get_mut(&21).unwrap().insert(3, 99);
        let d2 = run(&st2);
        assert_eq!(d2.res_buckets.len(), 3);
        // buckets not dumped yet: the route punts rather than guess
        let mut st3 = st.clone();
        st3.res_buckets.clear();
        assert_eq!(act(&run(&st3), "2001:db8:1::", 64), p(reason::ECMP));
        // a blackhole member we cannot forward by: its path has no next hop
        let mut st4 = st.clone();
        st4.nexthops.insert(20, NexthopObject { group: vec![(12, 1), (11, 1)], ..obj(20) });
        assert_eq!(group_of(&run(&st4), "198.51.100.0", 24).1[0], ((1 << 30) - 1, None));
    }

    #[test]
    fn group_capacity_and_id_starvation() {
        let mut st = ecmp_base();
        for i in 0..3u32 {
            add(
                &mut st,
                mp(&format!("10.0.{i}.0"), 24, vec![weighted(2, "192.0.2.1", 1 + i, 0), weighted(3, "203.0.113.1", 1, 0)]),
            );
        }
        let c = Capacities { groups: 3, ..caps() };
        let mut ids = Ids::new(100, 3);
        let d = compute(&st, &managed(), &c, &mut ids);
        assert!(ids.starved());
        assert_eq!(d.groups.len(), 2);
        assert_eq!(d.fib4.values().filter(|e| e.action == p(reason::TABLE_FULL)).count(), 1);
        assert_eq!(d.switches.table_full, 0, "only the route without a group punts");
        assert_eq!(d.offload.failed4.len(), 1);
        assert!(d.problems.iter().any(|p| p
            == "ECMP group table needs 4 entries, capacity 3: multipath routes whose group found no slot are punted (offload failed)"));

        let mut st = ecmp_base();
        group_objects(&mut st);
        let c = Capacities { buckets: 3, ..caps() };
        let d = compute(&st, &managed(), &c, &mut Ids::new(100, 64));
        assert_eq!(d.switches.table_full, 0);
        assert!(d.problems.iter().any(|p| p == "resilient bucket table needs 4 entries, capacity 3: 1 groups' routes punted"));
        // the resilient group's route punts whole, the hash-threshold one is untouched
        assert_eq!(act(&d, "2001:db8:1::", 64), p(reason::TABLE_FULL));
        assert!(d.res_buckets.is_empty());
        assert!(matches!(act(&d, "198.51.100.0", 24), RouteAction::Multipath { .. }));
        assert_eq!(d.offload.failed6.len(), 1);
    }
}
