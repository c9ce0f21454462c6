//! The daemon's own resources as an operator watches any daemon's: resident
//! memory (a full table costs ~300 MB of it), CPU time, file descriptors.
//! Read from /proc/self in the daemon (the API and metrics threads), for
//! `fastpath status` and the standard `process_*` metric series.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DaemonProcess {
    pub pid: i32,
    pub resident_bytes: u64,
    /// The most it was resident at once (VmHWM): what to size a box for.
    pub peak_resident_bytes: u64,
    pub virtual_bytes: u64,
    /// User and system time.
    pub cpu_seconds: f64,
    pub open_fds: u64,
    /// The soft RLIMIT_NOFILE (None: unlimited).
    pub max_fds: Option<u64>,
    /// Since the Unix epoch.
    pub start_time_seconds: f64,
}

/// This process, now.
pub fn myself() -> Result<DaemonProcess> {
    let me = procfs::process::Process::myself().context("/proc/self")?;
    let stat = me.stat().context("/proc/self/stat")?;
    let status = me.status().context("/proc/self/status")?;
    let limits = me.limits().context("/proc/self/limits")?;
    let ticks = procfs::ticks_per_second() as f64;
    let boot = procfs::boot_time_secs().context("/proc/stat btime")?;
    let max_fds = match limits.max_open_files.soft_limit {
        procfs::process::LimitValue::Value(v) => Some(v),
        procfs::process::LimitValue::Unlimited => None,
    };
    let resident_bytes = stat.rss * procfs::page_size();
    Ok(DaemonProcess {
        pid: me.pid,
        resident_bytes,
        // The kernel's RSS counters are per-CPU and read approximately, in
        // stat and status apart: VmHWM read after the RSS came out a few
        // pages below it in one CI run. The peak is at least the present.
        peak_resident_bytes: (status.vmhwm.unwrap_or(0) * 1024).max(resident_bytes),
        virtual_bytes: stat.vsize,
        cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
        open_fds: me.fd_count().context("/proc/self/fd")? as u64,
        max_fds,
        start_time_seconds: boot as f64 + stat.starttime as f64 / ticks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let p = myself().expect("/proc/self");
        assert_eq!(p.pid, std::process::id() as i32);
        assert!(p.resident_bytes > 0 && p.peak_resident_bytes >= p.resident_bytes, "{p:?}");
        assert!(p.virtual_bytes >= p.resident_bytes, "{p:?}");
        // stdin, stdout and stderr at least.
        assert!(p.open_fds >= 3 && p.max_fds.is_none_or(|m| m >= p.open_fds), "{p:?}");
        // Started before this test, and not before the machine (boot times
        // are whole seconds: one second of slack).
        assert!(p.start_time_seconds <= before + 1.0 && p.start_time_seconds > 1.0e9, "{p:?}");
        assert!(p.cpu_seconds >= 0.0, "{p:?}");
    }
}
