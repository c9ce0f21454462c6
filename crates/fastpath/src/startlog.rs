//! The log of a starting daemon, held until the start has succeeded.
//!
//! A refused start must say why in one line and nothing else (scripts,
//! systemd's journal and a person at a terminal all read the last line;
//! README, "Quick start"). But a start gets far before some refusals:
//! the programs are loaded, the kernel's state dumped, and only then does
//! the attach find that a port has no native XDP. So what the daemon logs
//! until it is running goes to a buffer: written out in order once the
//! start succeeded, dropped when it failed. With RUST_LOG at debug or
//! trace nothing is held: whoever asks for that wants it as it happens.

use std::io::{self, Write};
use std::sync::{Mutex, MutexGuard};

/// `Some`: records are being held.
static HELD: Mutex<Option<Vec<u8>>> = Mutex::new(None);

fn held() -> MutexGuard<'static, Option<Vec<u8>>> {
    // A panic while holding the lock leaves a plain byte buffer behind: still usable.
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// The log's output: stderr, or the buffer while a start is held.
pub struct Gate;

impl Write for Gate {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match held().as_mut() {
            Some(v) => {
                v.extend_from_slice(buf);
                Ok(buf.len())
            }
            None => io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

/// Starts holding, unless the log level asks for live debugging output.
pub fn hold() {
    if log::max_level() < log::LevelFilter::Debug {
        *held() = Some(Vec::new());
    }
}

/// The start succeeded: what was held is written out, and from now on
/// every record goes straight to stderr.
pub fn release() {
    if let Some(v) = held().take() {
        // Nothing to do about a stderr that cannot be written.
        let _ = io::stderr().write_all(&v);
    }
}

/// The start failed: what was held is dropped, so that the error line
/// main() prints is all there is.
pub fn discard() {
    held().take();
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the buffer is process-wide.
    #[test]
    fn held_records_are_kept_in_order_then_released_or_dropped() {
        *held() = Some(Vec::new());
        Gate.write_all(b"one\n").expect("held write");
        Gate.write_all(b"two\n").expect("held write");
        assert_eq!(held().as_deref(), Some(&b"one\ntwo\n"[..]));
        discard();
        assert!(held().is_none());
        *held() = Some(b"three\n".to_vec());
        release();
        assert!(held().is_none(), "release ends the hold");
    }
}
