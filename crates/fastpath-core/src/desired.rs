//! Kernel state -> the tables fastpath should hold.
//!
//! The kernel is the oracle. Every FIB entry says what the kernel would do
//! with a packet to that destination; wherever that cannot be known from the
//! mirrored state, the entry punts. A punt costs speed, a wrong forward costs
//! correctness, so every doubt below resolves to a punt.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::{
    Family, KernelState, NextHop, Route, RouteKind, RouteTarget, Rule, NUD_USABLE, RT_TABLE_LOCAL,
    RT_TABLE_MAIN,
};
use crate::tables::{
    Capacities, Desired, IfaceEntry, NeighEntry, NeighKey, NexthopEntry, RouteAction, RouteEntry,
};

/// The `enum fp_reason` values this crate writes into punt routes. The crate
/// must not depend on the BPF crate, so they are repeated here; a unit test
/// checks each one against bpf/include/fastpath.h so they cannot drift.
pub mod reason {
    pub const MULTICAST: u8 = 4;
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

    pub const ALL: &[(&str, u16)] = &[
        ("FP_IF_UP", UP),
        ("FP_IF_FWD4", FWD4),
        ("FP_IF_FWD6", FWD6),
        ("FP_IF_RPF_STRICT", RPF_STRICT),
        ("FP_IF_RPF_LOOSE", RPF_LOOSE),
    ];
}

/// rtnh_flags / nhm_flags bits that make the kernel skip a next hop.
const RTNH_F_DEAD: u32 = 1;
const RTNH_F_LINKDOWN: u32 = 16;

/// FR_ACT_TO_TBL
const FR_ACT_TO_TBL: u8 = 1;

/// Stable next-hop ids: content-addressed by (ifindex, gateway), never
/// re-pointed while a written route may still reference them.
///
/// An id stays reserved for its entry as long as the last `compute` wanted
/// it or the applied tables hold it; only `release_unused` frees ids. The
/// daemon calls it with the reconciler's shadow after each apply.
#[derive(Debug, Default)]
pub struct NexthopIds {
    capacity: u32,
    /// Every reserved id and the entry it stands for.
    by_id: BTreeMap<u32, NexthopEntry>,
    /// The id an entry gets when a route wants it.
    by_entry: BTreeMap<NexthopEntry, u32>,
    /// Ids the last `compute` put into `Desired::nexthops`.
    wanted: BTreeSet<u32>,
    /// The last `compute` found no free id for some next hop.
    starved: bool,
}

impl NexthopIds {
    /// Ids come from 1..capacity (0 is never used: the data plane treats it as "none").
    pub fn new(capacity: u32) -> Self {
        NexthopIds {
            capacity,
            ..Default::default()
        }
    }

