//! The tables fastpath writes into its BPF maps, in plain Rust. `desired`
//! computes them from the kernel state; `reconcile` diffs them against what
//! was written and emits ordered operations; the daemon applies each
//! operation to a map through the `TableWriter` trait.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use serde::Serialize;

/// fp_iface, per managed interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IfaceEntry {
    pub mac: [u8; 6],
    /// FP_IF_* bits.
    pub flags: u16,
    pub mtu: u32,
    pub mtu6: u32,
    /// fp_stats slot (1..); stable for the life of the daemon.
    pub slot: u32,
}

/// fp_route.type (mirrors enum fp_route_type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RouteAction {
    Forward { nh_id: u32 },
    Local,
    Blackhole,
    Unreachable,
    Prohibit,
    /// Pass up with this fp_reason index (e.g. FP_R_ECMP, FP_R_MULTICAST).
    Punt { reason: u8 },
    /// ECMP through `Desired::groups[group]` (FP_RT_MULTIPATH).
    Multipath { group: u32 },
}

/// fp_route
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RouteEntry {
    pub action: RouteAction,
    /// Route MTU honoured for forwarded packets (0 = device MTU).
    pub mtu: u32,
}

/// fp_nexthop
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct NexthopEntry {
    pub ifindex: u32,
    /// None: on-link, the neighbour is the packet's destination.
    pub gateway: Option<std::net::IpAddr>,
}

/// enum fp_group_kind
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum GroupKind {
    /// First path whose upper bound is >= the hash (classic multipath
    /// routes, `ip nexthop group` type mpath).
    HashThreshold,
    /// fp_res_buckets[(group << 16) | hash % n_buckets].
    Resilient,
}

/// One fp_group_path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct GroupPath {
    /// Hash-threshold: last hash of this path, -1 = never taken (dead).
    /// Resilient: unused (0).
    pub upper_bound: i32,
    /// fp_nexthops id; 0 = a next hop we cannot forward to (its flows punt).
    pub nh_id: u32,
}

/// fp_group. Written once per id and never changed in place (the value is
/// too big to be replaced atomically under a reader): a different group is
/// a different id. Resilient buckets live in `Desired::res_buckets` and do
/// change in place, one bucket at a time, as the kernel's do.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct GroupEntry {
    pub kind: GroupKind,
    pub paths: Vec<GroupPath>,
    /// Resilient: bucket count (kernel: u16); 0 otherwise.
    pub n_buckets: u16,
    /// Resilient: the kernel's next-hop group id, so that two kernel groups
    /// with the same members keep separate bucket tables; 0 otherwise.
    /// Not written to the map.
    pub origin: u32,
}

/// fp_res_buckets key of bucket `index` of group `group`.
pub fn bucket_key(group: u32, index: u16) -> u32 {
    (group << 16) | u32::from(index)
}

/// fp_neigh4_key / fp_neigh6_key (the address family picks the map)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct NeighKey {
    pub ifindex: u32,
    pub addr: std::net::IpAddr,
}

/// fp_neigh (the data path owns `used_ns`; we only write the MAC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NeighEntry {
    pub mac: [u8; 6],
}

/// Runtime switches (fp_runtime minus the generation, which reconcile owns).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Switches {
    /// FP_FAM_* bits punted because a table would overflow: only the
    /// interface table does that now; routes that do not fit are handled
    /// one by one (see `overflow`).
    pub table_full: u32,
    /// FP_FAM_* bits punted because of non-default ip rules.
    pub policy_punt: u32,
    /// FP_FAM_V4: sources are checked by an LPM lookup, not `src_deny4`
    /// (a non-forwarding prefix shorter than /32 exists, or the deny set
    /// does not fit). Not a punt: nothing stops being fast-pathed.
    pub src_lpm: u32,
    /// net.ipv4.fib_multipath_hash_policy (written only as 0 or 1; a family
    /// with another policy has its multipath routes punted).
    pub mp_policy4: u8,
    /// net.ipv6.fib_multipath_hash_policy, as mp_policy4.
    pub mp_policy6: u8,
    /// net.ipv4.fib_multipath_hash_fields (read by policy 3 only).
    pub mp_fields4: u32,
    /// net.ipv6.fib_multipath_hash_fields.
    pub mp_fields6: u32,
    /// net.ipv4.fib_multipath_hash_seed (user seed; 0 = none, then every
    /// multipath route is punted).
    pub mp_seed: u32,
}

