//! `fastpath resources [--json]`: every table's size, used and reserved
//! entries, devlink-resource style (API command `{"cmd":"resources"}`).
//!
//! ```text
//! {"target":"bpf", "model":"predictive",
//!  "resources":[{"name":"fib4"|"fib6"|"nexthops"|"groups"|"buckets"|"neighbours"|"interfaces"|"flow_cache_per_cpu",
//!                "size":n, "used":n|null (null: not accounted, an LRU), "reserved":n,
//!                "unit":"entries"|"units", "costs":{"<kind>":n} (units per entry kind; shared pools only)}]}
//! ```
//! `reserved`: admitted by a route batch, not yet in the maps.

use std::time::Duration;

use anyhow::{Context, Result};
use fastpath_core::resources::simulate::{self, SimResult};
use fastpath_core::resources::{view, AsicConfig, ModelKind, ResourceLine, View};

use crate::api::Snapshot;
use crate::ClientArgs;

#[derive(Debug, Clone, clap::Args)]
pub struct ResourcesArgs {
    #[command(subcommand)]
    pub sim: Option<Sub>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum Sub {
    /// Add N IPv4 routes to a simulated offload ASIC under each reservation
    /// model (paper 000's experiment, control plane only; no daemon needed).
    Simulate(SimArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    #[arg(long, default_value_t = 10_000)]
    pub routes: usize,
    /// Models to compare: lockstep, prefetch:N, credit[:MAX], predictive, predictive-flat.
    #[arg(long = "model", value_name = "MODEL")]
    pub models: Vec<ModelKind>,
    /// LPM memory of the ASIC, in units (an IPv4 prefix costs 1).
    #[arg(long, default_value_t = 64 * 1024)]
    pub lpm_units: u64,
    /// Device latency of one route write, in µs.
    #[arg(long, default_value_t = 55)]
    pub write_us: u64,
    /// Device latency of one resource query or reservation, in µs.
    #[arg(long, default_value_t = 350)]
    pub query_us: u64,
    #[arg(long)]
    pub json: bool,
}

/// The maps, and with `--resource-target sim-asic` the device in front of them.
#[derive(Debug, serde::Serialize)]
pub struct Resources {
    #[serde(flatten)]
    pub maps: View,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<View>,
}

pub fn resources(snap: &Snapshot) -> Result<Resources> {
    let device = snap.device.as_ref().map(|d| view(d.target.as_ref(), d.model.name(), &d.model.held()));
    Ok(Resources { maps: maps_view(snap)?, device })
}

fn maps_view(snap: &Snapshot) -> Result<View> {
    let target = crate::route_batch::bpf_target(snap)?;
    // The maps' occupancy; with another model or target the daemon's admissions are in `status`.
    let model = match &snap.admission {
        Some(a) if a.target == "bpf" => a.model.as_str(),
        // Behind a device, the maps only hold what it wrote: nothing decides for them.
        Some(_) => "none (written after the device)",
        None => "predictive",
    };
    let mut v = view(&target, model, &[]);
    // An LRU per CPU: it evicts instead of refusing, so it is not accounted.
    v.resources.push(ResourceLine {
        name: "flow_cache_per_cpu".into(),
        size: u64::from(snap.flow_entries),
        used: None,
        reserved: 0,
        unit: "entries",
        costs: Default::default(),
    });
    Ok(v)
}

#[derive(Debug, Clone, serde::Deserialize)]
struct LineJson {
    name: String,
    size: u64,
    used: Option<u64>,
    reserved: u64,
    unit: String,
    #[serde(default)]
    costs: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Clone, serde::Deserialize)]
struct ViewJson {
    target: String,
    model: String,
    resources: Vec<LineJson>,
    /// --resource-target sim-asic: the simulated device's pools.
    #[serde(default)]
    device: Option<Box<ViewJson>>,
}

fn render(v: &ViewJson) -> String {
    let mut out = format!("target {}, reservation model {}\n", v.target, v.model);
    out += &format!("{:<20} {:>10} {:>10} {:>10} {:>10}  unit\n", "resource", "size", "used", "reserved", "free");
    for r in &v.resources {
        let (used, free) = match r.used {
            Some(u) => (u.to_string(), r.size.saturating_sub(u + r.reserved).to_string()),
            None => ("-".into(), "-".into()),
        };
        out += &format!("{:<20} {:>10} {:>10} {:>10} {:>10}  {}\n", r.name, r.size, used, r.reserved, free, r.unit);
        if !r.costs.is_empty() {
            let c: Vec<String> = r.costs.iter().map(|(k, n)| format!("{k}={n}")).collect();
            out += &format!("{:<20} costs per entry: {}\n", "", c.join(" "));
        }
    }
    if let Some(d) = &v.device {
        out += "\n";
        out += &render(d);
    }
    out
}

pub fn main(args: &ResourcesArgs) -> Result<()> {
    match &args.sim {
        Some(Sub::Simulate(s)) => simulate(s),
        None => client(&args.client),
    }
}

fn simulate(a: &SimArgs) -> Result<()> {
    let cfg = AsicConfig {
        lpm_units: a.lpm_units,
        write_latency: Duration::from_micros(a.write_us),
        query_latency: Duration::from_micros(a.query_us),
        ..AsicConfig::default()
    };
    let models = if a.models.is_empty() { ModelKind::all_default().to_vec() } else { a.models.clone() };
    let routes = simulate::ipv4_routes(a.routes);
    let results: Vec<SimResult> = models.iter().map(|m| simulate::run(m, &cfg, &routes)).collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
        return Ok(());
    }
    print!("{}", render_sim(&results, &cfg));
    Ok(())
}

