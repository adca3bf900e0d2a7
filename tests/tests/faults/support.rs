//! Helpers shared by the fault tests.

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock µs, comparable with the workers' stamps and `MONITOR`'s.
pub fn now_us() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    i64::try_from(d.as_micros()).expect("fits")
}

/// Whether `pid` is stopped (SIGSTOP), from `/proc/<pid>/stat`.
pub fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1;
            after.split_whitespace().next().map(|state| state == "T")
        })
        .unwrap_or(false)
}

pub use lock_tests::fast_registry as registry;

pub use lock_tests::{assert_lost, eventually, raw, signal, spawn_hung_body};
