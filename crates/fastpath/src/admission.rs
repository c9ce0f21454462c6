//! `fastpath run --reservation-model MODEL --resource-target bpf|sim-asic`:
//! which model answers for each route before it reaches the maps, against
//! which tables (see `fastpath_core::resources::admission`).
//!
//! The default, predictive on the BPF target, is what the reconciler's
//! capacity trim already is (exact occupancy against the maps' sizes, no
//! device to ask), so it runs without a model object in the route path:
//! no per-route bookkeeping on full tables.

use std::time::Duration;

use anyhow::{Context, Result};
use fastpath_core::resources::{Admission, AsicConfig, ModelKind, TargetKind};
use fastpath_core::tables::Capacities;

#[derive(Debug, Clone, clap::Args)]
pub struct AdmissionArgs {
    /// Reservation model answering for each route before it is installed:
    /// lockstep, prefetch:N, credit[:MAX], predictive, predictive-flat.
    #[arg(long, value_name = "MODEL", default_value = "predictive")]
    pub reservation_model: ModelKind,
    /// Tables the model reserves in: `bpf` (fastpath's maps) or `sim-asic`
    /// (a simulated offload ASIC; a route reaches the maps only once its
    /// simulated write has completed).
    #[arg(long, value_name = "TARGET", default_value = "bpf")]
    pub resource_target: TargetKind,
    /// sim-asic: LPM memory in units (an IPv4 prefix costs 1, IPv6 2 or 4).
    #[arg(long, value_name = "UNITS", default_value_t = 64 * 1024)]
    pub sim_lpm_units: u64,
    /// sim-asic: shared hash memory in units (host routes, neighbours).
    #[arg(long, value_name = "UNITS", default_value_t = 64 * 1024)]
    pub sim_hash_units: u64,
    /// sim-asic: device latency of one route write, in µs.
    #[arg(long, value_name = "US", default_value_t = 55)]
    pub sim_write_us: u64,
    /// sim-asic: device latency of one resource query or reservation, in µs.
    #[arg(long, value_name = "US", default_value_t = 350)]
    pub sim_query_us: u64,
}

impl AdmissionArgs {
    /// The default needs no model in the route path (see the module doc).
    fn is_default(&self) -> bool {
        self.resource_target == TargetKind::Bpf && self.reservation_model == (ModelKind::Predictive { flat: false })
    }

    pub fn asic(&self) -> AsicConfig {
        AsicConfig {
            lpm_units: self.sim_lpm_units,
            hash_units: self.sim_hash_units,
            write_latency: Duration::from_micros(self.sim_write_us),
            query_latency: Duration::from_micros(self.sim_query_us),
            ..AsicConfig::default()
        }
    }

    /// The admission layer for these options; None for the default.
    pub fn build(&self, caps: &Capacities) -> Result<Option<Admission>> {
        if self.is_default() {
            return Ok(None);
        }
        let a = Admission::new(self.resource_target, &self.reservation_model, caps, self.asic())
            .context("starting the resource target's writer thread")?;
        log::info!(
            "routes admitted by the {} reservation model on the {} target",
            a.model_name(),
            self.resource_target.name()
        );
        Ok(Some(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: AdmissionArgs,
    }

    fn parse(args: &[&str]) -> Result<AdmissionArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).map(|c| c.a)
    }

    fn caps() -> Capacities {
        Capacities { fib4: 100, fib6: 100, nexthops: 16, neigh: 16, ifaces: 4, groups: 8, buckets: 64 }
    }

    #[test]
    fn default_is_todays_trim_without_a_model() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.reservation_model, ModelKind::Predictive { flat: false });
        assert_eq!(a.resource_target, TargetKind::Bpf);
        assert!(a.build(&caps()).unwrap().is_none());
    }

    #[test]
    fn every_model_on_every_target_is_wired() {
        for target in ["bpf", "sim-asic"] {
            for (arg, name) in [
                ("lockstep", "lockstep"),
                ("prefetch:8", "prefetch"),
                ("credit:32", "credit"),
                ("predictive", "predictive"),
                ("predictive-flat", "predictive-flat"),
            ] {
                let a = parse(&["--reservation-model", arg, "--resource-target", target, "--sim-write-us", "0", "--sim-query-us", "0"]).unwrap();
                let built = a.build(&caps()).unwrap();
                if target == "bpf" && arg == "predictive" {
                    assert!(built.is_none());
                    continue;
                }
                let adm = built.expect("a model in the route path");
                assert_eq!(adm.model_name(), name);
                assert_eq!(adm.target().name(), target);
                let st = adm.status();
                assert_eq!((st.target.as_str(), st.model.as_str()), (target, name));
            }
        }
    }

    #[test]
    fn sim_asic_options_reach_the_config() {
        let a = parse(&["--resource-target", "sim-asic", "--sim-lpm-units", "5", "--sim-write-us", "7", "--sim-query-us", "9"]).unwrap();
        let c = a.asic();
        assert_eq!((c.lpm_units, c.write_latency, c.query_latency), (5, Duration::from_micros(7), Duration::from_micros(9)));
    }

    #[test]
    fn bad_values_are_one_line_errors() {
        for args in [["--reservation-model", "bogus"], ["--resource-target", "tcam"], ["--reservation-model", "prefetch:0"]] {
            let e = parse(&args).expect_err("refused").to_string();
            assert!(e.lines().next().unwrap_or_default().contains("invalid value"), "{e}");
        }
    }
}