/// Table capacities (max_entries of each map).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Capacities {
    pub fib4: u32,
    pub fib6: u32,
    pub nexthops: u32,
    pub neigh: u32,
    pub ifaces: u32,
    /// fp_groups entries (ids 1.. ; 0 unused).
    pub groups: u32,
    /// fp_res_buckets entries, all resilient groups together.
    pub buckets: u32,
}

/// The complete content fastpath wants in its maps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Desired {
    pub ifaces: BTreeMap<u32, IfaceEntry>,
    pub fib4: BTreeMap<(Ipv4Addr, u8), RouteEntry>,
    pub fib6: BTreeMap<(Ipv6Addr, u8), RouteEntry>,
    /// nh id -> next hop; ids come from `NexthopIds` and are stable.
    pub nexthops: BTreeMap<u32, NexthopEntry>,
    pub neigh: BTreeMap<NeighKey, NeighEntry>,
    /// group id -> ECMP group; ids come from `GroupIds` and are stable.
    pub groups: BTreeMap<u32, GroupEntry>,
    /// fp_res_buckets: `bucket_key(group, index)` -> fp_nexthops id.
    /// Buckets whose next hop we cannot forward to are left out (a missing
    /// bucket punts).
    pub res_buckets: BTreeMap<u32, u32>,
    /// fp_src_deny4: IPv4 sources the kernel refuses with rp_filter off
    /// (own addresses, /32 entries that are not unicast) -> fp_reason index.
    pub src_deny4: BTreeMap<Ipv4Addr, u8>,
    pub switches: Switches,
    /// Human-readable reasons for every switch set (for logs and `fastpath status`).
    pub problems: Vec<String>,
    /// Routes that did not fit and the covers punted for them; like
    /// `problems`, not part of the maps.
    pub offload: crate::overflow::Offload,
}

/// One map write, in the order it must happen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Op {
    /// Written first when a family gets punted, last when it gets un-punted.
    SetSwitches(Switches),
    UpsertIface(u32, IfaceEntry),
    DeleteIface(u32),
    UpsertNexthop(u32, NexthopEntry),
    DeleteNexthop(u32),
    UpsertNeigh(NeighKey, NeighEntry),
    DeleteNeigh(NeighKey),
    /// Only ever writes an id that is absent (or holds the same group).
    UpsertGroup(u32, GroupEntry),
    DeleteGroup(u32),
    UpsertBucket(u32, u32),
    DeleteBucket(u32),
    UpsertRoute4(Ipv4Addr, u8, RouteEntry),
    DeleteRoute4(Ipv4Addr, u8),
    UpsertRoute6(Ipv6Addr, u8, RouteEntry),
    DeleteRoute6(Ipv6Addr, u8),
    /// Written before any route change, deleted after all of them: a deny
    /// entry too many only punts, one too few could forward.
    UpsertSrcDeny4(Ipv4Addr, u8),
    DeleteSrcDeny4(Ipv4Addr),
    /// Always the last op of a non-empty plan.
    BumpGeneration,
}

/// Something that can apply an `Op` (the BPF maps in the daemon; memory in tests).
pub trait TableWriter {
    type Error: std::error::Error + Send + Sync + 'static;
    fn apply(&mut self, op: &Op) -> Result<(), Self::Error>;

    /// Applies `ops` in order, stopping at the first failure. Returns how
    /// many ops reached the maps, and on failure the error of `ops[n]`
    /// (nothing after it was tried). A writer may group consecutive ops on
    /// one map into a batch call, but the count must be exact: the
    /// reconciler's shadow records exactly the first `n` ops.
    fn apply_many(&mut self, ops: &[Op]) -> (usize, Result<(), Self::Error>) {
        for (n, op) in ops.iter().enumerate() {
            if let Err(e) = self.apply(op) {
                return (n, Err(e));
            }
        }
        (ops.len(), Ok(()))
    }
}
