//! BPF_PROG_RUN runs the program on the calling thread's CPU, and the flow
//! cache is per CPU: a test that expects a second packet to hit the first
//! one's entry must not migrate in between (the scheduler moves busy test
//! threads freely while other tests run).

use std::io;

use anyhow::{Context, Result};

extern "C" {
    fn sched_getcpu() -> i32;
    fn sched_setaffinity(pid: i32, size: usize, mask: *const u64) -> i32;
}

/// Pins the calling thread to the CPU it is running on.
pub fn pin_here() -> Result<()> {
    let cpu = unsafe { sched_getcpu() };
    if cpu < 0 {
        return Err(io::Error::last_os_error()).context("sched_getcpu");
    }
    let cpu = cpu as usize;
    let mut mask = [0u64; 16]; // cpu_set_t: 1024 bits
    *mask.get_mut(cpu / 64).context("CPU number beyond cpu_set_t")? |= 1 << (cpu % 64);
    if unsafe { sched_setaffinity(0, std::mem::size_of_val(&mask), mask.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error()).with_context(|| format!("pinning to CPU {cpu}"));
    }
    Ok(())
}
