//! What turns the bench lab's router into a stateful firewall: an nftables
//! forward ruleset as a real one reads (policy drop, new connections only
//! from the inside, established ones accepted and marked with the fast-path
//! bit), conntrack entries for the generator's flows that are established
//! and marked before anything is measured, and the hosts' settings for real
//! TCP connections through the lab.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::topo::{self, Topology};
use super::traffic::SPORT_BASE;

/// The generator's UDP destination port (traffic.rs' template).
const UDP_DPORT: u16 = 9;
pub(super) const GEN: &str = "192.0.2.2";
pub(super) const SINK: &str = "198.51.100.2";

/// The generator's and the sink's addresses in a lab of `t`'s family (the
/// packet generator's flows go from the one to the other).
fn hosts(t: &Topology) -> (&'static str, &'static str) {
    match t.family {
        topo::Family::V4 => (GEN, SINK),
        topo::Family::V6 => ("2001:db8:0:1::2", "2001:db8:0:2::2"),
    }
}

/// The conntrack events the ruleset lets entries report, as the example
/// ruleset does: destroy (1 << IPCT_DESTROY) and mark (1 << IPCT_MARK), all
/// fastpath's revocations need (nft 1.0.6 lists it as `destroy,mark` but
/// cannot parse `mark` there).
pub const CT_EVENTS: u32 = (1 << 2) | (1 << 7);
/// After a FIN, as the example ruleset: mark changes only (the data path no
/// longer trusts a closing entry, so its end need not be reported).
pub const CT_EVENTS_AFTER_FIN: u32 = 1 << 7;
/// From a TCP SYN-ACK to the handshake's last ACK, and from a UDP flow's
/// first reply until conntrack assures it, as the example ruleset: destroy
/// only, so the reply bit's mark change is not reported (nothing is fast
/// before conntrack's state is ESTABLISHED, or the UDP entry ASSURED).
pub const CT_EVENTS_IN_HANDSHAKE: u32 = 1 << 2;
/// The conntrack label the example ruleset gives a connection a FIN has
/// passed, so its later ACKs leave the narrowed mask alone.
pub const CT_LABEL_CLOSING: u32 = 127;

/// The router's address on r1, which `--snat` translates the inside's
/// sources to (masquerade's choice).
pub(super) const SNAT_TO: &str = "198.51.100.1";

/// The forward ruleset, with the fast-path bit(s) `mark` for the original
/// direction and `reply` for replies: the forward and
/// approve chains of examples/nftables/stateful.nft with LAN = r0 and WAN =
/// r1, less its kernel-only set and port forward (no bench traffic would
/// touch them); with `snat`, a postrouting chain as well that source-NATs
/// what leaves by the WAN port to r1's address, as masquerade would.
pub fn ruleset(mark: u32, reply: u32, snat: bool) -> String {
    let nat = if snat {
        format!(
            "table ip fpbench_nat {{\n\
             \tchain postrouting {{\n\
             \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
             \t\toifname \"{r1}\" snat to {SNAT_TO}\n\
             \t}}\n\
             }}\n",
            r1 = topo::R1
        )
    } else {
        String::new()
    };
    nat + &format!(
        "table inet fpbench_stateful {{\n\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority filter; policy drop;\n\
         \t\tct state new ct event set {events:#x}\n\
         \t\tct state new meta l4proto != {{ tcp, udp }} ct event set 0x0\n\
         \t\tct state invalid drop\n\
         \t\tct direction reply tcp flags & (syn|ack) == syn|ack ct status ! assured ct event set {handshake_events:#x}\n\
         \t\tct direction reply meta l4proto udp ct status ! assured ct event set {handshake_events:#x}\n\
         \t\tmeta l4proto udp ct status assured ct event set {events:#x}\n\
         \t\tct direction original tcp flags & (syn|fin|rst) == 0 ct label ! {closing} ct event set {events:#x}\n\
         \t\ttcp flags & fin == fin ct event set {closed_events:#x} ct label set {closing}\n\
         \t\tct state established ct direction original ct mark set ct mark or {mark:#x} accept\n\
         \t\tct state established ct direction reply ct mark set ct mark or {reply:#x} accept\n\
         \t\tct state related accept\n\
         \t\tiifname \"{r0}\" oifname \"{r1}\" accept\n\
         \t}}\n\
         \tchain approve {{\n\
         \t\ttype filter hook forward priority filter + 1; policy accept;\n\
         \t\tct state new ct mark set ct mark or {mark:#x}\n\
         \t}}\n\
         }}\n",
        events = CT_EVENTS,
        closed_events = CT_EVENTS_AFTER_FIN,
        handshake_events = CT_EVENTS_IN_HANDSHAKE,
        closing = CT_LABEL_CLOSING,
        r0 = topo::R0,
        r1 = topo::R1
    )
}

