//! Builders shared by the unit tests of the mirror, desired tables,
//! reconciler and deltas, so that each test says only what differs from a
//! plain route.

use std::net::IpAddr;

use crate::model::{Family, Link, Route, RouteKey, RouteKind, RouteTarget, Rule, RT_TABLE_MAIN};
use crate::reconcile::Reconciler;
use crate::route_delta::FibDelta;
use crate::tables::{Capacities, Desired, Op, TableWriter};

pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("fixture address literal")
}

/// A unicast main-table route, metric 0, no TOS, no MTU.
pub fn main_route(dst: &str, len: u8, target: RouteTarget) -> Route {
    Route {
        key: RouteKey { table: RT_TABLE_MAIN, dst: ip(dst), prefix_len: len, tos: 0, priority: 0 },
        kind: RouteKind::Unicast,
        target,
        mtu: 0,
        mtu_locked: false,
        encap: false,
        prefsrc: None,
    }
}

/// A rule as `ip rule` shows the defaults: to_tbl, no selectors.
pub fn plain_rule(family: Family, priority: u32, table: u32) -> Rule {
    Rule { family, priority, table, action: 1, has_selectors: false, invert: false }
}

/// The rules of a fresh netns: local, main and default for IPv4, local and main for IPv6.
pub fn default_rules() -> Vec<Rule> {
    vec![
        plain_rule(Family::V4, 0, 255),
        plain_rule(Family::V4, 32766, 254),
        plain_rule(Family::V4, 32767, 253),
        plain_rule(Family::V6, 0, 255),
        plain_rule(Family::V6, 32766, 254),
    ]
}

/// An up, running veth with MTU 1500 and MAC 02:00:00:00:00:<ifindex>.
pub fn veth(ifindex: u32, name: &str) -> Link {
    Link {
        ifindex,
        name: name.into(),
        mac: Some([2, 0, 0, 0, 0, ifindex as u8]),
        mtu: 1500,
        admin_up: true,
        running: true,
        arphrd: 1,
        kind: Some("veth".into()),
        master: None,
    }
}

/// Records the ops it is given.
#[derive(Default)]
pub struct Log(pub Vec<Op>);

impl TableWriter for Log {
    type Error = std::io::Error;
    fn apply(&mut self, op: &Op) -> Result<(), Self::Error> {
        self.0.push(op.clone());
        Ok(())
    }
}

/// A reconciler that wrote `applied` and then delta `d`: the ops `plan`
/// would write to reach `full`, the ops the delta wrote, and the reconciler.
pub fn delta_ops(caps: Capacities, applied: &Desired, full: &Desired, d: &FibDelta) -> (Vec<Op>, Vec<Op>, Reconciler) {
    let mut r = Reconciler::with_capacities(caps);
    r.apply(applied, &mut Log::default()).expect("a Log never fails");
    let want = r.plan(full);
    let mut log = Log::default();
    r.apply_fib_delta(d, &mut log).expect("a Log never fails");
    (want, log.0, r)
}
