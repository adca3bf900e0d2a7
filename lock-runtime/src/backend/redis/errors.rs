//! Redis errors: telling a silent server from one that refused, and what callers are told.

use std::sync::Arc;
use std::time::Duration;

use crate::LockError;

/// Whether `e` means the server gave no answer at all (a timeout, a broken or dropped
/// connection), as opposed to an answer that refused.
pub(crate) fn unanswered(e: &redis::RedisError) -> bool {
    e.is_timeout() || e.is_io_error() || e.is_connection_dropped()
}

/// The error of a call that got no answer within `budget`.
pub(crate) fn timed_out(budget: Duration) -> redis::RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer within {budget:?}"),
    )
    .into()
}

/// The error `command` on `node` ended with, for the caller.
pub(crate) fn lock_error(
    node: &str,
    command: &'static str,
    key: Option<&str>,
    e: redis::RedisError,
) -> LockError {
    LockError::Backend {
        node: node.to_owned(),
        command,
        key: key.map(str::to_owned),
        message: e.to_string(),
        source: Some(Arc::new(e)),
    }
}

/// A failure already told as a [`LockError`], back as the client's error (for a renewal round,
/// a batch).
pub(crate) fn redis_error(e: &LockError) -> redis::RedisError {
    match e {
        LockError::Backend {
            source: Some(source),
            ..
        } => (**source).clone(),
        other => (redis::ErrorKind::Client, "lock-runtime", other.to_string()).into(),
    }
}
