//! Registries whose timeouts suit tests that break the server.

use std::time::Duration;

/// A registry on `url` with timeouts short enough for fault tests (500 ms to connect and per
/// command), so a dead or silent server fails an operation quickly.
///
/// # Panics
/// When `url` is not a Redis URL.
#[must_use]
pub fn fast_registry(url: &str) -> lock_runtime::Registry {
    lock_runtime::Registry::builder()
        .url(url)
        .connect_timeout(Duration::from_millis(500))
        .command_timeout(Duration::from_millis(500))
        .build()
        .expect("registry")
}
