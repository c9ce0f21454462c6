//! fastpath's control-plane logic, free of BPF: mirror the kernel's
//! forwarding state over netlink (`mirror`, `parse`, `sysctl`), compute the
//! tables fastpath should hold (`desired`, or `route_delta` when only routes
//! changed, with what it keeps between changes in `delta_base`;
//! `neigh_delta` when only neighbours did; `iface_restrict` for what a link
//! change takes away before all that), and turn
//! the difference into an ordered list of map writes (`reconcile`).

pub mod delta_base;
pub mod desired;
pub mod dir24;
pub mod dir6;
pub mod gone_ahead;
#[cfg(test)]
mod fixtures;
pub mod iface_restrict;
pub mod local_ahead;
pub mod mirror;
pub mod mphash;
pub mod model;
pub mod neigh_delta;
pub mod overflow;
pub mod parse;
pub mod reconcile;
pub mod resources;
pub mod route_delta;
mod route_fast;
pub mod sysctl;
pub mod tables;
pub mod xorshift;
