//! What the root tests of fastpath-core share: the root check (a skip is a
//! failure in CI), a private network namespace per test, shell commands.

use std::process::Command;

pub fn have_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("this test needs root (CI=true forbids skipping it)");
    }
    eprintln!("skipping: needs root");
    false
}

/// Runs `f` on a fresh thread moved into a new, empty network namespace;
/// the namespace (and every device in it) disappears with the thread.
pub fn in_new_netns<F: FnOnce() + Send + 'static>(f: F) {
    std::thread::spawn(move || {
        // SAFETY: unshare only affects the calling thread here.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
        sh("ip link set lo up");
        f();
    })
    .join()
    .expect("test thread panicked");
}

/// Runs `cmd` with sh; panics unless it succeeds; returns its stdout.
pub fn out(cmd: &str) -> String {
    let o = Command::new("sh").arg("-c").arg(cmd).output().expect("spawn sh");
    assert!(o.status.success(), "`{cmd}` failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn sh(cmd: &str) {
    out(cmd);
}
