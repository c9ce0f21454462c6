//! Netlink mirror: dump the kernel's forwarding state, then follow it.
//! STUB: signatures are the contract; bodies being implemented.

use std::net::IpAddr;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::model::KernelState;

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("netlink: {0}")]
    Io(#[from] std::io::Error),
    #[error("netlink: {0}")]
    Protocol(String),
}

/// What one `poll` did to the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollOutcome {
    /// Nothing arrived before the timeout.
    Idle,
    /// Events were applied to the state.
    Changed,
    /// The socket overran (ENOBUFS); the state was replaced by a fresh full dump.
    Resynced,
}

pub struct Mirror {
    _private: (),
}

impl Mirror {
    /// Opens the event socket, subscribed to every group we follow, with this receive buffer.
    pub fn open(_rcvbuf: usize) -> Result<Mirror, MirrorError> {
        todo!()
    }
    /// A full dump of links, addresses, routes (all tables), next-hop objects,
    /// neighbours, rules and the sysctls we need.
    pub fn dump(&mut self) -> Result<KernelState, MirrorError> {
        todo!()
    }
    /// Waits up to `timeout` for events and applies them all to `state`.
    pub fn poll(&mut self, _state: &mut KernelState, _timeout: Duration) -> Result<PollOutcome, MirrorError> {
        todo!()
    }
    /// Re-reads the sysctls of every link into `state`; true if anything changed.
    pub fn refresh_sysctls(&mut self, _state: &mut KernelState) -> bool {
        todo!()
    }
    /// Full resyncs done after overruns.
    pub fn resyncs(&self) -> u64 {
        todo!()
    }
    pub fn fd(&self) -> RawFd {
        todo!()
    }
}

/// Tells the kernel a neighbour is in use (RTM_NEWNEIGH with NTF_USE), so it
/// keeps it alive and re-probes it exactly as if it had sent traffic to it.
pub fn neigh_use(_ifindex: u32, _addr: IpAddr) -> Result<(), MirrorError> {
    todo!()
}
