//! Waiting for state that has no event to await.

use std::time::Duration;

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
