//! The conntrack table of the test's namespace, through the `conntrack`
//! tool (conntrack-tools), which the calling thread's namespace applies to.

use std::process::Command;

use anyhow::{bail, Context, Result};

fn conntrack(args: &[&str]) -> Result<String> {
    let out = Command::new("conntrack").args(args).output().context("running conntrack (conntrack-tools)")?;
    if !out.status.success() {
        bail!("conntrack {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `conntrack -I` with these (space-separated) arguments.
pub fn insert(entry: &str) -> Result<()> {
    conntrack(&["-I"].into_iter().chain(entry.split_whitespace()).collect::<Vec<_>>()).map(|_| ())
}

/// `conntrack -D` of the entries matching these arguments.
pub fn delete(filter: &str) -> Result<()> {
    conntrack(&["-D"].into_iter().chain(filter.split_whitespace()).collect::<Vec<_>>()).map(|_| ())
}

pub fn flush() -> Result<()> {
    conntrack(&["-F"]).map(|_| ())
}

/// Remaining timeout in seconds of the one entry matching these arguments
/// (`conntrack -L` prints it after the protocol number).
pub fn timeout(filter: &str) -> Result<u64> {
    let out = conntrack(&["-L"].into_iter().chain(filter.split_whitespace()).collect::<Vec<_>>())?;
    let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    let [line] = lines[..] else { bail!("conntrack -L {filter}: want one entry, got {lines:?}") };
    let field = line.split_whitespace().nth(2).with_context(|| format!("no timeout in {line:?}"))?;
    field.parse().with_context(|| format!("timeout {field:?} in {line:?}"))
}

/// Sets or clears IP_CT_TCP_FLAG_BE_LIBERAL per direction ([original,
/// reply]) on the IPv4 TCP entry with this original tuple, over ctnetlink
/// (an update carrying the flags with that bit in the mask), as the daemon
/// does. `conntrack -I` cannot: conntrack-tools itself puts SACK_PERM and
/// BE_LIBERAL into every TCP entry it creates.
pub fn set_tcp_liberal(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, liberal: [bool; 2]) -> Result<()> {
    const BE_LIBERAL: u8 = 0x08;
    fn nla(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(payload);
        v.resize((v.len() + 3) & !3, 0);
        v
    }
    const NESTED: u16 = 0x8000;
    let ip = [nla(1, &src), nla(2, &dst)].concat();
    let proto = [nla(1, &[6]), nla(2, &sport.to_be_bytes()), nla(3, &dport.to_be_bytes())].concat();
    let tuple = nla(1 | NESTED, &[nla(1 | NESTED, &ip), nla(2 | NESTED, &proto)].concat());
    let flags = |on: bool| [if on { BE_LIBERAL } else { 0 }, BE_LIBERAL];
    let tcp = [nla(4, &flags(liberal[0])), nla(5, &flags(liberal[1]))].concat();
    let protoinfo = nla(4 | NESTED, &nla(1 | NESTED, &tcp));
    let attrs = [tuple, protoinfo].concat();
    // nlmsghdr: IPCTNL_MSG_CT_NEW of NFNL_SUBSYS_CTNETLINK, REQUEST|ACK (no CREATE: an update).
    let len = 16 + 4 + attrs.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&(1u16 << 8).to_ne_bytes());
    msg.extend_from_slice(&(0x1u16 | 0x4).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&[libc::AF_INET as u8, 0, 0, 0]);
    msg.extend_from_slice(&attrs);
    // SAFETY: plain socket calls on buffers that live across them; the fd is closed below.
    unsafe {
        let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_NETFILTER);
        if fd < 0 {
            bail!("ctnetlink socket: {}", std::io::Error::last_os_error());
        }
        let mut sa: libc::sockaddr_nl = std::mem::zeroed();
        sa.nl_family = libc::AF_NETLINK as u16;
        let sent = libc::sendto(
            fd,
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        );
        let mut buf = [0u8; 4096];
        let got = if sent < 0 { -1 } else { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if got < 20 {
            bail!("ctnetlink update: {err}");
        }
        let code = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
        if code != 0 {
            bail!("ctnetlink update: {}", std::io::Error::from_raw_os_error(-code));
        }
    }
    Ok(())
}
