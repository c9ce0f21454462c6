//! One AF_XDP socket bound to (interface, queue), with its four rings.
//! The first socket of a UMEM registers it; the others share it
//! (XDP_SHARED_UMEM) and, being on other devices, bring their own fill
//! and completion rings.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use anyhow::{bail, Context, Result};

use super::ring::{Consumer, Mapped, Producer};
use super::umem::Umem;

/// How the kernel moves frames between the driver and the UMEM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BindMode {
    /// The driver DMAs into the UMEM (needs driver support).
    ZeroCopy,
    /// The kernel copies (veth, generic XDP).
    Copy,
}

// asm-generic/socket.h (the libc crate lacks them on Linux).
const SO_BUSY_POLL: libc::c_int = 46;
const SO_PREFER_BUSY_POLL: libc::c_int = 69;
const SO_BUSY_POLL_BUDGET: libc::c_int = 70;

pub struct Xsk {
    pub fill: Producer<u64>,
    pub comp: Consumer<u64>,
    pub rx: Consumer<libc::xdp_desc>,
    pub tx: Producer<libc::xdp_desc>,
    pub mode: BindMode,
    // Last: the rings are unmapped before the socket closes.
    fd: OwnedFd,
}

fn setsockopt<T>(fd: BorrowedFd<'_>, opt: libc::c_int, v: &T, what: &str) -> Result<()> {
    setsockopt_level(fd, libc::SOL_XDP, opt, v, what)
}

fn setsockopt_level<T>(fd: BorrowedFd<'_>, level: libc::c_int, opt: libc::c_int, v: &T, what: &str) -> Result<()> {
    // SAFETY: v is a live T of the size we pass.
    let rc = unsafe {
        libc::setsockopt(fd.as_raw_fd(), level, opt, v as *const T as *const libc::c_void, std::mem::size_of::<T>() as libc::socklen_t)
    };
    if rc != 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sizes of a socket's rings (powers of two).
#[derive(Debug, Clone, Copy)]
pub struct RingSizes {
    pub rx: u32,
    pub tx: u32,
    pub fill: u32,
    pub comp: u32,
}

impl Xsk {
    /// A socket on (`ifindex`, `queue`): registers `umem` when `share` is
    /// None, else shares the UMEM of that socket. `want_zc` asks for
    /// zero-copy (only for the registering socket: shared ones inherit).
    pub fn open(
        umem: &Umem,
        share: Option<&Xsk>,
        ifindex: u32,
        queue: u32,
        sizes: RingSizes,
        want_zc: bool,
    ) -> Result<Xsk> {
        // SAFETY: plain syscall; the fd is checked and owned below.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            bail!("socket(AF_XDP): {}", std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let b = fd.as_fd();
        if share.is_none() {
            setsockopt(b, libc::XDP_UMEM_REG, &umem.reg(), "registering the UMEM")?;
        }
        setsockopt(b, libc::XDP_UMEM_FILL_RING, &sizes.fill, "sizing the fill ring")?;
        setsockopt(b, libc::XDP_UMEM_COMPLETION_RING, &sizes.comp, "sizing the completion ring")?;
        setsockopt(b, libc::XDP_RX_RING, &sizes.rx, "sizing the RX ring")?;
        setsockopt(b, libc::XDP_TX_RING, &sizes.tx, "sizing the TX ring")?;

        // SAFETY: all-zero is a valid xdp_mmap_offsets; the kernel fills it.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut optlen = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: off and optlen are live and sized as passed.
        let rc = unsafe {
            libc::getsockopt(raw, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS, &mut off as *mut _ as *mut libc::c_void, &mut optlen)
        };
        if rc != 0 {
            bail!("XDP_MMAP_OFFSETS: {}", std::io::Error::last_os_error());
        }
        if optlen as usize != std::mem::size_of::<libc::xdp_mmap_offsets>() {
            bail!("kernel too old: no ring flags in XDP_MMAP_OFFSETS");
        }
        let fill = Producer::new(Mapped::map(b, &off.fr, libc::XDP_UMEM_PGOFF_FILL_RING, sizes.fill)?);
        let comp = Consumer::new(Mapped::map(b, &off.cr, libc::XDP_UMEM_PGOFF_COMPLETION_RING, sizes.comp)?);
        let rx = Consumer::new(Mapped::map(b, &off.rx, libc::XDP_PGOFF_RX_RING as u64, sizes.rx)?);
        let tx = Producer::new(Mapped::map(b, &off.tx, libc::XDP_PGOFF_TX_RING as u64, sizes.tx)?);

        let mut sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: 0,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        let mode = match share {
            // Flags are not allowed with a shared UMEM: it inherits the owner's.
            Some(owner) => {
                sa.sxdp_flags = libc::XDP_SHARED_UMEM;
                sa.sxdp_shared_umem_fd = owner.fd.as_raw_fd() as u32;
                owner.mode
            }
            None if want_zc => {
                sa.sxdp_flags = libc::XDP_USE_NEED_WAKEUP | libc::XDP_ZEROCOPY;
                BindMode::ZeroCopy
            }
            None => {
                sa.sxdp_flags = libc::XDP_USE_NEED_WAKEUP | libc::XDP_COPY;
                BindMode::Copy
            }
        };
        // SAFETY: sa is a live sockaddr_xdp of the size passed.
        let rc = unsafe {
            libc::bind(raw, &sa as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t)
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            bail!("binding AF_XDP to ifindex {ifindex} queue {queue} ({mode:?}): {e}");
        }
        Ok(Xsk { fill, comp, rx, tx, mode, fd })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Busy polling: the syscalls of this socket run the device's NAPI
    /// loop themselves instead of waiting for its softirq.
    pub fn busy_poll(&self, budget: u32) -> Result<()> {
        let b = self.fd.as_fd();
        let one: libc::c_int = 1;
        let usecs: libc::c_int = 20;
        let budget = budget as libc::c_int;
        setsockopt_level(b, libc::SOL_SOCKET, SO_PREFER_BUSY_POLL, &one, "SO_PREFER_BUSY_POLL")?;
        setsockopt_level(b, libc::SOL_SOCKET, SO_BUSY_POLL, &usecs, "SO_BUSY_POLL")?;
        setsockopt_level(b, libc::SOL_SOCKET, SO_BUSY_POLL_BUDGET, &budget, "SO_BUSY_POLL_BUDGET")
    }

    /// Tells the kernel to transmit what the TX ring holds (copy mode
    /// transmits in this syscall). EAGAIN/EBUSY/ENOBUFS mean "try later".
    pub fn kick_tx(&self) {
        // SAFETY: zero-length send with no buffer, as the AF_XDP ABI wants.
        unsafe { libc::sendto(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
    }

    /// Lets the kernel refill from the fill ring / busy-poll RX.
    pub fn kick_rx(&self) {
        // SAFETY: zero-length receive with no buffer, as the AF_XDP ABI wants.
        unsafe {
            libc::recvfrom(self.fd.as_raw_fd(), std::ptr::null_mut(), 0, libc::MSG_DONTWAIT, std::ptr::null_mut(), std::ptr::null_mut())
        };
    }
}

/// Registers `xsk` in the XSKMAP at `key` (the program redirects there).
pub fn register(xskmap: &libbpf_rs::MapHandle, key: u32, xsk: &Xsk) -> Result<()> {
    use libbpf_rs::MapCore;
    let val = xsk.fd.as_raw_fd() as u32;
    xskmap
        .update(&key.to_ne_bytes(), &val.to_ne_bytes(), libbpf_rs::MapFlags::ANY)
        .with_context(|| format!("adding the AF_XDP socket to the XSKMAP at {key}"))
}
