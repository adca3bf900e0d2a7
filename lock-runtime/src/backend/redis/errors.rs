//! Telling a silent server from one that answered with a refusal.

use std::time::Duration;

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
