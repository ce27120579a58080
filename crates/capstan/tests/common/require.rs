//! What a test needs that a machine may lack: root, a program, an etcd. A project rule: a test
//! that cannot run here fails in CI (`CI=true`, which `.ci/run` sets; CI runs as root) and
//! skips visibly elsewhere, never passing in silence.
//!
//! `common` declares it for capstan's tests; other crates' tests and benches include this file
//! with `#[path]`.

#![allow(dead_code)]

use std::io::Write as _;
use std::process::{Command, Stdio};

/// Whether this runs in CI: `CI` set and not "", "0" or "false".
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| {
        let v = v.trim();
        !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false"))
    })
}

/// The running test's name: libtest names each test's thread after it.
fn test_name() -> String {
    std::thread::current().name().unwrap_or("?").to_string()
}

/// Writes `SKIPPED: <test name>: needs <what>` to stderr, in CI too: for a part of a test
/// left out for want of something CI may lack as well. Written to stderr directly, which
/// libtest does not capture (it captures `eprintln!`, shown only when a test fails).
pub fn skipped(what: &str) {
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED: {}: needs {what}",
        test_name()
    );
}

/// Whether a prerequisite `what` is there. Missing: panics under CI (`CI` set and not "", "0"
/// or "false"), else says so with [`skipped`] and returns `false` (the test then returns).
#[track_caller]
pub fn require(what: &str, available: bool) -> bool {
    if available {
        return true;
    }
    if in_ci() {
        panic!(
            "{}: needs {what}, which is missing; under CI a test that cannot run fails",
            test_name()
        );
    }
    skipped(what);
    false
}

/// Whether this process runs as root: the effective uid on the `Uid:` line of
/// `/proc/self/status` (real, effective, saved, file system) is 0.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .filter_map(|line| line.strip_prefix("Uid:"))
            .any(|ids| ids.split_whitespace().nth(1) == Some("0"))
    })
}

/// Whether `program arg` runs and exits 0 (`etcd --version`, `ip -V`).
pub fn have(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