    /// Forget ids that are neither in `desired` nor in the `applied` tables.
    pub fn release_unused(&mut self, applied: &BTreeMap<u32, NexthopEntry>) {
        // Ids in the maps we did not hand out (a reconciler older than this
        // allocator): adopt them so they are never handed to something else.
        for (id, entry) in applied {
            match self.by_id.get(id) {
                None => {
                    self.by_id.insert(*id, entry.clone());
                    self.by_entry.entry(entry.clone()).or_insert(*id);
                }
                Some(mine) if mine != entry => {
                    log::error!(
                        "next hop {id} holds {entry:?} in the maps but is allocated to {mine:?}"
                    );
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
                if let Some((other, _)) = self.by_id.iter().find(|(_, e)| **e == entry) {
                    self.by_entry.insert(entry, *other);
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

    /// Ids for `entries`, reusing reserved ones; entries missing from the
    /// result found no free id.
    fn assign(&mut self, entries: &BTreeSet<NexthopEntry>) -> BTreeMap<NexthopEntry, u32> {
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

/// A prefix of either family, address bits left-aligned in a u128 so that
/// IPv4 and IPv6 share the containment arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Prefix {
    bits: u128,
    len: u8,
}

fn mask(bits: u128, len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        bits & (u128::MAX << (128 - u32::from(len)))
    }
}

impl Prefix {
    fn new(fam: Family, addr: &IpAddr, len: u8) -> Option<Prefix> {
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

    fn truncate(self, len: u8) -> Prefix {
        Prefix {
            bits: mask(self.bits, len),
            len,
        }
    }

    fn v4(self) -> (Ipv4Addr, u8) {
        (Ipv4Addr::from((self.bits >> 96) as u32), self.len)
    }

    fn v6(self) -> (Ipv6Addr, u8) {
        (Ipv6Addr::from(self.bits), self.len)
    }
}

/// What a prefix should do, before next-hop ids are assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Intent {
    Forward { hop: NexthopEntry, mtu: u32 },
    Act(RouteAction),
}

fn punt(reason: u8) -> Intent {
    Intent::Act(RouteAction::Punt { reason })
}

/// The route the kernel would pick among those of one table with the same
/// prefix, as an intent.
fn select(fam: Family, routes: &[&Route], state: &KernelState) -> Intent {
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
            _ => return punt(reason::ECMP),
        },
        RouteTarget::Object(id) => match state.nexthops.get(id) {
            None => return punt(reason::ROUTE_UNSUPPORTED),
            Some(obj) if obj.unsupported => return punt(reason::ROUTE_UNSUPPORTED),
            Some(obj) if !obj.group.is_empty() => return punt(reason::ECMP),
            Some(obj) if obj.blackhole => return Intent::Act(RouteAction::Blackhole),
            Some(obj) => match &obj.hop {
                Some(h) => h,
                None => return punt(reason::ROUTE_UNSUPPORTED),
            },
        },
    };
    hop_intent(fam, hop, route.mtu)
}

fn hop_intent(fam: Family, hop: &NextHop, route_mtu: u32) -> Intent {
    // A dead or link-down next hop makes the kernel skip to another route.
    if hop.flags & (RTNH_F_DEAD | RTNH_F_LINKDOWN) != 0 || hop.ifindex == 0 {
        return punt(reason::ROUTE_UNSUPPORTED);
    }
    // IPv6 forwarding checks the device's mtu6 and ignores the route MTU
    // unless it is locked (which punts above).
    let mtu = match fam {
        Family::V4 => route_mtu,
        Family::V6 => 0,
    };
    Intent::Forward {
        hop: NexthopEntry {
            ifindex: hop.ifindex,
            gateway: hop.gateway,
        },
        mtu,
    }
}

/// The FIB of one family: local and main tables merged so that one LPM
/// lookup gives what the default rules (local, then main) give.
fn fib_intents(state: &KernelState, fam: Family) -> BTreeMap<Prefix, Intent> {
    let mut local: HashMap<Prefix, Vec<&Route>> = HashMap::new();
    let mut main: HashMap<Prefix, Vec<&Route>> = HashMap::new();
    for ((f, key), route) in &state.routes {
        if *f != fam {
            continue;
        }
        // Other tables are reachable only through non-default rules, which
        // punt the whole family (see `policy`).
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
fn merge_covered(fam: Family, l: &Intent, m: Intent) -> Intent {
    match (fam, l) {
        (Family::V4, Intent::Forward { .. }) if *l != m => punt(reason::ROUTE_UNSUPPORTED),
        _ => l.clone(),
    }
}

fn family_name(fam: Family) -> &'static str {
    match fam {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
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

fn iface_flags(state: &KernelState, ifindex: u32, admin_up: bool, running: bool) -> u16 {
    let sys = state.if_sysctl.get(&ifindex).cloned().unwrap_or_default();
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
    // The kernel treats any non-zero value other than 1 as loose.
    match sys.rp_filter {
        0 => {}
        1 => flags |= if_flags::RPF_STRICT,
        _ => flags |= if_flags::RPF_LOOSE,
    }
    flags
}

const BOTH: u32 = 1 | 2;

/// `managed`: ifindex -> fp_stats slot of every interface fastpath runs on.
pub fn compute(
    state: &KernelState,
    managed: &BTreeMap<u32, u32>,
    caps: &Capacities,
    ids: &mut NexthopIds,
) -> Desired {
    let mut d = Desired::default();

    for (ifindex, slot) in managed {
        let Some(link) = state.links.get(ifindex) else {
            continue;
        };
        let Some(mac) = link.mac else { continue };
        let mtu6 = match state.if_sysctl.get(ifindex).map(|s| s.mtu6) {
            Some(m) if m != 0 => m,
            _ => link.mtu,
        };
        let flags = iface_flags(state, *ifindex, link.admin_up, link.running);
        d.ifaces.insert(
            *ifindex,
            IfaceEntry {
                mac,
                flags,
                mtu: link.mtu,
                mtu6,
                slot: *slot,
            },
        );
    }

    let fib4 = fib_intents(state, Family::V4);
    let fib6 = fib_intents(state, Family::V6);
    let hops: BTreeSet<NexthopEntry> = fib4
        .values()
        .chain(fib6.values())
        .filter_map(|i| match i {
            Intent::Forward { hop, .. } => Some(hop.clone()),
            Intent::Act(_) => None,
        })
        .collect();
    let assigned = ids.assign(&hops);
    for (hop, id) in &assigned {
        d.nexthops.insert(*id, hop.clone());
    }
    let entry = |i: Intent| -> RouteEntry {
        match i {
            Intent::Forward { hop, mtu } => match assigned.get(&hop) {
                Some(id) => RouteEntry {
                    action: RouteAction::Forward { nh_id: *id },
                    mtu,
                },
                // No id to give: this prefix must not fall back to a shorter route.
                None => RouteEntry {
                    action: RouteAction::Punt {
                        reason: reason::TABLE_FULL,
                    },
                    mtu: 0,
                },
            },
            Intent::Act(action) => RouteEntry { action, mtu: 0 },
        }
    };
    d.fib4 = fib4.into_iter().map(|(p, i)| (p.v4(), entry(i))).collect();
    d.fib6 = fib6.into_iter().map(|(p, i)| (p.v6(), entry(i))).collect();
    if ids.starved() {
        d.problems.push(format!(
            "next-hop ids exhausted ({} reserved, capacity {}): some routes punted until ids are released",
            ids.reserved(),
            ids.capacity()
        ));
    }

    for n in state.neighbours.values() {
        let Some(mac) = n.mac else { continue };
        if n.state & NUD_USABLE == 0 || !managed.contains_key(&n.ifindex) {
            continue;
        }
        d.neigh.insert(
            NeighKey {
                ifindex: n.ifindex,
                addr: n.addr,
            },
            NeighEntry { mac },
        );
    }

    for fam in [Family::V4, Family::V6] {
        if let Some(p) = policy_problem(&state.rules, fam) {
            d.switches.policy_punt |= fam.bit();
            d.problems.push(p);
        }
    }
    // A VRF slave's traffic is looked up in the VRF's table via the l3mdev
    // rule; whatever the rules look like, we do not mirror that.
    for ifindex in managed.keys() {
        let Some(master) = state.links.get(ifindex).and_then(|l| l.master) else {
            continue;
        };
        let Some(m) = state.links.get(&master) else {
            continue;
        };
        if m.kind.as_deref() == Some("vrf") {
            let name = state
                .links
                .get(ifindex)
                .map(|l| l.name.as_str())
                .unwrap_or("?");
            d.switches.policy_punt |= BOTH;
            d.problems.push(format!(
                "{name} is enslaved to VRF {}: IPv4 and IPv6 punted",
                m.name
            ));
        }
    }

    let mut full = |fam_bits: u32, what: &str, need: usize, cap: u32, punted: &str| {
        if need > cap as usize {
            d.switches.table_full |= fam_bits;
            d.problems.push(format!(
                "{what} needs {need} entries, capacity {cap}: {punted} punted"
            ));
        }
    };
    full(
        Family::V4.bit(),
        "IPv4 FIB",
        d.fib4.len(),
        caps.fib4,
        "IPv4",
    );
    full(
        Family::V6.bit(),
        "IPv6 FIB",
        d.fib6.len(),
        caps.fib6,
        "IPv6",
    );
    // +1: id 0 is never used.
    full(
        BOTH,
        "next-hop table",
        d.nexthops.len() + 1,
        caps.nexthops,
        "IPv4 and IPv6",
    );
    full(
        BOTH,
        "neighbour table",
        d.neigh.len(),
        caps.neigh,
        "IPv4 and IPv6",
    );
    full(
        BOTH,
        "interface table",
        d.ifaces.len(),
        caps.ifaces,
        "IPv4 and IPv6",
    );
    d
}
