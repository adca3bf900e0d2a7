//! What the library measures, through the [`metrics`](https://docs.rs/metrics) facade (the
//! `metrics` feature), so any exporter shows it. Without the feature every call here is empty.
//!
//! The metrics, their labels and what each counts are listed once, for users, in
//! [`guide::metrics`](crate::guide::metrics). Labels never carry the rendered key: its values
//! are unbounded, and so would be the exporter's memory.

use std::sync::atomic::AtomicUsize;
#[cfg(feature = "metrics")]
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::error::LostReason;
#[cfg(feature = "metrics")]
use crate::report;

/// Histogram buckets, in seconds, for the library's `*_seconds` metrics: from a millisecond (an
/// uncontended lock near its store) to ten minutes (a long job's hold). Give them to the
/// exporter, so that quantiles can be summed over replicas (the dashboard in `dashboards/`
/// reads `_bucket` series), as with `metrics-exporter-prometheus`:
///
/// ```ignore
/// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
/// let prefix = Matcher::Prefix("distributed_lock_".into());
/// PrometheusBuilder::new()
///     .set_buckets_for_metric(prefix, lock_runtime::SECONDS_BUCKETS)?
///     .install_recorder()?;
/// ```
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 600.0,
];

/// The `lock` label of a request without a template.
#[cfg(feature = "metrics")]
const UNTEMPLATED: &str = "untemplated";

