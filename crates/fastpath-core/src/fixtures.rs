//! Builders shared by the unit tests of the mirror, desired tables and
//! reconciler, so that each test says only what differs from a plain route.

use std::net::IpAddr;

use crate::model::{Family, Route, RouteKey, RouteKind, RouteTarget, Rule, RT_TABLE_MAIN};

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
    }
}

/// A rule as `ip rule` shows the defaults: to_tbl, no selectors.
pub fn plain_rule(family: Family, priority: u32, table: u32) -> Rule {
    Rule { family, priority, table, action: 1, has_selectors: false, invert: false }
}
