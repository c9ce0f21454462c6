//! `fastpath route add|del --batch FILE`: all or nothing, with the kernel
//! kept the source of truth.
//!
//! The daemon first reserves every route of the batch against the BPF
//! target (the tables as the maps hold them, plus what earlier batches
//! reserved and the mirror has not picked up yet). If any entry does not
//! fit, the batch fails with ENOSPC naming that entry, and nothing changed
//! anywhere. Otherwise the routes go into the kernel over rtnetlink; if
//! the kernel refuses one midway, those already added are removed again.
//! The mirror then picks the routes up as it does any other route.
//!
//! API: `{"cmd":"route_batch","op":"add"|"del","text":"<file contents>"}`
//! -> `{"op":str, "routes":n, "new_entries":{"fib4":n,"fib6":n,"nexthops":n}}`.

mod netlink;
pub mod parse;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use fastpath_core::resources::bpf_target::{FIB4, FIB6, NEXTHOPS};
use fastpath_core::resources::models::Predictive;
use fastpath_core::resources::{BpfTarget, BpfUsage, Entry, Model, Target};
use fastpath_core::tables::{Capacities, Desired};
use serde::Deserialize;
use serde_json::json;

use crate::api::Snapshot;
use netlink::{Resolved, Rtnl};
use parse::{Line, Via};

/// A reservation the mirror has not confirmed within this long is dropped
/// (the route was deleted again, or it is one fastpath does not hold).
const PENDING_TTL: Duration = Duration::from_secs(10);

/// What a batch reserved that the applied tables do not show yet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Route(IpAddr, u8),
    /// `None` ifindex: `via` without `dev` (any device matches).
    Nexthop(Option<u32>, Option<IpAddr>),
}

impl Key {
    fn pool(&self) -> usize {
        match self {
            Key::Route(IpAddr::V4(_), _) => FIB4,
            Key::Route(IpAddr::V6(_), _) => FIB6,
            Key::Nexthop(..) => NEXTHOPS,
        }
    }

    fn entry(&self) -> Entry {
        match self {
            Key::Route(IpAddr::V4(_), len) => Entry::route4(*len),
            Key::Route(IpAddr::V6(_), len) => Entry::route6(*len),
            Key::Nexthop(..) => Entry::Nexthop,
        }
    }

    fn applied(&self, a: &Desired) -> bool {
        match self {
            Key::Route(IpAddr::V4(v), len) => a.fib4.contains_key(&(*v, *len)),
            Key::Route(IpAddr::V6(v), len) => a.fib6.contains_key(&(*v, *len)),
            Key::Nexthop(ifindex, gw) => {
                a.nexthops.values().any(|n| n.gateway == *gw && ifindex.is_none_or(|i| i == n.ifindex))
            }
        }
    }
}

/// Reservations of batches the mirror has not caught up with. One lock
/// also serialises batches, so two cannot reserve the same free slot.
static LEDGER: Mutex<BTreeMap<Key, Instant>> = Mutex::new(BTreeMap::new());

fn ledger() -> MutexGuard<'static, BTreeMap<Key, Instant>> {
    match LEDGER.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Drops what the applied tables now hold (or what never showed up).
fn settle(pending: &mut BTreeMap<Key, Instant>, applied: &Desired) {
    pending.retain(|k, t| !k.applied(applied) && t.elapsed() < PENDING_TTL);
}

fn caps(snap: &Snapshot) -> Result<Capacities> {
    snap.caps.ok_or_else(|| anyhow!("the daemon is still starting (no tables yet)"))
}

/// The BPF target as it stands: the applied tables plus pending reservations.
pub fn bpf_target(snap: &Snapshot) -> Result<BpfTarget> {
    let caps = caps(snap)?;
    let mut pending = ledger();
    settle(&mut pending, &snap.applied);
    Ok(target_with(&caps, &snap.applied, &pending))
}

fn target_with(caps: &Capacities, applied: &Desired, pending: &BTreeMap<Key, Instant>) -> BpfTarget {
    let mut usage = BpfUsage::of(caps, applied);
    for k in pending.keys() {
        usage.pools[k.pool()].reserved += 1;
    }
    BpfTarget::new(usage)
}

#[derive(Deserialize)]
struct Request {
    op: String,
    text: String,
}

/// The API command (runs on the API thread).
pub fn handle(line: &str, snap: &Snapshot) -> Result<serde_json::Value> {
    let req: Request = serde_json::from_str(line).context("route_batch wants {\"op\":\"add\"|\"del\",\"text\":FILE}")?;
    let lines = parse::parse(&req.text).map_err(|e| anyhow!("{e}"))?;
    let resolved = resolve(&lines)?;
    let mut pending = ledger();
    settle(&mut pending, &snap.applied);
    match req.op.as_str() {
        "add" => add(snap, &resolved, &mut pending),
        "del" => del(snap, &resolved, &mut pending),
        other => bail!("unknown route_batch op {other:?} (add, del)"),
    }
}

fn resolve(lines: &[Line]) -> Result<Vec<Resolved<'_>>> {
    lines
        .iter()
        .map(|l| {
            let dev = match &l.via {
                Via::Gateway { dev, .. } => dev.as_deref(),
                Via::Dev(d) => Some(d.as_str()),
                Via::Blackhole => None,
            };
            let oif = match dev {
                None => None,
                Some(d) => Some(nix::net::if_::if_nametoindex(d).map_err(|e| anyhow!("{}: device {d:?}: {e}", l.name()))?),
            };
            Ok(Resolved { line: l, oif })
        })
        .collect()
}