/// Two labels: the registry, and what in it a measurement is about.
#[cfg(feature = "metrics")]
type Pairs = [(&'static str, ::metrics::SharedString); 2];

/// Records through `record` with `pairs`, off the I/O thread (see [`report`]).
#[cfg(feature = "metrics")]
fn record_with(pairs: &Pairs, record: impl FnOnce(&Pairs) + Send + 'static) {
    let pairs = pairs.clone();
    report::tell(move || record(&pairs));
}

/// Whom a measurement is about: a registry and a template. Empty without the feature.
#[derive(Clone, Debug)]
pub(crate) struct Labels {
    #[cfg(feature = "metrics")]
    pairs: Pairs,
}

/// How a lock request ended, when it did not get the lock.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Refused {
    Busy,
    Error,
    /// Its caller stopped waiting (a timeout, a `select!`, a dropped request).
    Cancelled,
}

/// How one lease's renewal went.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RenewalOutcome {
    Renewed,
    Refused,
    Failed,
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
impl Labels {
    pub(crate) fn new(registry: &Arc<str>, template: Option<&'static str>) -> Self {
        #[cfg(feature = "metrics")]
        {
            describe();
            let lock = template.unwrap_or(UNTEMPLATED);
            Self {
                pairs: [
                    ("registry", registry.clone().into()),
                    ("lock", ::metrics::SharedString::const_str(lock)),
                ],
            }
        }
        #[cfg(not(feature = "metrics"))]
        Self {}
    }

    /// A request got its lock after `waited`.
    pub(crate) fn acquired(&self, waited: Duration) {
        #[cfg(feature = "metrics")]
        self.outcome("acquired", waited);
    }

    /// A release handed the lock to this request.
    pub(crate) fn handed_over(&self) {
        #[cfg(feature = "metrics")]
        self.record(|pairs| {
            ::metrics::counter!("distributed_lock_handoffs_total", pairs).increment(1);
        });
    }

    /// A lease began.
    pub(crate) fn holding(&self) {
        #[cfg(feature = "metrics")]
        self.record(|pairs| {
            ::metrics::gauge!("distributed_lock_held", pairs).increment(1.0);
        });
    }

    /// A request ended without the lock after `waited`.
    pub(crate) fn refused(&self, refused: Refused, waited: Duration) {
        #[cfg(feature = "metrics")]
        self.outcome(
            match refused {
                Refused::Busy => "busy",
                Refused::Error => "error",
                Refused::Cancelled => "cancelled",
            },
            waited,
        );
    }

    #[cfg(feature = "metrics")]
    fn outcome(&self, outcome: &'static str, waited: Duration) {
        self.record(move |[registry, lock]| {
            let labels = [registry.clone(), lock.clone(), ("outcome", outcome.into())];
            ::metrics::counter!("distributed_lock_acquisitions_total", &labels).increment(1);
            ::metrics::histogram!("distributed_lock_wait_seconds", &labels).record(waited);
        });
    }

    #[cfg(feature = "metrics")]
    fn record(&self, record: impl FnOnce(&Pairs) + Send + 'static) {
        record_with(&self.pairs, record);
    }

    /// A lease is no longer held (released, or let go of after its loss), after `held`.
    pub(crate) fn ended(&self, held: Duration) {
        #[cfg(feature = "metrics")]
        self.record(move |pairs| {
            ::metrics::gauge!("distributed_lock_held", pairs).decrement(1.0);
            ::metrics::histogram!("distributed_lock_hold_seconds", pairs).record(held);
        });
    }

    /// One renewal of a lease.
    pub(crate) fn renewal(&self, renewal: RenewalOutcome) {
        #[cfg(feature = "metrics")]
        {
            let outcome = match renewal {
                RenewalOutcome::Renewed => "renewed",
                RenewalOutcome::Refused => "refused",
                RenewalOutcome::Failed => "failed",
            };
            self.record(move |[registry, lock]| {
                let labels = [registry.clone(), lock.clone(), ("outcome", outcome.into())];
                ::metrics::counter!("distributed_lock_renewals_total", &labels).increment(1);
            });
        }
    }

    /// A lease went into jeopardy (a renewal failed or went unanswered while it still held).
    pub(crate) fn at_risk(&self) {
        #[cfg(feature = "metrics")]
        self.record(move |pairs| {
            ::metrics::counter!("distributed_lock_at_risk_total", pairs).increment(1);
        });
    }

    /// A lease was lost.
    pub(crate) fn lost(&self, reason: LostReason) {
        #[cfg(feature = "metrics")]
        self.record(move |[registry, lock]| {
            let labels = [
                registry.clone(),
                lock.clone(),
                ("reason", reason.label().into()),
            ];
            ::metrics::counter!("distributed_lock_lost_total", &labels).increment(1);
        });
    }
}

/// Whom an election's measurements are about: a registry and the election's key. An
/// election's key is a label, unlike a lock's: elections are few and named by the application.
#[derive(Clone, Debug)]
pub(crate) struct ElectionLabels {
    #[cfg(feature = "metrics")]
    pairs: Pairs,
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
impl ElectionLabels {
    pub(crate) fn new(registry: &Arc<str>, election: &str) -> Self {
        #[cfg(feature = "metrics")]
        {
            describe();
            Self {
                pairs: [
                    ("registry", registry.clone().into()),
                    ("election", election.to_owned().into()),
                ],
            }
        }
        #[cfg(not(feature = "metrics"))]
        Self {}
    }

    #[cfg(feature = "metrics")]
    fn record(&self, record: impl FnOnce(&Pairs) + Send + 'static) {
        record_with(&self.pairs, record);
    }

    /// A candidate of this registry was elected; `leading` terms are led here now.
    pub(crate) fn won(&self, leading: &Arc<AtomicUsize>) {
        #[cfg(feature = "metrics")]
        self.record(|pairs| {
            ::metrics::counter!("distributed_lock_terms_won_total", pairs).increment(1);
        });
        self.leading(leading);
    }

    /// A term won here ended: resigned (`Released`) or lost.
    pub(crate) fn ended(&self, reason: LostReason, leading: &Arc<AtomicUsize>) {
        #[cfg(feature = "metrics")]
        self.record(move |[registry, election]| {
            let reason = match reason {
                LostReason::Released => "resigned",
                lost => lost.label(),
            };
            let labels = [
                registry.clone(),
                election.clone(),
                ("reason", reason.into()),
            ];
            ::metrics::counter!("distributed_lock_terms_ended_total", &labels).increment(1);
        });
        self.leading(leading);
    }

    /// Sets the leader gauge to the count when the report runs, not when it was told: reports
    /// that arrive late or out of order (one from the I/O thread, the next from the caller's)
    /// never leave it off.
    fn leading(&self, leading: &Arc<AtomicUsize>) {
        #[cfg(feature = "metrics")]
        {
            let leading = leading.clone();
            self.record(move |pairs| {
                #[allow(clippy::cast_precision_loss)]
                let now = leading.load(Ordering::SeqCst) as f64;
                ::metrics::gauge!("distributed_lock_leader", pairs).set(now);
            });
        }
    }

    /// An observer saw the election without a leader for `leaderless`, until one was elected.
    pub(crate) fn leaderless(&self, leaderless: Duration) {
        #[cfg(feature = "metrics")]
        self.record(move |pairs| {
            ::metrics::histogram!("distributed_lock_leaderless_seconds", pairs).record(leaderless);
        });
    }
}

/// Describes the metrics to the recorder installed at the first lock request (exporters show
/// the descriptions as help text).
#[cfg(feature = "metrics")]
fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        describe_counter!(
            "distributed_lock_acquisitions_total",
            "Lock requests by outcome: acquired, busy (still taken when the wait ended), error, \
             cancelled (the caller stopped waiting)"
        );
        describe_histogram!(
            "distributed_lock_wait_seconds",
            Unit::Seconds,
            "From a lock request to its outcome"
        );
        describe_counter!(
            "distributed_lock_handoffs_total",
            "Acquisitions completed by a release handing the lock to its queued waiter"
        );
        describe_histogram!(
            "distributed_lock_hold_seconds",
            Unit::Seconds,
            "From acquisition to the end of the lease (released or lost)"
        );
        describe_gauge!("distributed_lock_held", "Leases held now");
        describe_counter!(
            "distributed_lock_renewals_total",
            "Lease renewals by outcome: renewed, refused (not the holder any more), failed (no answer; retried)"
        );
        describe_counter!(
            "distributed_lock_at_risk_total",
            "Leases put at risk while they still held: a renewal failed or went unanswered for a \
             third of the ttl (each lease counts once until a renewal is confirmed)"
        );
        describe_counter!("distributed_lock_lost_total", "Leases lost, by reason");
        describe_gauge!(
            "distributed_lock_leader",
            "1 while a candidate of this registry leads the election, else 0 (the terms led here)"
        );
        describe_counter!(
            "distributed_lock_terms_won_total",
            "Terms won by a candidate of this registry"
        );
        describe_counter!(
            "distributed_lock_terms_ended_total",
            "Terms of this registry's candidates that ended, by reason: resigned (also when the \
             term's work returned), or how the term was lost (expired, stolen, gone, shutdown)"
        );
        describe_histogram!(
            "distributed_lock_leaderless_seconds",
            Unit::Seconds,
            "How long an observer saw the election without a leader, until the next was elected"
        );
    });
}
