//! The AF_XDP execution point's user-space side for the drop and checksum
//! workloads: one socket on one RX queue of the router's veth (copy mode:
//! veth has no zero-copy), a thread that takes every frame off the RX ring,
//! does the workload's N checksums on it in Rust and hands the buffer
//! straight back to the fill ring. xdpilone (pure Rust, no libxdp) is the
//! crate the AF_XDP data path of issue #6 uses too.
//!
//! The thread busy-polls its rings on its own CPU, as the paper's
//! kernel-bypass point did; the kernel half (veth NAPI, the redirect and the
//! copy into the UMEM) stays on the CPU that receives.

use std::num::NonZeroU32;
use std::os::fd::RawFd;
use std::os::unix::thread::JoinHandleExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use xdpilone::{BufIdx, IfInfo, Socket, SocketConfig, Umem, UmemConfig};

use super::super::topo;
use super::super::traffic::Placement;

const FRAMES: u32 = 4096;
const FRAME_SIZE: u32 = 4096;
const BATCH: u32 = 64;

/// The user-space loop of one socket; stops and joins on drop.
pub struct XskDrop {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    work_ns: Arc<AtomicU64>,
    thread: Option<JoinHandle<Result<()>>>,
    fd: RawFd,
}

/// The UMEM: an anonymous mapping, page aligned as AF_XDP requires.
struct Area {
    ptr: NonNull<u8>,
    len: usize,
}

impl Area {
    fn new(len: usize) -> Result<Self> {
        // SAFETY: anonymous private mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap of the UMEM");
        }
        let ptr = NonNull::new(p.cast()).context("mmap returned null")?;
        Ok(Area { ptr, len })
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what new() mapped, after every user (the
        // socket, closed before: it is dropped first in the thread) is gone.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn errno(what: &str, e: xdpilone::Errno) -> anyhow::Error {
    anyhow!("{what}: {e}")
}

/// The paper's work unit in Rust, the same arithmetic as points.h: the
/// ones' complement sum of the 20-byte IPv4 header plus the previous round's
/// result. black_box keeps the compiler from hoisting the header loads.
pub fn csum_rounds(frame: &[u8], n: u32) -> u32 {
    let mut acc = 0u32;
    for _ in 0..n {
        let Some(ip) = std::hint::black_box(frame).get(14..34) else {
            return 0;
        };
        let mut s = acc;
        for w in ip.chunks_exact(2) {
            s += u32::from(u16::from_ne_bytes([w[0], w[1]]));
        }
        s = (s & 0xffff) + (s >> 16);
        acc = (s & 0xffff) + (s >> 16);
    }
    acc
}

impl XskDrop {
    /// Opens a socket on `ifindex` queue `queue` in namespace `ns` from a
    /// thread pinned to `cpu`, which then runs the loop; returns once the
    /// socket is bound (its fd goes into the XSKMAP next).
    pub fn start(
        ns: &str,
        ifindex: u32,
        queue: u32,
        place: Placement,
        rounds: u32,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let work_ns = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel::<Result<RawFd>>();
        let ns = ns.to_string();
        let (stop2, count2, work2) = (Arc::clone(&stop), Arc::clone(&count), Arc::clone(&work_ns));
        let thread = std::thread::spawn(move || -> Result<()> {
            let setup = || -> Result<_> {
                topo::enter_netns(&ns)?;
                place.apply().context("placing the AF_XDP loop")?;
                open_retrying(ifindex, queue)
            };
            let sock = match setup() {
                Ok(s) => s,
                Err(e) => {
                    let msg = format!("{e:#}");
                    let _ = tx.send(Err(e));
                    bail!("{msg}");
                }
            };
            let _ = tx.send(Ok(sock.fd));
            run_loop(sock, rounds, &stop2, &count2, &work2)
        });
        let fd = match rx.recv() {
            Ok(Ok(fd)) => fd,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e).context("setting up the AF_XDP socket");
            }
            Err(_) => {
                let r = thread.join();
                bail!(
                    "AF_XDP thread ended before binding: {:?}",
                    r.map(|r| r.err())
                );
            }
        };
        Ok(XskDrop {
            stop,
            count,
            work_ns,
            thread: Some(thread),
            fd,
        })
    }

    /// The socket's fd, for the XSKMAP.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// CPU time the loop thread has had so far (busy polling included:
    /// that is what a polling point costs).
    pub fn cpu_time(&self) -> Result<Duration> {
        let t = self
            .thread
            .as_ref()
            .context("AF_XDP loop already stopped")?;
        let mut clock: libc::clockid_t = 0;
        // SAFETY: the thread is alive (joined only in join()); writes one clockid we own.
        let rc = unsafe { libc::pthread_getcpuclockid(t.as_pthread_t(), &mut clock) };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc)).context("pthread_getcpuclockid");
        }
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: writes one timespec we own.
        if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
            return Err(std::io::Error::last_os_error())
                .context("clock_gettime of the AF_XDP loop");
        }
        Ok(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// Time the loop spent on frames (receive, checksums, refill) rather
    /// than polling empty rings.
    pub fn work_time(&self) -> Duration {
        Duration::from_nanos(self.work_ns.load(Ordering::Relaxed))
    }

    /// Frames taken off the RX ring so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn join(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| anyhow!("AF_XDP thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for XskDrop {
    fn drop(&mut self) {
        if let Err(e) = self.join() {
            log::warn!("AF_XDP drop loop: {e:#}");
        }
    }
}

