//! Where the CPU time went (workload f): per-CPU deltas of /proc/stat over
//! a run, split the way the paper's Figure 8 splits it.

use anyhow::{Context, Result};
use serde::Serialize;

/// One CPU's /proc/stat counters, in USER_HZ ticks.
#[derive(Clone, Copy, Debug, Default)]
struct Ticks {
    user: u64,
    system: u64,
    irq: u64,
    softirq: u64,
    idle: u64,
    other: u64,
}

/// A reading of every CPU at one moment.
#[derive(Clone, Debug)]
pub struct Snapshot(Vec<Ticks>);

pub fn read() -> Result<Snapshot> {
    let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    parse(&text)
}

fn parse(text: &str) -> Result<Snapshot> {
    let mut cpus = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let Some(name) = f.next() else { continue };
        let Some(idx) = name.strip_prefix("cpu").filter(|n| !n.is_empty()) else {
            continue;
        };
        let idx: usize = idx.parse().with_context(|| format!("/proc/stat: {name}"))?;
        let v: Vec<u64> = f.map(|x| x.parse().unwrap_or(0)).collect();
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        // user nice system idle iowait irq softirq steal guest guest_nice
        let t = Ticks {
            user: at(0) + at(1),
            system: at(2),
            idle: at(3) + at(4),
            irq: at(5),
            softirq: at(6),
            other: at(7),
        };
        if cpus.len() <= idx {
            cpus.resize(idx + 1, Ticks::default());
        }
        cpus[idx] = t;
    }
    Ok(Snapshot(cpus))
}

/// Shares of the wall time of the CPUs a run used (1.0 = one whole CPU).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CpuUse {
    pub cpus: usize,
    pub user: f64,
    pub system: f64,
    pub softirq: f64,
    pub irq: f64,
    pub idle: f64,
    pub other: f64,
}

impl CpuUse {
    pub fn busy(&self) -> f64 {
        self.user + self.system + self.softirq + self.irq + self.other
    }

    /// The average of several runs (repetitions of one cell).
    pub fn mean(v: &[CpuUse]) -> CpuUse {
        let n = v.len().max(1) as f64;
        let mut m = CpuUse::default();
        for c in v {
            m.cpus = c.cpus;
            m.user += c.user / n;
            m.system += c.system / n;
            m.softirq += c.softirq / n;
            m.irq += c.irq / n;
            m.idle += c.idle / n;
            m.other += c.other / n;
        }
        m
    }
}

/// The CPU use of `cpus` between two snapshots, as shares of CPUs:
/// user 0.8 on two CPUs means 0.8 of one CPU's time went to user space.
pub fn between(a: &Snapshot, b: &Snapshot, cpus: &[usize]) -> CpuUse {
    let mut d = Ticks::default();
    for &c in cpus {
        let (Some(x), Some(y)) = (a.0.get(c), b.0.get(c)) else {
            continue;
        };
        d.user += y.user.saturating_sub(x.user);
        d.system += y.system.saturating_sub(x.system);
        d.irq += y.irq.saturating_sub(x.irq);
        d.softirq += y.softirq.saturating_sub(x.softirq);
        d.idle += y.idle.saturating_sub(x.idle);
        d.other += y.other.saturating_sub(x.other);
    }
    let total = (d.user + d.system + d.irq + d.softirq + d.idle + d.other).max(1) as f64;
    // Shares of the ticks that passed, scaled to "CPUs' worth".
    let n = cpus.len() as f64;
    let s = |x: u64| x as f64 / total * n;
    CpuUse {
        cpus: cpus.len(),
        user: s(d.user),
        system: s(d.system),
        softirq: s(d.softirq),
        irq: s(d.irq),
        idle: s(d.idle),
        other: s(d.other),
    }
}

/// Time CPU `cpu` spent working (user, system, irq, softirq; not idle, not
/// stolen by the host) between two snapshots.
pub fn busy_between(a: &Snapshot, b: &Snapshot, cpu: usize) -> Result<std::time::Duration> {
    let (Some(x), Some(y)) = (a.0.get(cpu), b.0.get(cpu)) else {
        anyhow::bail!("/proc/stat has no cpu{cpu}");
    };
    let ticks = y.user.saturating_sub(x.user)
        + y.system.saturating_sub(x.system)
        + y.irq.saturating_sub(x.irq)
        + y.softirq.saturating_sub(x.softirq);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        anyhow::bail!("sysconf(_SC_CLK_TCK) failed");
    }
    Ok(std::time::Duration::from_nanos(ticks * 1_000_000_000 / hz as u64))
}

/// As `busy_between`, summed over every CPU: what a job spread over the
/// machine used (the AF_XDP forwarder and the loop on its CPU).
pub fn busy_all_between(a: &Snapshot, b: &Snapshot) -> Result<std::time::Duration> {
    (0..a.0.len().min(b.0.len())).map(|c| busy_between(a, b, c)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_of_the_used_cpus() {
        let a = parse(
            "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 10 0 10 100 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n",
        )
        .unwrap();
        let b = parse(
            "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 30 0 40 140 0 0 10 0 0 0\ncpu1 0 0 0 100 0 0 0 0 0 0\n",
        )
        .unwrap();
        let u = between(&a, &b, &[0]);
        assert_eq!(u.cpus, 1);
        assert!((u.user - 0.2).abs() < 1e-9 && (u.system - 0.3).abs() < 1e-9);
        assert!((u.softirq - 0.1).abs() < 1e-9 && (u.idle - 0.4).abs() < 1e-9);
        let both = between(&a, &b, &[0, 1]);
        assert!((both.idle - 1.4).abs() < 1e-9);
        assert!((both.busy() + both.idle - 2.0).abs() < 1e-9);
    }
}
