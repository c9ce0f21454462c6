//! Short TCP connections through the router: clients in the generator
//! namespace connect to a server in the sink namespace, send one request,
//! read the response until the server closes, and start over (netperf's
//! TCP_CRR). Every connection is new to conntrack, so this measures what a
//! stateful fast path costs or saves on set-up and teardown, which it must
//! leave to the kernel. Clients and server share the bench's one CPU, as
//! generator, router and sink do in the packet-rate part.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use super::topo::{self, Topology};
use super::traffic::Placement;

const PORT: u16 = 8080;
const REQUEST: &[u8] = b"GET /fpbench HTTP/1.0\r\n\r\n";
const RESPONSE_LEN: usize = 64;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// One repetition: connections completed (request answered in full) and failed.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CrrRep {
    pub conns_per_s: f64,
    pub completed: u64,
    pub failed: u64,
}

fn server_addr() -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(topo::IP_S0), PORT))
}

/// The server: one thread in the sink namespace answering one connection
/// after another; it closes first, so TIME_WAIT stays on its side and the
/// clients' ports are free again at once.
pub struct Server {
    stop: std::sync::Arc<AtomicBool>,
    sink_ns: String,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Server {
    pub fn start(t: &Topology, place: Placement) -> Result<Self> {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        let (ns, flag) = (t.sink.clone(), std::sync::Arc::clone(&stop));
        let thread = std::thread::spawn(move || -> Result<()> {
            let listener = (|| -> Result<TcpListener> {
                topo::enter_netns(&ns)?;
                place.apply()?;
                TcpListener::bind(server_addr()).context("binding the connection-rate server")
            })();
            let listener = match listener {
                Ok(l) => {
                    let _ = ready_tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return Ok(());
                }
            };
            let response = [b'x'; RESPONSE_LEN];
            let mut buf = [0u8; 256];
            while !flag.load(Ordering::Relaxed) {
                let Ok((mut s, _)) = listener.accept() else { continue };
                let _ = s.set_read_timeout(Some(IO_TIMEOUT));
                let mut got = 0;
                while got < REQUEST.len() {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n,
                    }
                }
                if got >= REQUEST.len() {
                    let _ = s.write_all(&response);
                }
            }
            Ok(())
        });
        ready_rx
            .recv()
            .context("connection-rate server thread died")??;
        Ok(Server {
            stop,
            sink_ns: t.sink.clone(),
            thread: Some(thread),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the blocking accept() with a connection of our own, from inside the sink.
        let _ = topo::in_netns(&self.sink_ns, || TcpStream::connect_timeout(&server_addr(), CONNECT_TIMEOUT));
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(Err(e)) => log::warn!("connection-rate server: {e:#}"),
                Err(_) => log::warn!("connection-rate server panicked"),
                Ok(Ok(())) => {}
            }
        }
    }
}

/// One connection: connect, request, the whole response, close.
fn one_connection() -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&server_addr(), CONNECT_TIMEOUT) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(IO_TIMEOUT));
    let _ = s.set_nodelay(true);
    if s.write_all(REQUEST).is_err() {
        return false;
    }
    let mut resp = Vec::with_capacity(RESPONSE_LEN);
    s.read_to_end(&mut resp).is_ok() && resp.len() == RESPONSE_LEN
}

/// `clients` threads in the generator namespace, each running connections
/// back to back for `duration`.
pub fn run_clients(t: &Topology, place: Placement, clients: usize, duration: Duration, stop: &AtomicBool) -> Result<CrrRep> {
    let (ok, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let start = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    topo::enter_netns(&t.gen)?;
                    place.apply()?;
                    while start.elapsed() < duration && !stop.load(Ordering::Relaxed) {
                        if one_connection() {
                            ok.fetch_add(1, Ordering::Relaxed);
                        } else {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        }
        Ok(())
    })?;
    let secs = start.elapsed().as_secs_f64();
    let completed = ok.load(Ordering::Relaxed);
    Ok(CrrRep {
        conns_per_s: completed as f64 / secs,
        completed,
        failed: failed.load(Ordering::Relaxed),
    })
}
