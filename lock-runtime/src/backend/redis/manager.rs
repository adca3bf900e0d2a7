//! How every connection to one server is set up: the lock scripts loaded, bounded connects and
//! commands, and a few quick reconnection attempts (the callers retry beyond them).

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::scripts;
use crate::timeouts::Timeouts;

/// The settings of every connection manager to one server.
pub(crate) fn manager_config(timeouts: Timeouts) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeouts.connect))
        .set_response_timeout(Some(timeouts.command))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_secs(1))
}

/// A connection manager to one server with the lock scripts loaded.
pub(crate) async fn manager(
    client: redis::Client,
    timeouts: Timeouts,
) -> redis::RedisResult<ConnectionManager> {
    let mut con = ConnectionManager::new_with_config(client, manager_config(timeouts)).await?;
    // Loaded up front so no first use pays a NOSCRIPT round trip; after a SCRIPT FLUSH (or on a
    // cluster node) the invocation reloads on its own.
    scripts::load_all(&mut con).await?;
    Ok(con)
}
