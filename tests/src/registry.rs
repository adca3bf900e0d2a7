//! Registries with the connect and command timeouts a test chooses.

use std::time::Duration;

use lock_runtime::{Registry, RegistryBuilder};

/// `builder` (any deployment) with `timeout` to connect and per command, built.
///
/// # Panics
/// When the builder is invalid.
#[must_use]
pub fn with_timeouts(builder: RegistryBuilder, timeout: Duration) -> Registry {
    builder
        .connect_timeout(timeout)
        .command_timeout(timeout)
        .build()
        .expect("registry")
}

/// A registry on `url` with timeouts short enough for fault tests (500 ms to connect and per
/// command), so a dead or silent server fails an operation quickly.
///
/// # Panics
/// When `url` is not a Redis URL.
#[must_use]
pub fn fast_registry(url: &str) -> Registry {
    with_timeouts(Registry::builder().url(url), Duration::from_millis(500))
}
