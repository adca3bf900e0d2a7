//! Waiting for state that has no event to await.

use std::time::Duration;

use crate::RedisServer;

/// Polls `check` every 5 ms until it holds, failing after `limit`: for state that has no event
/// to await (a key's expiry on the server, or a background release's bookkeeping, which is
/// finished only after the server's reply has been read).
///
/// # Panics
/// When `check` does not hold within `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until `key`'s expiry on `server` moves forward: one read of `PTTL` above the read
/// before it, which only a renewal can cause (between renewals it only falls). Comparing each
/// read with the previous one, not with the first, keeps it true when the first read came
/// right after a renewal and a loaded machine's later reads come a few ms late.
///
/// # Panics
/// When no renewal lands within `limit`, or the key has no expiry.
pub async fn renewed_on(server: &RedisServer, key: &str, limit: Duration, what: &str) {
    let mut last = server.pttl(key);
    eventually(limit, what, || {
        let now = server.pttl(key);
        assert!(
            now >= 0,
            "{what}: {key} has no lease on {} ({now})",
            server.port()
        );
        let moved = now > last;
        last = now;
        async move { moved }
    })
    .await;
}
