//! The /proc/sys values that change forwarding decisions. /proc/sys/net shows
//! the network namespace of the *reading thread*, so these must be read from
//! the daemon's own netns thread.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::model::{GlobalSysctl, IfSysctl, Link};

#[derive(Debug, Clone)]
pub struct SysctlReader {
    root: PathBuf,
}

impl Default for SysctlReader {
    fn default() -> Self {
        SysctlReader {
            root: PathBuf::from("/proc/sys"),
        }
    }
}

impl SysctlReader {
    /// A reader rooted elsewhere than /proc/sys (tests use a temp directory).
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        SysctlReader { root: root.into() }
    }

    fn read(&self, rel: &Path) -> Option<i64> {
        let text = std::fs::read_to_string(self.root.join(rel)).ok()?;
        text.trim().parse().ok()
    }

    fn conf(&self, proto: &str, dev: &str, key: &str) -> Option<i64> {
        self.read(
            &Path::new("net")
                .join(proto)
                .join("conf")
                .join(dev)
                .join(key),
        )
    }

    /// A `fib_multipath_hash_fields` sysctl (proc_douintvec: one unsigned
    /// decimal); the kernel's default where it does not exist.
    fn fields(&self, p: &Path) -> u32 {
        self.read(p).and_then(|v| u32::try_from(v).ok()).unwrap_or(crate::mphash::FIELDS_DEFAULT)
    }

    pub fn global(&self) -> GlobalSysctl {
        GlobalSysctl {
            forwarding6_all: self.conf("ipv6", "all", "forwarding").unwrap_or(0) != 0,
            ip_forward_use_pmtu: self
                .read(Path::new("net/ipv4/ip_forward_use_pmtu"))
                .unwrap_or(0)
                != 0,
            mp_policy4: clamp_u8(self.read(Path::new("net/ipv4/fib_multipath_hash_policy")).unwrap_or(0)),
            mp_policy6: clamp_u8(self.read(Path::new("net/ipv6/fib_multipath_hash_policy")).unwrap_or(0)),
            mp_fields4: self.fields(Path::new("net/ipv4/fib_multipath_hash_fields")),
            mp_fields6: self.fields(Path::new("net/ipv6/fib_multipath_hash_fields")),
            // proc_douintvec: one unsigned decimal.
            mp_seed: self
                .read(Path::new("net/ipv4/fib_multipath_hash_seed"))
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(0),
            ignore_linkdown4_all: self.conf("ipv4", "all", "ignore_routes_with_linkdown").unwrap_or(0) != 0,
        }
    }

    /// net.ipv4.conf.all.rp_filter: the kernel applies max(all, dev).
    pub fn all_rp_filter(&self) -> u8 {
        clamp_u8(self.conf("ipv4", "all", "rp_filter").unwrap_or(0))
    }

    /// The sysctls of one device; a device without a /proc/sys entry (no IPv4
    /// or IPv6 on it, or a name we cannot express) gets false/0.
    pub fn link(&self, name: &str, all_rp_filter: u8) -> IfSysctl {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return IfSysctl::default();
        }
        let dev_rp = self.conf("ipv4", name, "rp_filter").map(clamp_u8);
        let disable_ipv6 = self.conf("ipv6", name, "disable_ipv6").unwrap_or(0) != 0;
        let mtu6 = if disable_ipv6 {
            0
        } else {
            self.conf("ipv6", name, "mtu").unwrap_or(0)
        };
        IfSysctl {
            forwarding4: self.conf("ipv4", name, "forwarding").unwrap_or(0) != 0,
            forwarding6: self.conf("ipv6", name, "forwarding").unwrap_or(0) != 0,
            rp_filter: dev_rp.map_or(0, |rp| rp.max(all_rp_filter)),
            mtu6: u32::try_from(mtu6).unwrap_or(0),
            disable_ipv6,
            ignore_linkdown4: self.conf("ipv4", name, "ignore_routes_with_linkdown").unwrap_or(0) != 0,
            ignore_linkdown6: self.conf("ipv6", name, "ignore_routes_with_linkdown").unwrap_or(0) != 0,
        }
    }

    /// Every link's sysctls plus the namespace-wide ones.
    pub fn read_all(&self, links: &BTreeMap<u32, Link>) -> (BTreeMap<u32, IfSysctl>, GlobalSysctl) {
        let all_rp = self.all_rp_filter();
        let per_link = links
            .iter()
            .map(|(idx, l)| (*idx, self.link(&l.name, all_rp)))
            .collect();
        (per_link, self.global())
    }
}

