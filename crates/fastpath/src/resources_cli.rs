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

use anyhow::{Context, Result};
use fastpath_core::resources::{view, ResourceLine, View};

use crate::api::Snapshot;
use crate::ClientArgs;

pub fn resources(snap: &Snapshot) -> Result<View> {
    let target = crate::route_batch::bpf_target(snap)?;
    let mut v = view(&target, "predictive", &[]);
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
}