fn render_sim(results: &[SimResult], cfg: &AsicConfig) -> String {
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1e3);
    let mut out = format!(
        "simulated ASIC: write {} µs, query {} µs, LPM {} units; times in ms (sleeps are real: noisy)\n",
        cfg.write_latency.as_micros(),
        cfg.query_latency.as_micros(),
        cfg.lpm_units
    );
    out += &format!(
        "{:<16} {:>8} {:>8} {:>12} {:>12} {:>8} {:>8}\n",
        "model", "admitted", "refused", "answered_ms", "written_ms", "inline", "stalls"
    );
    for r in results {
        out += &format!(
            "{:<16} {:>8} {:>8} {:>12} {:>12} {:>8} {:>8}\n",
            r.model,
            r.admitted,
            r.refused,
            ms(r.answered),
            ms(r.written),
            r.stats.inline_accesses,
            r.stats.stalls
        );
    }
    out
}

pub fn client(args: &ClientArgs) -> Result<()> {
    let data = crate::api::request(&args.socket, "resources")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&data)?);
        return Ok(());
    }
    let v: ViewJson = serde_json::from_value(data).context("daemon sent unexpected resources")?;
    print!("{}", render(&v));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shows_free_and_costs() {
        let v: ViewJson = serde_json::from_str(
            r#"{"target":"sim-asic","model":"credit","resources":[
                {"name":"lpm","size":100,"used":40,"reserved":10,"unit":"units","costs":{"ipv4":1,"ipv6_64":2}},
                {"name":"flow_cache_per_cpu","size":1024,"used":null,"reserved":0,"unit":"entries","costs":{}}]}"#,
        )
        .unwrap();
        let t = render(&v);
        assert!(t.contains("lpm") && t.contains(" 50  units"), "{t}");
        assert!(t.contains("costs per entry: ipv4=1 ipv6_64=2"), "{t}");
        assert!(t.lines().any(|l| l.starts_with("flow_cache_per_cpu") && l.contains(" - ")), "{t}");
    }

    #[test]
    fn a_device_is_shown_after_the_maps() {
        let v: ViewJson = serde_json::from_str(
            r#"{"target":"bpf","model":"none","resources":[
                {"name":"fib4","size":10,"used":3,"reserved":0,"unit":"entries","costs":{}}],
               "device":{"target":"sim-asic","model":"credit","resources":[
                {"name":"lpm","size":100,"used":3,"reserved":5,"unit":"units","costs":{"ipv4":1,"ipv6_64":2}}]}}"#,
        )
        .unwrap();
        let t = render(&v);
        let maps = t.find("target bpf").unwrap();
        let dev = t.find("target sim-asic, reservation model credit").unwrap();
        assert!(maps < dev && t.contains(" 92  units"), "{t}");
    }
}
