use std::time::Duration;

use lock_runtime::Registry;
use lock_tests::{with_timeouts, RedisServer};

/// A registry on `server` with timeouts short enough for fault tests.
pub fn registry(server: &RedisServer) -> Registry {
    with_timeouts(
        Registry::builder().url(server.url()),
        Duration::from_secs(1),
    )
}

/// A registry on `url` (a fault proxy, say) whose timeouts outlast any latency a test injects.
pub fn patient_registry(url: &str) -> Registry {
    with_timeouts(Registry::builder().url(url), Duration::from_secs(10))
}

pub use lock_tests::{assert_lost, eventually, raw, spawn_hung_body};