/// The entries a route needs that nothing holds or reserved yet.
fn needs(r: &Resolved) -> Vec<Key> {
    let route = Key::Route(r.line.dst, r.line.len);
    match &r.line.via {
        Via::Blackhole => vec![route],
        Via::Gateway { gw, .. } => vec![route, Key::Nexthop(r.oif, Some(*gw))],
        Via::Dev(_) => vec![route, Key::Nexthop(r.oif, None)],
    }
}

fn add(snap: &Snapshot, batch: &[Resolved], pending: &mut BTreeMap<Key, Instant>) -> Result<serde_json::Value> {
    // The reservation below is exact for the BPF maps (every model on the
    // bpf target admits what fits them); a simulated ASIC's pools are the
    // daemon loop's own and are not consulted here, so its all-or-nothing
    // answer could not be kept.
    if let Some(a) = snap.admission.as_ref().filter(|a| a.target != "bpf") {
        bail!(
            "batch refused, nothing was changed: the daemon admits routes through {} on the {} target, and batches reserve only against the BPF maps (run with --resource-target bpf)",
            a.model,
            a.target
        );
    }
    let caps = caps(snap)?;
    let target: Arc<dyn Target> = Arc::new(target_with(&caps, &snap.applied, pending));
    // Exact for the BPF maps: the daemon is their only writer.
    let model = Predictive::new(Arc::clone(&target), false);
    let mut new: Vec<Key> = Vec::new();
    for r in batch {
        for k in needs(r) {
            if k.applied(&snap.applied) || pending.contains_key(&k) || new.contains(&k) {
                continue;
            }
            model.admit(&k.entry()).map_err(|d| {
                anyhow!(
                    "batch refused, nothing was changed: {}: {d} (the {} new entries before it in this batch fit; {} held by earlier batches not yet mirrored)",
                    r.line.name(),
                    new.len(),
                    pending.len()
                )
            })?;
            new.push(k);
        }
    }
    let mut rtnl = Rtnl::open()?;
    for (i, r) in batch.iter().enumerate() {
        if let Err(e) = rtnl.add(r) {
            let undone = undo(&mut rtnl, &batch[..i], |rt, r| rt.del(r));
            bail!("batch refused by the kernel, {undone}: {}: {e}", r.line.name());
        }
    }
    let now = Instant::now();
    let count = |pool| new.iter().filter(|k| k.pool() == pool).count();
    let summary = json!({"op": "add", "routes": batch.len(),
        "new_entries": {"fib4": count(FIB4), "fib6": count(FIB6), "nexthops": count(NEXTHOPS)}});
    for k in new {
        pending.insert(k, now);
    }
    log::info!("route batch: added {} routes", batch.len());
    Ok(summary)
}

fn del(snap: &Snapshot, batch: &[Resolved], pending: &mut BTreeMap<Key, Instant>) -> Result<serde_json::Value> {
    // Refuse up front what the kernel would refuse midway.
    for r in batch {
        let k = Key::Route(r.line.dst, r.line.len);
        if !k.applied(&snap.applied) && !pending.contains_key(&k) {
            bail!("batch refused, nothing was changed: {}: no such route", r.line.name());
        }
    }
    let mut rtnl = Rtnl::open()?;
    for (i, r) in batch.iter().enumerate() {
        if let Err(e) = rtnl.del(r) {
            let undone = undo(&mut rtnl, &batch[..i], |rt, r| rt.add(r));
            bail!("batch refused by the kernel, {undone}: {}: {e}", r.line.name());
        }
    }
    for r in batch {
        pending.remove(&Key::Route(r.line.dst, r.line.len));
    }
    log::info!("route batch: deleted {} routes", batch.len());
    Ok(json!({"op": "del", "routes": batch.len(), "new_entries": {"fib4": 0, "fib6": 0, "nexthops": 0}}))
}

/// Reverts `done` (newest first); says what it did for the error message.
fn undo(rtnl: &mut Rtnl, done: &[Resolved], revert: impl Fn(&mut Rtnl, &Resolved) -> std::io::Result<()>) -> String {
    let mut failed = Vec::new();
    for r in done.iter().rev() {
        if let Err(e) = revert(rtnl, r) {
            log::error!("route batch: could not revert {}: {e}", r.line.name());
            failed.push(r.line.no.to_string());
        }
    }
    if failed.is_empty() {
        format!("the {} routes before it were reverted", done.len())
    } else {
        format!("reverting the {} routes before it FAILED for lines {}", done.len(), failed.join(", "))
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct RouteArgs {
    #[command(subcommand)]
    pub op: RouteOp,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum RouteOp {
    /// Add every route of FILE to the kernel, or none: refused (ENOSPC)
    /// when any would not fit fastpath's tables.
    Add(BatchArgs),
    /// Delete every route of FILE from the kernel, or none.
    Del(BatchArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct BatchArgs {
    /// One route per line: `PREFIX via ADDR [dev IF]`, `PREFIX dev IF`,
    /// `blackhole PREFIX`; `#` starts a comment.
    #[arg(long, value_name = "FILE")]
    pub batch: PathBuf,
    #[command(flatten)]
    pub client: crate::ClientArgs,
}

pub fn client(args: &RouteArgs) -> Result<()> {
    let (op, a) = match &args.op {
        RouteOp::Add(a) => ("add", a),
        RouteOp::Del(a) => ("del", a),
    };
    let text = std::fs::read_to_string(&a.batch).with_context(|| format!("reading {}", a.batch.display()))?;
    // Syntax errors need no daemon.
    let n = parse::parse(&text).map_err(|e| anyhow!("{}: {e}", a.batch.display()))?.len();
    let data = crate::api::request_with(&a.client.socket, json!({"cmd": "route_batch", "op": op, "text": text}))?;
    if a.client.json {
        println!("{}", serde_json::to_string_pretty(&data)?);
    } else {
        println!("{} {n} routes", if op == "add" { "added" } else { "deleted" });
    }
    Ok(())
}
