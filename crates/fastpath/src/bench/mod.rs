//! `fastpath bench`: placeholder until the benchmark lands.

#[derive(Debug, clap::Args)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("fastpath bench is not implemented yet")
}
