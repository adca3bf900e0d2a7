use std::time::Duration;

use lock_runtime::Registry;
use lock_tests::RedisServer;

/// A registry on `server` with timeouts short enough for fault tests.
pub fn registry(server: &RedisServer) -> Registry {
    Registry::builder()
        .url(server.url())
        .connect_timeout(Duration::from_secs(1))
        .command_timeout(Duration::from_secs(1))
        .build()
        .expect("registry")
}

/// A registry on `url` (a fault proxy, say) whose timeouts outlast any latency a test injects.
pub fn patient_registry(url: &str) -> Registry {
    Registry::builder()
        .url(url)
        .connect_timeout(Duration::from_secs(10))
        .command_timeout(Duration::from_secs(10))
        .build()
        .expect("registry")
}

/// A raw async connection for interfering behind the library's back.
pub async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    lock_tests::raw(&server.url()).await
}

pub use lock_tests::{assert_lost, eventually, spawn_hung_body};
