//! `fastpath`: the daemon (`fastpath run`) and its clients (`status`,
//! `routes`, `neighbours`), plus the benchmark (`fastpath bench`).

mod admission;
mod afxdp;
mod api;
mod batch;
mod bench;
mod config;
mod cticmp;
mod ctnl;
mod ctliberal;
mod ctwatch;
mod daemon;
mod flows;
mod fpm;
mod heap;
mod ifset;
mod keepalive;
mod links;
mod loader;
mod maps;
mod metrics;
mod netfilter;
mod nlraw;
mod pin;
mod preflight;
mod procstat;
mod published;
mod reload;
mod render;
mod resources_cli;
mod route_batch;
mod startlog;
mod tcpolicy;
mod vethpeer;
mod xfrm;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use fastpath_bpf::intf;

/// Where the daemon serves its API unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/fastpath/fastpath.sock";

#[derive(Debug, Parser)]
#[command(name = "fastpath", version, about = "XDP fast path for Linux routers, mirrored live from the kernel")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the daemon on the given interfaces until SIGINT/SIGTERM.
    Run(RunArgs),
    /// Interfaces, XDP mode, table occupancy and counters.
    Status(StatusArgs),
    /// The routes fastpath holds in its FIB tables.
    Routes(ClientArgs),
    /// The neighbours fastpath forwards to.
    #[command(alias = "neighbors")]
    Neighbours(ClientArgs),
    /// The busiest flows in the flow cache.
    Flows(flows::FlowsArgs),
    /// Traffic generator benchmark (not a test).
    Bench(bench::BenchArgs),
    /// Validate a config file (types, values, interfaces) without starting.
    CheckConfig(config::CheckArgs),
    /// Remove what `fastpath run --pin` left in the kernel: XDP links,
    /// programs, maps and devmap entries (stop the daemon first).
    Detach(pin::DetachArgs),
    /// Size, used and reserved entries of every table (devlink-resource style).
    Resources(resources_cli::ResourcesArgs),
    /// Add or delete a batch of kernel routes, all or nothing.
    Route(route_batch::RouteArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum XdpMode {
    /// Native where the driver supports it, generic (with a warning) elsewhere.
    Auto,
    /// Native (driver) mode only; fail where the driver lacks it.
    Native,
    /// Generic (skb) mode.
    Generic,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// TOML file whose keys are these options' long names; options given
    /// on the command line override it. Re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Prometheus endpoint ADDR:PORT, or `off`.
    #[arg(long, value_name = "ADDR:PORT", default_value = metrics::DEFAULT_ENDPOINT, value_parser = metrics::parse_endpoint)]
    pub metrics: metrics::Endpoint,
    /// The busiest cached flows each scrape exports with their packet (and,
    /// in stateful mode, byte) counts, `fastpath_flow_packets` and
    /// `fastpath_flow_bytes` (0 = none; a series per flow, so keep it small).
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u16).range(0..=1000))]
    pub metrics_flows: u16,
    /// Interface to run on (repeat for each interface).
    #[arg(short = 'i', long = "interface", value_name = "IFACE")]
    pub interfaces: Vec<String>,
    /// Unix socket the API is served on.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Capacity of the IPv4 FIB.
    #[arg(long, value_name = "N", default_value_t = intf::FP_DEFAULT_FIB4_ENTRIES)]
    pub fib4_entries: u32,
    /// How IPv4 destinations are looked up: `trie`, the BPF LPM trie alone;
    /// `dir24`, a /24 index in front of it (33 MiB more, fixed: a first
    /// level per /16 and an entry per /24; one or two array reads answer
    /// every destination whose /24 holds no longer route, where a full
    /// table's trie walk costs a cache miss per level); `auto` takes dir24
    /// when --fib4-entries is 262144 or more.
    #[arg(long, value_enum, default_value_t = Fib4Index::Auto)]
    pub fib4_index: Fib4Index,
    /// Capacity of the IPv6 FIB.
    #[arg(long, value_name = "N", default_value_t = intf::FP_DEFAULT_FIB6_ENTRIES)]
    pub fib6_entries: u32,
    /// IPv6 FIB lookups: `trie` alone, or `multibit`, an index in front of
    /// it (a /16 array and hash entries at /24../64; a full table's trie
    /// walk costs a cache miss per level); `auto` takes multibit when
    /// --fib6-entries is 65536 or more.
    #[arg(long, value_enum, default_value_t = Fib6Index::Auto)]
    pub fib6_index: Fib6Index,
    /// Capacity of the next-hop table (id 0 is never used).
    #[arg(long, value_name = "N", default_value_t = intf::FP_DEFAULT_NEXTHOP_ENTRIES)]
    pub nexthop_entries: u32,
    /// Capacity of the neighbour table.
    #[arg(long, value_name = "N", default_value_t = intf::FP_DEFAULT_NEIGH_ENTRIES)]
    pub neigh_entries: u32,
    /// Capacity of the ECMP group table (id 0 is never used; at most 65536 ids are used).
    #[arg(long, value_name = "N", default_value_t = intf::FP_DEFAULT_GROUP_ENTRIES)]
    pub group_entries: u32,
    /// Capacity of the resilient next-hop group bucket table, all groups together.
    #[arg(long, value_name = "N", default_value_t = intf::FP_DEFAULT_RES_BUCKETS)]
    pub bucket_entries: u32,
    /// Receive buffer of the netlink event socket (an overrun costs a full resync).
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20)]
    pub netlink_rcvbuf: usize,
    /// How the XDP program is attached.
    #[arg(long, value_enum, default_value_t = XdpMode::Auto)]
    pub xdp_mode: XdpMode,
    /// Run even though netfilter base chains (prerouting, forward, postrouting,
    /// netdev ingress/egress) exist: fast-pathed packets skip them. Without it,
    /// fastpath refuses to start (also when it cannot check, e.g. without the
    /// nft binary), and punts all traffic while such chains exist.
    #[arg(long)]
    pub allow_netfilter_bypass: bool,
    /// Forward past tc policy on the managed ports (a qdisc that shapes or
    /// classifies, tc filters or tcx programs): fast-pathed packets skip it.
    /// Without it, traffic arriving on or leaving by such a port goes to the
    /// kernel, and fastpath refuses to start when it cannot check (e.g.
    /// without the tc binary).
    #[arg(long)]
    pub allow_tc_bypass: bool,
    /// Flow-cache capacity per CPU (rounded up to 4 x a power of two).
    #[arg(long, value_name = "N", default_value_t = intf::FP_DEFAULT_FLOW_ENTRIES)]
    pub flow_entries: u32,
    /// Seconds a cached flow may stay idle before it is recomputed; 0 turns
    /// the flow cache off (every packet takes the full lookup).
    #[arg(long, value_name = "SECS", default_value_t = intf::FP_DEFAULT_FLOW_TIMEOUT)]
    pub flow_timeout: u32,
    /// Flow hash source: `auto` loads a device-bound program where the kernel
    /// allows it (for the driver's RX metadata) and asks a real NIC for its
    /// RX hash; a virtual device's (veth) is a software hash computed per
    /// call, so there fastpath hashes itself; `nic` asks every device, veth
    /// too; `off` loads the plain program. Without a NIC hash: a metadata
    /// hint left by an upstream program, else fastpath's own hash.
    #[arg(long, value_enum, default_value_t = RxHash::Auto)]
    pub rx_hash: RxHash,
    /// What identifies a cached TCP/UDP flow: `ports`, the 5-tuple (an entry
    /// per connection); `addresses`, the address pair as for other
    /// protocols (one entry for all connections between two hosts, so a
    /// cache of the same size reaches many more of them; `fastpath flows`
    /// then counts per pair). A family whose multipath hash policy is 1
    /// keeps the ports either way: the kernel picks its ECMP path by them.
    /// Stateless mode only.
    #[arg(long, value_enum, default_value_t = FlowKey::Ports)]
    pub flow_key: FlowKey,
    /// `stateless` forwards by the routing tables alone; `stateful` forwards
    /// only connections conntrack holds as established and the user's
    /// ruleset marked with `--ct-mark`.
    #[arg(long, value_enum, default_value_t = FwdMode::Stateless)]
    pub mode: FwdMode,
    /// Stateful mode: the ct mark bits (all of them) a connection must carry
    /// for packets of its original direction to be fast-pathed, set by the
    /// user's nftables ruleset when it accepts a packet of that direction.
    #[arg(long, value_name = "MASK", default_value_t = intf::FP_DEFAULT_CT_MARK, value_parser = parse_u32_mask)]
    pub ct_mark: u32,
    /// Stateful mode: the same for the reply direction. Bits of their own:
    /// the ruleset decides per packet, and replies it accepts must not
    /// vouch for the other direction's packets it would drop.
    #[arg(long, value_name = "MASK", default_value_t = intf::FP_DEFAULT_CT_MARK_REPLY, value_parser = parse_u32_mask)]
    pub ct_mark_reply: u32,
    /// Stateful mode: how often a cached verdict is re-checked against
    /// conntrack, in milliseconds (conntrack events revoke it at once); at
    /// most 600000 (the data path times verdicts with a 30-bit clock of ~1 ms
    /// ticks, see struct fp_ct_hot).
    #[arg(long, value_name = "MS", default_value_t = intf::FP_DEFAULT_CT_REVALIDATE_MS,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(intf::FP_CT_REVALIDATE_MAX_MS)))]
    pub ct_revalidate_ms: u32,
    /// Stateful mode: ICMP echo conntrack entries the daemon copies for the
    /// data path at most (two map keys each; beyond it new pings stay with
    /// the kernel, counted as `icmp_full`).
    #[arg(long, value_name = "N", default_value_t = intf::FP_DEFAULT_CT_ICMP_ENTRIES / 2,
          value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub ct_icmp_entries: u32,
    /// Stateful mode, for the bench's A/B runs only: leave out parts of the
    /// daemon's conntrack work to measure what each costs. Not for use: the
    /// revocation guarantees need `full`.
    #[arg(long, value_enum, default_value_t = CtAb::Full, hide = true)]
    pub ct_ab: CtAb,
    /// Pin maps, programs and XDP links in bpffs (under --pin-dir): forwarding
    /// outlives the daemon (SIGTERM, SIGINT, crash), and the next `run --pin`
    /// adopts the pinned tables and swaps the programs without a gap.
    /// `fastpath detach` removes everything.
    #[arg(long)]
    pub pin: bool,
    /// Where --pin keeps its objects (on a bpffs, mounted at /sys/fs/bpf if missing).
    #[arg(long, value_name = "DIR", default_value = pin::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// With --pin: pinned objects of another layout or with other table
    /// sizes are replaced by fresh ones instead of refusing to start.
    #[arg(long)]
    pub replace: bool,
    /// Seconds the data path keeps forwarding without a heartbeat from the
    /// daemon (it stopped or hangs) before it punts every packet to the
    /// kernel; 0 = forward on stale tables indefinitely.
    #[arg(long, value_name = "SECS", default_value_t = intf::FP_DEFAULT_ORPHAN_GRACE)]
    pub orphan_grace: u32,
    /// Where routes and next hops come from: `kernel` (netlink) or `fpm`
    /// (FRR zebra's dplane_fpm_nl connects to --fpm-listen; links,
    /// addresses, neighbours and the local table still come from the kernel).
    #[arg(long, value_enum, default_value_t = RouteSource::Kernel)]
    pub route_source: RouteSource,
    /// --route-source fpm: TCP address the FPM server listens on.
    #[arg(long, value_name = "ADDR:PORT", default_value = fpm::DEFAULT_LISTEN)]
    pub fpm_listen: std::net::SocketAddr,
    /// --route-source fpm: seconds zebra's routes keep forwarding after its
    /// connection is lost (it reconnects every 3 s and replays) before they are flushed.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub fpm_grace: u32,
    /// Where forwarded packets are rewritten and sent: `xdp` in the XDP
    /// program; `afxdp` in user space (AF_XDP sockets, one thread per RX
    /// queue) after the XDP program decided forward vs punt.
    #[arg(long, value_enum, default_value_t = Datapath::Xdp)]
    pub datapath: Datapath,
    /// AF_XDP: busy-poll the sockets instead of sleeping in poll().
    #[arg(long)]
    pub busy_poll: bool,
    /// AF_XDP: descriptors processed per ring round.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub afxdp_batch: u32,
    /// AF_XDP: prefetch frame i+N while rewriting frame i (0 = off).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub afxdp_prefetch: u32,
    #[command(flatten)]
    pub admission: admission::AdmissionArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RouteSource {
    Kernel,
    Fpm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Datapath {
    Xdp,
    Afxdp,
}

/// What the stateful daemon does of its conntrack work (see `--ct-ab`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CtAb {
    /// Everything: events, liberal window tracking when the data path asks.
    Full,
    /// A liberal update for every marked TCP entry as its conntrack event
    /// arrives, whether the data path would ever ask for it or not.
    EagerLiberal,
    /// Events, but no liberal updates of TCP entries.
    NoLiberal,
    /// No conntrack event subscription at all (nftables events stay).
    NoEvents,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FwdMode {
    Stateless,
    Stateful,
}

/// A non-zero u32, decimal or 0x-hex.
impl RunArgs {
    /// Stateful mode's mark bits of both directions.
    pub fn ct_marks(&self) -> ctwatch::CtMarks {
        ctwatch::CtMarks { orig: self.ct_mark, reply: self.ct_mark_reply }
    }

    /// Whether IPv4 lookups go through the /24 index.
    pub fn fib4_dir(&self) -> bool {
        match self.fib4_index {
            Fib4Index::Auto => self.fib4_entries >= FIB4_DIR24_AUTO,
            Fib4Index::Trie => false,
            Fib4Index::Dir24 => true,
        }
    }
}

impl RunArgs {
    /// Whether IPv6 lookups go through the multibit index.
    pub fn fib6_dir(&self) -> bool {
        match self.fib6_index {
            Fib6Index::Auto => self.fib6_entries >= FIB6_DIR_AUTO,
            Fib6Index::Trie => false,
            Fib6Index::Multibit => true,
        }
    }
}

fn parse_u32_mask(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse::<u32>(),
    }
    .map_err(|e| format!("{s:?} is not a 32-bit mask: {e}"))?;
    if v == 0 {
        return Err("the mark mask must have at least one bit set".into());
    }
    Ok(v)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fib4Index {
    Auto,
    Trie,
    Dir24,
}

/// `--fib4-index auto` turns the /24 index on from this IPv4 FIB capacity:
/// a table that size makes the trie deep, and its 32 MiB small beside it.
pub const FIB4_DIR24_AUTO: u32 = 262_144;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fib6Index {
    Auto,
    Trie,
    Multibit,
}

/// `--fib6-index auto` turns the multibit index on from this IPv6 FIB
/// capacity: a table that size makes the trie deep.
pub const FIB6_DIR_AUTO: u32 = 65_536;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FlowKey {
    Ports,
    Addresses,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RxHash {
    Auto,
    Nic,
    Off,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Print the daemon's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Unix socket of the daemon.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Show every reason, not only the non-zero ones.
    #[arg(long)]
    pub all: bool,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .target(env_logger::Target::Pipe(Box::new(startlog::Gate)))
        .init();
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Run(args) => {
            startlog::hold();
            config::for_run(args).and_then(daemon::run)
        }
        Cmd::Status(args) => api::client_status(&args),
        Cmd::Routes(args) => api::client_routes(&args),
        Cmd::Neighbours(args) => api::client_neighbours(&args),
        Cmd::Flows(args) => flows::client(&args),
        Cmd::Bench(args) => bench::run(args),
        Cmd::CheckConfig(args) => config::check(&args),
        Cmd::Detach(args) => pin::detach(&args),
        Cmd::Resources(args) => resources_cli::main(&args),
        Cmd::Route(args) => route_batch::client(&args),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, whole context chain: scripts and humans both read it.
            startlog::discard();
            eprintln!("fastpath: {e:#}");
            ExitCode::FAILURE
        }
    }
}