/// Everything one socket needs; field order is drop order: rings and
/// socket go before the UMEM mapping they point into.
struct Sock {
    rx: xdpilone::RingRx,
    fq: xdpilone::DeviceQueue,
    _user: xdpilone::User,
    _socket: Socket,
    umem: Umem,
    fd: RawFd,
    _area: Area,
}

/// The kernel releases the previous cell's socket from the queue
/// asynchronously; until it has, binding the same queue fails with EBUSY.
fn open_retrying(ifindex: u32, queue: u32) -> Result<Sock> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match open(ifindex, queue) {
            Err(e) if format!("{e}").contains("Device or resource busy") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

fn open(ifindex: u32, queue: u32) -> Result<Sock> {
    let area = Area::new((FRAMES * FRAME_SIZE) as usize)?;
    let slice = NonNull::slice_from_raw_parts(area.ptr, area.len);
    let cfg = UmemConfig {
        fill_size: FRAMES,
        complete_size: FRAMES,
        frame_size: FRAME_SIZE,
        headroom: 0,
        flags: 0,
    };
    // SAFETY: the area is page aligned, FRAMES * FRAME_SIZE long and lives
    // in Sock after every ring and socket that uses it (field order).
    let umem = unsafe { Umem::new(cfg, slice) }.map_err(|e| errno("creating the UMEM", e))?;
    let mut info = IfInfo::invalid();
    info.from_ifindex(ifindex)
        .map_err(|e| errno("interface info", e))?;
    info.set_queue(queue);
    let socket = Socket::with_shared(&info, &umem).map_err(|e| errno("AF_XDP socket", e))?;
    let mut fq = umem
        .fq_cq(&socket)
        .map_err(|e| errno("fill/completion rings", e))?;
    let user = umem
        .rx_tx(
            &socket,
            &SocketConfig {
                rx_size: NonZeroU32::new(FRAMES),
                tx_size: None,
                bind_flags: SocketConfig::XDP_BIND_COPY,
            },
        )
        .map_err(|e| errno("RX ring", e))?;
    let rx = user.map_rx().map_err(|e| errno("mapping the RX ring", e))?;
    umem.bind(&user)
        .map_err(|e| errno("binding the AF_XDP socket", e))?;
    let mut w = fq.fill(FRAMES);
    let n = w.insert((0..FRAMES).filter_map(|i| umem.frame(BufIdx(i)).map(|f| f.offset)));
    w.commit();
    drop(w);
    if n == 0 {
        bail!("could not fill the fill ring");
    }
    let fd = rx.as_raw_fd();
    Ok(Sock {
        rx,
        fq,
        _user: user,
        _socket: socket,
        umem,
        fd,
        _area: area,
    })
}

fn run_loop(
    mut s: Sock,
    rounds: u32,
    stop: &AtomicBool,
    count: &AtomicU64,
    work_ns: &AtomicU64,
) -> Result<()> {
    let base = s._area.ptr.as_ptr();
    let mut done: Vec<u64> = Vec::with_capacity(BATCH as usize);
    let mut sink = 0u32;
    let mut idle = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let mut t0 = None;
        {
            let mut r = s.rx.receive(BATCH);
            if r.capacity() > 0 {
                t0 = Some(Instant::now());
            }
            while let Some(d) = r.read() {
                if rounds > 0 {
                    // SAFETY: the kernel wrote d.len bytes at d.addr inside
                    // the UMEM and gave the buffer to us until we refill it.
                    let frame = unsafe {
                        std::slice::from_raw_parts(base.add(d.addr as usize), d.len as usize)
                    };
                    sink = sink.wrapping_add(csum_rounds(frame, rounds));
                }
                done.push(d.addr & !u64::from(FRAME_SIZE - 1));
            }
            r.release();
        }
        if done.is_empty() {
            idle += 1;
            if idle & 1023 == 0 && s.fq.needs_wakeup() {
                s.fq.wake();
            }
            std::hint::spin_loop();
            continue;
        }
        idle = 0;
        count.fetch_add(done.len() as u64, Ordering::Relaxed);
        let mut w = s.fq.fill(done.len() as u32);
        let n = w.insert(done.iter().copied());
        w.commit();
        drop(w);
        done.drain(..n as usize);
        if let Some(t0) = t0 {
            work_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }
    std::hint::black_box(sink);
    let _ = &s.umem;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csum_rounds_chain_and_short_frames() {
        let f = crate::bench::traffic::frame(64).unwrap();
        assert_eq!(csum_rounds(&f, 0), 0);
        // A valid header sums to 0xffff; the next round adds it again.
        assert_eq!(csum_rounds(&f, 1), 0xffff);
        assert_eq!(csum_rounds(&f, 2), 0xffff);
        assert_eq!(csum_rounds(&f[..20], 3), 0);
    }
}