fn clamp_u8(v: i64) -> u8 {
    u8::try_from(v.max(0)).unwrap_or(u8::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn tree() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "fp-sysctl-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        let put = |rel: &str, v: &str| {
            let p = dir.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, format!("{v}\n")).unwrap();
        };
        put("net/ipv4/conf/all/rp_filter", "1");
        put("net/ipv4/conf/eth0/rp_filter", "2");
        put("net/ipv4/conf/eth0/forwarding", "1");
        put("net/ipv6/conf/eth0/forwarding", "1");
        put("net/ipv6/conf/eth0/mtu", "1400");
        put("net/ipv6/conf/eth0/disable_ipv6", "0");
        put("net/ipv4/conf/eth1.100/rp_filter", "0");
        put("net/ipv4/conf/eth1.100/forwarding", "1");
        put("net/ipv6/conf/eth1.100/forwarding", "1");
        put("net/ipv6/conf/eth1.100/mtu", "1500");
        put("net/ipv6/conf/eth1.100/disable_ipv6", "1");
        put("net/ipv4/conf/v4only/forwarding", "1");
        put("net/ipv4/conf/v4only/rp_filter", "0");
        put("net/ipv6/conf/all/forwarding", "1");
        put("net/ipv4/ip_forward_use_pmtu", "0");
        put("net/ipv4/fib_multipath_hash_policy", "1");
        put("net/ipv6/fib_multipath_hash_policy", "2");
        // proc_douintvec shows it in decimal.
        put("net/ipv4/fib_multipath_hash_fields", "3");
        put("net/ipv4/fib_multipath_hash_seed", "4294967295");
        put("net/ipv4/conf/all/ignore_routes_with_linkdown", "1");
        put("net/ipv6/conf/eth0/ignore_routes_with_linkdown", "1");
        dir
    }

    #[test]
    fn reads_links_and_globals() {
        let dir = tree();
        let r = SysctlReader::with_root(&dir);
        assert_eq!(
            r.global(),
            GlobalSysctl {
                forwarding6_all: true,
                ip_forward_use_pmtu: false,
                mp_policy4: 1,
                mp_policy6: 2,
                mp_fields4: 3,
                mp_fields6: crate::mphash::FIELDS_DEFAULT,
                mp_seed: u32::MAX,
                ignore_linkdown4_all: true,
            }
        );
        let all = r.all_rp_filter();
        assert_eq!(all, 1);
        assert_eq!(
            r.link("eth0", all),
            IfSysctl {
                forwarding4: true,
                forwarding6: true,
                rp_filter: 2,
                mtu6: 1400,
                disable_ipv6: false,
                ignore_linkdown4: false,
                ignore_linkdown6: true,
            }
        );
        // Dotted VLAN names are literal directory names in /proc/sys; all.rp_filter wins over 0.
        assert_eq!(
            r.link("eth1.100", all),
            IfSysctl {
                forwarding4: true,
                forwarding6: true,
                rp_filter: 1,
                mtu6: 0,
                disable_ipv6: true,
                ..Default::default()
            }
        );
        // No IPv6 conf directory: forwarding6 false, mtu6 0.
        assert_eq!(
            r.link("v4only", all),
            IfSysctl {
                forwarding4: true,
                forwarding6: false,
                rp_filter: 1,
                mtu6: 0,
                disable_ipv6: false,
                ..Default::default()
            }
        );
        assert_eq!(r.link("missing", all), IfSysctl::default());
        assert_eq!(r.link("../x", all), IfSysctl::default());
        fs::remove_dir_all(dir).unwrap();
    }
}