pub(super) fn run(ns: &str, args: &[&str]) -> Result<std::process::Output> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output().with_context(|| format!("running {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "{} in {ns}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// Loads the ruleset in the router namespace (which also starts conntrack
/// there) and stretches this namespace's UDP timeouts: the reference
/// forwarder cannot refresh an entry (the kfuncs have no such call), so
/// between the kernel's refreshes entries must outlive a whole mode.
pub fn load_ruleset(t: &Topology, mark: u32, reply: u32, snat: bool, strict_tcp: bool, work: &Path) -> Result<()> {
    let file = work.join("stateful.nft");
    std::fs::write(&file, ruleset(mark, reply, snat)).context("writing the ruleset")?;
    run(&t.router, &["nft", "-f", &file.to_string_lossy()])?;
    // Liberal TCP window tracking: conntrack never sees the data an XDP
    // forwarder passes by, so a strict check would call the next packet it
    // does see (the peer acknowledging that data, a FIN) INVALID and the
    // ruleset would drop it. The kernel's own flowtable fast path sets the
    // same per connection; here it is the namespace's setting in every mode
    // (`--strict-tcp` leaves the default to see who copes without it).
    for (key, value) in [
        ("nf_conntrack_udp_timeout", "3600"),
        ("nf_conntrack_udp_timeout_stream", "3600"),
        ("nf_conntrack_tcp_be_liberal", if strict_tcp { "0" } else { "1" }),
    ] {
        topo::in_netns(&t.router, || {
            std::fs::write(format!("/proc/sys/net/netfilter/{key}"), value)
                .with_context(|| format!("sysctl net.netfilter.{key}={value} in the router namespace"))
        })??;
    }
    Ok(())
}

/// Source ports of the generator's flows that conntrack in the router
/// holds: (established and carrying all bits of `mark`, any state).
pub fn flow_entries(t: &Topology, mark: u32) -> Result<(BTreeSet<u16>, BTreeSet<u16>)> {
    let (gen, sink) = hosts(t);
    let out = run(
        &t.router,
        &["conntrack", "-L", "-p", "udp", "--orig-src", gen, "--orig-dst", sink])?;
    let (mut good, mut any) = (BTreeSet::new(), BTreeSet::new());
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // The first sport=/dport= are the original direction's.
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .and_then(|v| v.parse::<u32>().ok())
        };
        let (Some(sport), Some(dport)) = (field("sport="), field("dport=")) else {
            continue;
        };
        let Ok(sport) = u16::try_from(sport) else { continue };
        if dport != u32::from(UDP_DPORT) {
            continue;
        }
        any.insert(sport);
        let marked = field("mark=").is_some_and(|m| m & mark == mark);
        if marked && !line.contains("[UNREPLIED]") {
            good.insert(sport);
        }
    }
    Ok((good, any))
}

/// The generator's flow ports (flows <= 32768: source ports only differ).
pub fn flow_sports(flows: u32) -> impl Iterator<Item = u16> {
    (0..flows).map(|i| SPORT_BASE.wrapping_add(i as u16))
}

/// Makes conntrack hold every one of `flows` as established, assured and
/// marked, as the ruleset leaves a flow that has seen a reply: one
/// `conntrack -R` batch (ctnetlink) of the missing entries; with `snat`,
/// source-NATed to r1's address as the ruleset's postrouting chain would
/// (ports kept). Returns how many were created and how long that took.
pub fn ensure_entries(t: &Topology, flows: u32, mark: u32, snat: bool, work: &Path) -> Result<(usize, Duration)> {
    let (good, any) = flow_entries(t, mark)?;
    let (gen, sink) = hosts(t);
    if snat && t.family != topo::Family::V4 {
        bail!("the source NAT of the bench's ruleset is IPv4's");
    }
    let mut missing: Vec<u16> = flow_sports(flows).filter(|p| !good.contains(p)).collect();
    if missing.is_empty() {
        return Ok((0, Duration::ZERO));
    }
    // An entry in another state (unmarked, unreplied) would make -I fail:
    // start the generator's entries afresh.
    if missing.iter().any(|p| any.contains(p)) {
        let _ = run(
            &t.router,
            &["conntrack", "-D", "-p", "udp", "--orig-src", gen, "--orig-dst", sink]);
        missing = flow_sports(flows).collect();
    }
    let mut batch = String::new();
    // With NAT, conntrack derives the reply tuple from the translation.
    let reply = |p: u16| {
        if snat {
            format!("--src-nat {SNAT_TO}")
        } else {
            format!("--reply-src {sink} --reply-dst {gen} --reply-port-src {UDP_DPORT} --reply-port-dst {p}")
        }
    };
    for p in &missing {
        batch.push_str(&format!(
            "-I -p udp -s {gen} -d {sink} --sport {p} --dport {UDP_DPORT} {} \
             --status SEEN_REPLY,ASSURED --mark {mark} --timeout 3600\n",
            reply(*p)
        ));
    }
    let ins = work.join("ct-ins.batch");
    std::fs::write(&ins, batch).context("writing the conntrack batch")?;
    let t0 = Instant::now();
    run(&t.router, &["conntrack", "-R", &ins.to_string_lossy()])?;
    let took = t0.elapsed();
    let (now, _) = flow_entries(t, mark)?;
    let absent = flow_sports(flows).filter(|p| !now.contains(p)).count();
    if absent > 0 {
        bail!("{absent} of {flows} conntrack entries still missing after conntrack -R");
    }
    Ok((missing.len(), took))
}

