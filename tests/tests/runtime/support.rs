use std::time::Duration;

use lock_runtime::{LockError, LockGuard, MemoryStore, Registry};
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

/// Runs `check` against two registries on one real Redis, then on one shared memory store: the
/// stores must agree.
pub async fn on_redis_and_memory<F, Fut>(check: F)
where
    F: Fn(Registry, Registry) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let server = RedisServer::start();
    check(registry(&server), registry(&server)).await;
    let store = MemoryStore::new();
    let memory = || Registry::builder().memory(store.clone()).build().unwrap();
    check(memory(), memory()).await;
}

pub use lock_tests::{assert_lost, eventually, raw, spawn_hung_body};

/// A task that waits up to a minute for `key` through `registry`.
pub fn spawn_waiter(
    registry: Registry,
    key: &'static str,
) -> tokio::task::JoinHandle<Result<LockGuard, LockError>> {
    tokio::spawn(async move {
        registry
            .lock(key)
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    })
}
