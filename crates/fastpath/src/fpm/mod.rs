//! FRR's FPM (Forwarding Plane Manager) as a route source: `fastpath run
//! --route-source fpm` takes routes and next hops from zebra's
//! dplane_fpm_nl instead of the kernel, and reports each route's offload
//! status back (read by FRR >= 8.5).

pub mod frame;
mod overlay;
pub mod server;
pub mod status;
mod table;

pub use server::{Published, Server, SourceStatus, DEFAULT_LISTEN};
pub use status::InFib;

use std::time::Duration;

use anyhow::{Context, Result};

use crate::{RouteSource, RunArgs};

/// The FPM server when `--route-source fpm`, None for the kernel.
pub fn start(args: &RunArgs) -> Result<Option<Server>> {
    if args.route_source != RouteSource::Fpm {
        return Ok(None);
    }
    let s = Server::start(args.fpm_listen, Duration::from_secs(args.fpm_grace.into()))
        .context("starting the FPM route source")?;
    Ok(Some(s))
}
