//! The BGP route source of `fastpath bench table1`: FRR zebra + bgpd in the
//! router namespace (bgpd learns, zebra installs into the kernel, fastpath
//! mirrors the kernel), and a bgpd without zebra in the sink namespace that
//! originates the routes. The session stays up across repetitions; an
//! outbound route-map on the peer is flipped to announce or withdraw them
//! all at once, so the measurement starts with the UPDATEs, not with a
//! session coming up.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::{chown, Pid, User};

pub const ZEBRA: &str = "/usr/lib/frr/zebra";
pub const BGPD: &str = "/usr/lib/frr/bgpd";
const ROUTER_AS: u32 = 65001;
const PEER_AS: u32 = 65002;
const ROUTER_IP: &str = "198.51.100.1";
const PEER_IP: &str = "198.51.100.2";

pub fn available() -> bool {
    Path::new(ZEBRA).exists() && Path::new(BGPD).exists()
}

/// One FRR daemon, stopped by its pid on drop.
struct Daemon {
    name: &'static str,
    child: Child,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        log::warn!("{} ignored SIGTERM, killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// FRR in one namespace: its own directory for config, sockets and pid files.
struct Instance {
    ns: String,
    dir: PathBuf,
    daemons: Vec<Daemon>,
}

impl Instance {
    fn new(ns: &str, dir: PathBuf) -> Result<Instance> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let parent = dir.parent().context("FRR directory has no parent")?;
        // The daemons drop to the frr user, which must reach its files.
        let frr = User::from_name("frr").context("looking up the frr user")?.context("no frr user (is FRR installed?)")?;
        for d in [parent, dir.as_path()] {
            chown(d, Some(frr.uid), Some(frr.gid)).with_context(|| format!("chown {}", d.display()))?;
        }
        Ok(Instance { ns: ns.into(), dir, daemons: Vec::new() })
    }

    fn start(&mut self, name: &'static str, bin: &str, conf: &str, extra: &[&str]) -> Result<()> {
        let d = &self.dir;
        let conf_path = d.join(format!("{name}.conf"));
        std::fs::write(&conf_path, conf).with_context(|| format!("writing {}", conf_path.display()))?;
        let out = std::fs::File::create(d.join(format!("{name}.out"))).context("creating the FRR log")?;
        let err = out.try_clone().context("duplicating the log fd")?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, bin])
            .args(extra)
            .args(["-u", "frr", "-g", "frr", "-i"])
            .arg(d.join(format!("{name}.pid")))
            .arg("-z")
            .arg(d.join("zserv.api"))
            .arg("--vty_socket")
            .arg(d)
            .arg("-f")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {bin}"))?;
        self.daemons.push(Daemon { name, child });
        Ok(())
    }

    fn vtysh(&self, cmds: &[&str]) -> Result<String> {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, "vtysh", "--vty_socket"]).arg(&self.dir);
        for cmd in cmds {
            c.args(["-c", cmd]);
        }
        let out = c.output().context("running vtysh")?;
        if !out.status.success() {
            bail!("vtysh {}: {}", cmds.join(" / "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for d in &self.daemons {
            let text = std::fs::read_to_string(self.dir.join(format!("{}.out", d.name))).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(10).collect();
            let _ = writeln!(s, "--- {} in {}:", d.name, self.ns);
            for l in tail.into_iter().rev() {
                let _ = writeln!(s, "{l}");
            }
        }
        s
    }
}

/// The two speakers, session established, nothing announced.
pub struct Bgp {
    router: Instance,
    peer: Instance,
    /// Removed on drop, after the daemons (field order).
    _dir: FrrDir,
}

/// The daemons drop to the frr user, which cannot enter the bench's private
/// scratch directory: a directory of their own.
struct FrrDir(PathBuf);

impl FrrDir {
    fn create() -> Result<FrrDir> {
        let template = std::env::temp_dir().join("fpbench-frr-XXXXXX");
        let p = nix::unistd::mkdtemp(&template).with_context(|| format!("creating {}", template.display()))?;
        Ok(FrrDir(p))
    }
}

impl Drop for FrrDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Bgp {
    /// `prefixes`: what the peer originates (announced only by `announce`).
    pub fn start(router_ns: &str, peer_ns: &str, prefixes: &[String]) -> Result<Bgp> {
        let dir = FrrDir::create()?;
        let mut router = Instance::new(router_ns, dir.0.join("router"))?;
        let mut peer = Instance::new(peer_ns, dir.0.join("peer"))?;
        router.start("zebra", ZEBRA, "hostname t1-router\n", &[])?;
        wait(Duration::from_secs(10), "zebra's zserv socket", || Ok(router.dir.join("zserv.api").exists()))?;
        let rconf = format!(
            "hostname t1-router\nrouter bgp {ROUTER_AS}\n bgp router-id {ROUTER_IP}\n no bgp ebgp-requires-policy\n \
             neighbor {PEER_IP} remote-as {PEER_AS}\n neighbor {PEER_IP} timers connect 1\n"
        );
        router.start("bgpd", BGPD, &rconf, &[])?;
        let mut pconf = format!(
            "hostname t1-peer\nroute-map OUT deny 10\n!\nrouter bgp {PEER_AS}\n bgp router-id {PEER_IP}\n \
             no bgp ebgp-requires-policy\n no bgp network import-check\n neighbor {ROUTER_IP} remote-as {ROUTER_AS}\n \
             neighbor {ROUTER_IP} timers connect 1\n address-family ipv4 unicast\n  neighbor {ROUTER_IP} route-map OUT out\n"
        );
        for p in prefixes {
            let _ = writeln!(pconf, "  network {p}");
        }
        pconf += " exit-address-family\n";
        // -Z: no zebra on the peer; it only originates.
        peer.start("bgpd", BGPD, &pconf, &["-Z"])?;
        let bgp = Bgp { router, peer, _dir: dir };
        wait(Duration::from_secs(60), "the BGP session", || {
            Ok(bgp.router.vtysh(&["show bgp summary"]).map(|s| s.contains(PEER_IP) && established(&s)).unwrap_or(false))
        })
        .with_context(|| bgp.router.logs() + &bgp.peer.logs())?;
        Ok(bgp)
    }

    fn set_out(&self, permit: bool) -> Result<()> {
        let (from, to) = if permit { ("deny", "permit") } else { ("permit", "deny") };
        let no = format!("no route-map OUT {from} 10");
        let yes = format!("route-map OUT {to} 10");
        let clear = format!("clear bgp ipv4 unicast {ROUTER_IP} soft out");
        self.peer.vtysh(&["configure terminal", &no, &yes, "end", &clear])?;
        Ok(())
    }

    /// The peer sends its UPDATEs now.
    pub fn announce(&self) -> Result<()> {
        self.set_out(true)
    }

    /// The peer withdraws everything.
    pub fn withdraw(&self) -> Result<()> {
        self.set_out(false)
    }

    pub fn logs(&self) -> String {
        self.router.logs() + &self.peer.logs()
    }
}

/// `show bgp summary` has a prefix count, not a state, in the neighbour's
/// State/PfxRcd column once the session is up.
fn established(summary: &str) -> bool {
    summary.lines().filter(|l| l.starts_with(PEER_IP)).any(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        cols.len() >= 10 && cols[9].parse::<u64>().is_ok()
    })
}

fn wait(timeout: Duration, what: &str, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if f()? {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("{what} not up within {timeout:?}")
}
