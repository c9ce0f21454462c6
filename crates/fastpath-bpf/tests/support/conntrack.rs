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
