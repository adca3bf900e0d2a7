//! What a lock shows in traces: the `tracing` spans of a request, a hold and a release, and the
//! fields each records. Listed once, for users, in [`guide::tracing`](crate::guide::tracing).
//!
//! Every span is made only when a subscriber wants it: otherwise a span costs one check of its
//! callsite's interest, and no field is computed, so the key is never rendered for nobody.

use std::time::Duration;

use tracing::field::Empty;
use tracing::Span;

use crate::error::{LockError, LostReason};
use crate::options::{LockOptions, Share};

/// The `lock.acquire` span of one request, a child of the caller's span: from the request to
/// its outcome.
pub(crate) fn acquire(registry: &str, keys: &[String], options: &LockOptions) -> Span {
    let (mode, permits) = mode(options.share());
    tracing::info_span!(
        "lock.acquire",
        lock.key = %shown_keys(keys),
        lock.template = options.template,
        lock.registry = registry,
        lock.mode = mode,
        lock.permits = permits,
        lock.ttl_ms = ms(options.ttl),
        lock.wait_ms = ms(options.wait),
        lock.outcome = Empty,
        lock.attempts = Empty,
        lock.fence = Empty,
        lock.handed_over = Empty,
        "error.type" = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
    )
}

/// Records how a request ended: `acquired`, `busy` (it would not wait), `timed_out` (it waited
/// its `wait` out), `error`, or `cancelled` (its caller stopped waiting).
pub(crate) fn ended(span: &Span, outcome: Result<(), &LockError>, waits: bool) {
    let outcome = match outcome {
        Ok(()) => "acquired",
        Err(LockError::Busy { .. }) if waits => "timed_out",
        Err(LockError::Busy { .. }) => "busy",
        Err(error) => {
            failed(span, error);
            "error"
        }
    };
    span.record("lock.outcome", outcome);
}

/// Records a request whose caller stopped waiting for it.
pub(crate) fn cancelled(span: &Span) {
    span.record("lock.outcome", "cancelled");
}

/// Records an error as OpenTelemetry reads one: the status, and the error's kind.
fn failed(span: &Span, error: &LockError) {
    if span.is_disabled() {
        return;
    }
    span.record("error.type", error.kind());
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", tracing::field::display(error));
}

/// The `lock.hold` span of a lease, a sibling of its `lock.acquire` (a child of `parent`, the
/// caller's span): from the acquisition until the lease is over. A guarded body runs inside it,
/// and the keeper's events about the lease (at risk, safe again, lost) belong to it.
pub(crate) fn hold(parent: &Span, key: &str, template: Option<&str>, fence: Option<u64>) -> Span {
    tracing::info_span!(
        parent: parent,
        "lock.hold",
        lock.key = %crate::error::shown(key),
        lock.template = template,
        lock.fence = fence,
        lock.renewals = Empty,
        lock.end = Empty,
        otel.status_code = Empty,
    )
}

/// Records how a lease ended, and how many renewals kept it: `released`, or why it was lost
/// (an error status: the holder did not give it back).
pub(crate) fn over(span: &Span, ended: Option<LostReason>, renewals: u64) {
    if span.is_disabled() {
        return;
    }
    span.record("lock.renewals", renewals);
    match ended {
        Some(LostReason::Released) => {
            span.record("lock.end", "released");
        }
        Some(reason) => {
            span.record("lock.end", reason.label());
            span.record("otel.status_code", "ERROR");
        }
        // Still held: a lease dropped with its registry.
        None => {
            span.record("lock.end", "dropped");
        }
    }
}

/// The `lock.release` span, inside the lease's `lock.hold`.
pub(crate) fn release(hold: &Span, keep: Option<Duration>) -> Span {
    tracing::info_span!(
        parent: hold,
        "lock.release",
        lock.min_hold_left_ms = keep.map(ms),
        lock.outcome = Empty,
        "error.type" = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
    )
}

/// Records how a release went: `released`, `kept` (until `min_hold` is over), `not_owner` (the
/// lock was no longer ours), or `error` (retried in the background).
pub(crate) fn released(span: &Span, outcome: Result<(), &LockError>, kept: bool) {
    let outcome = match outcome {
        Ok(()) if kept => "kept",
        Ok(()) => "released",
        Err(LockError::NotOwner { .. }) => "not_owner",
        Err(error) => {
            failed(span, error);
            "error"
        }
    };
    span.record("lock.outcome", outcome);
}

/// The keys as a multi-key lock names itself (`LockKey::many`): sorted, each once.
fn shown_keys(keys: &[String]) -> String {
    let mut keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    keys.sort_unstable();
    keys.dedup();
    crate::error::shown(&keys.join(" + "))
}

fn mode(share: Share) -> (&'static str, Option<u32>) {
    match share {
        Share::Exclusive => ("exclusive", None),
        Share::Read => ("read", None),
        Share::Permits(n) => ("permits", Some(n)),
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