/// Removes every TCP entry of the router's conntrack (between the
/// connection-rate runs of two modes, so each starts from the same table).
pub fn flush_tcp(t: &Topology) -> Result<()> {
    // Exit status 1 with nothing to delete.
    let _ = run(&t.router, &["conntrack", "-D", "-p", "tcp"]);
    Ok(())
}

/// Count of the router's conntrack entries.
pub fn count(t: &Topology) -> Result<u64> {
    let out = run(&t.router, &["conntrack", "-C"])?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("parsing conntrack -C")
}

/// The hosts' side of real TCP through the lab: a veth accepts
/// XDP-redirected frames only with XDP or GRO on the receiver (g0 and s0;
/// the sink program is gone by then), and checksum offload off, since a
/// redirected frame still carrying a partial checksum would leave broken.
pub fn prepare_tcp_hosts(t: &Topology) -> Result<()> {
    for (ns, dev) in [(&t.gen, topo::G0), (&t.sink, topo::S0)] {
        run(ns, &["ethtool", "-K", dev, "gro", "on", "tx", "off"])?;
    }
    // The packet generator needs no routes; sockets do.
    run(&t.gen, &["ip", "route", "add", "198.51.100.0/24", "via", "192.0.2.1", "dev", topo::G0])?;
    run(&t.sink, &["ip", "route", "add", "192.0.2.0/24", "via", "198.51.100.1", "dev", topo::S0])?;
    // Replies enter the router at r1; GRO lets r1 take frames fastpath redirects there too.
    run(&t.router, &["ethtool", "-K", topo::R1, "gro", "on"])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruleset_marks_established_and_drops_by_default() {
        let r = ruleset(0x10, 0x20, false);
        assert!(!r.contains("nat"));
        assert!(r.contains("policy drop;"));
        assert!(r.contains("ct state established ct direction original ct mark set ct mark or 0x10 accept"));
        assert!(r.contains("ct state established ct direction reply ct mark set ct mark or 0x20 accept"));
        assert!(r.contains("ct state invalid drop"));
        assert!(r.contains("ct state new ct event set 0x84\n"));
        assert!(r.contains("ct direction reply tcp flags & (syn|ack) == syn|ack ct status ! assured ct event set 0x4\n"));
        assert!(r.contains("ct direction original tcp flags & (syn|fin|rst) == 0 ct label ! 127 ct event set 0x84\n"));
        assert!(r.contains("ct state new meta l4proto != { tcp, udp } ct event set 0x0\n"));
        assert!(r.contains("ct direction reply meta l4proto udp ct status ! assured ct event set 0x4\n"));
        assert!(r.contains("meta l4proto udp ct status assured ct event set 0x84\n"));
        assert!(r.contains("tcp flags & fin == fin ct event set 0x80 ct label set 127\n"));
        assert!(r.contains("priority filter + 1; policy accept;\n\t\tct state new ct mark set ct mark or 0x10\n"));
        assert!(r.contains("iifname \"r0\" oifname \"r1\" accept"));
    }

    #[test]
    fn snat_ruleset_translates_what_leaves_by_the_wan_port() {
        let r = ruleset(0x1, 0x2, true);
        assert!(r.contains("type nat hook postrouting priority srcnat; policy accept;\n\t\toifname \"r1\" snat to 198.51.100.1\n"));
        assert!(r.contains(&ruleset(0x1, 0x2, false)), "the forward ruleset stays as it is");
    }

    #[test]
    fn flow_ports_match_the_generator() {
        let p: Vec<u16> = flow_sports(3).collect();
        assert_eq!(p, vec![SPORT_BASE, SPORT_BASE + 1, SPORT_BASE + 2]);
    }
}
