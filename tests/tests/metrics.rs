//! The `metrics` feature: what a lock does is counted under its registry's name and its key's
//! template, read back here as an exporter shows it (Prometheus text). And what the application
//! plugs in (its metrics recorder, its `tracing` subscriber) never stalls the library, however
//! long it blocks.
//!
//! Its own test binary: a metrics recorder is process-wide, and each test here keeps to its own
//! registry names, so the counts it reads are its own.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use lock_runtime::{distributed_lock, LockError, LostReason, Registry};
use lock_tests::{eventually, fast_registry, RedisServer, SilentServer};
use metrics::{Key, KeyName, Metadata, SharedString, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use redis::AsyncCommands;

const LIMIT: Duration = Duration::from_secs(10);

/// The process's recorder, installed before any lock is taken: Prometheus's, behind a [`Gate`].
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        // With one subscriber registered in the process (a test's `set_default`), `tracing`
        // decides whether an event's callsite is of interest by the subscriber of whichever
        // thread reaches it first (tokio-rs/tracing#3611): another test's thread, without one,
        // would turn the "lock lease lost" event off for good, and the gated subscriber would
        // never see it. A second, global one makes it ask every subscriber.
        tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default())
            .expect("the only global subscriber");
        // Buckets, as the metrics guide says, for the dashboard's `_bucket` queries.
        let prometheus = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Prefix("distributed_lock_".to_owned()),
                lock_runtime::SECONDS_BUCKETS,
            )
            .expect("buckets")
            .build_recorder();
        let handle = prometheus.handle();
        metrics::set_global_recorder(GatedRecorder(prometheus))
            .expect("the only metrics recorder of this test binary");
        handle
    })
}

/// The registry whose losses block their recorder or subscriber while a [`Gate`] is closed: an
/// application's exporter stuck on its I/O, say.
const STALLED: &str = "metrics-stalled";

/// Closes over the measurements and events of [`STALLED`] while it lives: whoever records one
/// blocks until it is dropped (also when the test fails).
struct Gate;

/// Whether the gate is closed, how many callers it holds, and which closing this is.
static GATE: Mutex<GateState> = Mutex::new(GateState {
    closed: false,
    held: 0,
    round: 0,
});
static GATE_MOVED: Condvar = Condvar::new();

struct GateState {
    closed: bool,
    held: usize,
    /// A caller held by one closing goes on once that closing ends, even if the next test
    /// closed the gate again before it woke.
    round: u64,
}

impl Gate {
    fn close() -> Self {
        let mut state = GATE.lock().unwrap_or_else(PoisonError::into_inner);
        state.round += 1;
        (state.closed, state.held) = (true, 0);
        GATE_MOVED.notify_all();
        Self
    }

    /// Waits until someone is blocked at the gate.
    fn wait_held() {
        let (state, timeout) = GATE_MOVED
            .wait_timeout_while(
                GATE.lock().unwrap_or_else(PoisonError::into_inner),
                LIMIT,
                |s| s.held == 0,
            )
            .unwrap_or_else(PoisonError::into_inner);
        assert!(
            !timeout.timed_out(),
            "nothing reached the gate: closed {}, round {}",
            state.closed,
            state.round
        );
    }

    /// Blocks the caller while the gate is closed.
    fn pass() {
        let mut state = GATE.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed {
            state.held += 1;
            let round = state.round;
            GATE_MOVED.notify_all();
            drop(
                GATE_MOVED
                    .wait_while(state, |s| s.closed && s.round == round)
                    .unwrap_or_else(PoisonError::into_inner),
            );
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        GATE.lock().unwrap_or_else(PoisonError::into_inner).closed = false;
        GATE_MOVED.notify_all();
    }
}

/// Prometheus's recorder, whose counts of [`STALLED`]'s losses pass the [`Gate`] first.
struct GatedRecorder(metrics_exporter_prometheus::PrometheusRecorder);

struct GatedCounter(metrics::Counter);

impl metrics::CounterFn for GatedCounter {
    fn increment(&self, value: u64) {
        Gate::pass();
        self.0.increment(value);
    }

    fn absolute(&self, value: u64) {
        Gate::pass();
        self.0.absolute(value);
    }
}

impl metrics::Recorder for GatedRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> metrics::Counter {
        let counter = self.0.register_counter(key, metadata);
        let stalled = key
            .labels()
            .any(|l| l.key() == "registry" && l.value() == STALLED);
        if stalled && key.name() == "distributed_lock_lost_total" {
            return metrics::Counter::from_arc(Arc::new(GatedCounter(counter)));
        }
        counter
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> metrics::Gauge {
        self.0.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> metrics::Histogram {
        self.0.register_histogram(key, metadata)
    }
}

/// A `tracing` subscriber whose "lock lease lost" events pass the [`Gate`] first.
struct GatedSubscriber;

impl tracing::Subscriber for GatedSubscriber {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        struct Message(bool);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" && format!("{value:?}") == "lock lease lost" {
                    self.0 = true;
                }
            }
        }
        let mut lost = Message(false);
        event.record(&mut lost);
        if lost.0 {
            Gate::pass();
        }
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// While the application's recorder (or subscriber) blocks on what it was told of a loss, the
/// registry goes on: another lock is taken and kept (renewed past its ttl) and released. An
/// in-memory registry, whose keeper runs on the application's own runtime: the keeper's news
/// must not be told on it. Run on a thread and runtime of its own, so that a stalled registry
/// fails the test instead of hanging it.
fn a_blocked_reporter_stalls_no_lock(name: &'static str, subscriber: Option<GatedSubscriber>) {
    recorder();
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let gate = Gate::close();
    let went_on = on_a_thread_of_its_own(LIMIT * 2, subscriber, move || {
        goes_on_while_the_reporter_blocks(name)
    });
    drop(gate);
    went_on.expect("the registry went on while its reporter blocked");
}

/// A multi-threaded runtime, as the application's.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `work` on a thread and runtime of its own (under `subscriber`), waiting for it no
/// longer than `limit`: a registry stalled behind its reporter fails the test instead of
/// hanging it.
fn on_a_thread_of_its_own<T, Fut>(
    limit: Duration,
    subscriber: Option<GatedSubscriber>,
    work: impl FnOnce() -> Fut + Send + 'static,
) -> Result<T, std::sync::mpsc::RecvTimeoutError>
where
    T: Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _subscriber = subscriber.map(tracing::subscriber::set_default);
        let _ = done_tx.send(runtime().block_on(work()));
    });
    done.recv_timeout(limit)
}

/// An in-memory registry named `name` whose lock, neither renewed nor watched, is lost: its
/// keeper tells of the loss when its ttl runs out, and (under [`STALLED`]) blocks the reporter
/// there. Returns once something is held at the gate.
async fn stall_the_reporter(name: &str) -> (Registry, lock_runtime::LockGuard) {
    let registry = Registry::builder()
        .memory(lock_runtime::MemoryStore::new())
        .name(name)
        .build()
        .unwrap();
    let unwatched = registry
        .lock("stalled:1")
        .ttl(Duration::from_millis(100))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    tokio::task::spawn_blocking(Gate::wait_held).await.unwrap();
    (registry, unwatched)
}

async fn goes_on_while_the_reporter_blocks(name: &str) {
    let (registry, unwatched) = stall_the_reporter(name).await;
    let kept = tokio::time::timeout(LIMIT, registry.lock("stalled:2").ttl(TTL).acquire())
        .await
        .expect("a lock is taken while the reporter blocks")
        .unwrap();
    // Held across its ttl twice over: the keeper goes on renewing it.
    tokio::time::sleep(TTL * 2).await;
    assert!(
        !kept.is_lost(),
        "the keeper stalled behind the reporter: {:?}",
        kept.lost_reason()
    );
    tokio::time::timeout(LIMIT, kept.release())
        .await
        .expect("released while the reporter blocks")
        .expect("still ours");
    assert!(unwatched.is_lost());
}

/// The ttl of the lock held while the reporter blocks: renewed every third of it, and lost
/// only if no renewal lands in two thirds, which a runtime kept off the CPU by its neighbours
/// (two CPU hogs beside the suite) reaches with a ttl of a few hundred milliseconds.
const TTL: Duration = Duration::from_secs(1);

/// See [`a_blocked_reporter_stalls_no_lock`]: a recorder blocked on the loss's count.
#[test]
fn a_recorder_that_blocks_stalls_no_lock() {
    a_blocked_reporter_stalls_no_lock(STALLED, None);
}

/// See [`a_blocked_reporter_stalls_no_lock`]: a subscriber blocked on the loss's event.
#[test]
fn a_subscriber_that_blocks_stalls_no_lock() {
    // Another registry's name: its losses' counts do not block.
    a_blocked_reporter_stalls_no_lock("metrics-stalled-events", Some(GatedSubscriber));
}

/// One gate at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// The value of the sample `name` whose labels are exactly `labels`, in a Prometheus scrape.
fn sample(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let wanted: BTreeMap<&str, &str> = labels.iter().copied().collect();
    scrape.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
        if metric != name {
            return None;
        }
        let inner = rest.strip_suffix('}')?;
        let found: BTreeMap<&str, &str> = inner
            .split("\",")
            .filter(|pair| !pair.is_empty())
            .filter_map(|pair| {
                let (key, value) = pair.split_once("=\"")?;
                Some((key, value.trim_end_matches('"')))
            })
            .collect();
        (found == wanted).then(|| value.parse().expect("a sample's value is a number"))
    })
}

/// [`sample`], or a panic that shows the scrape.
fn value(scrape: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(scrape, name, labels)
        .unwrap_or_else(|| panic!("no sample {name}{labels:?} in the scrape:\n{scrape}"))
}

/// A registry on `server` whose metrics carry `name`.
fn named(server: &RedisServer, name: &str) -> Registry {
    Registry::builder()
        .url(server.url())
        .name(name)
        .build()
        .unwrap()
}

type Label = (&'static str, &'static str);

/// `labels` and one more.
fn and(labels: &[Label], extra: Label) -> Vec<Label> {
    let mut all = labels.to_vec();
    all.push(extra);
    all
}

#[distributed_lock(registry = "metrics-attr", key = "job:<id>", wait = "10s")]
async fn job(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

/// The same template, waiting only briefly.
#[distributed_lock(registry = "metrics-attr", key = "job:<id>", wait = "200ms")]
async fn job_now(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(registry = "metrics-down", key = "job:<id>")]
async fn job_on_a_dead_server(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_by_outcome_under_their_registry_and_key_template() {
    let metrics = recorder();
    let server = RedisServer::start();
    // Named by its installation; the holder (another replica, say) by its builder.
    Registry::from_url(&server.url())
        .unwrap()
        .install_as("metrics-attr");
    let holder = named(&server, "metrics-holder");
    // A server that never answers: the call fails within the registry's timeouts.
    let silent = SilentServer::start();
    fast_registry(&silent.url()).install_as("metrics-down");
    let attr = [("registry", "metrics-attr"), ("lock", "job:<id>")];
    let with = |extra| and(&attr, extra);

    // Two calls queue behind another replica's lock; its release hands it over.
    let held = holder.lock("job:1").acquire().await.unwrap();
    let scrape = metrics.render();
    let holder_labels = [("registry", "metrics-holder"), ("lock", "untemplated")];
    assert_eq!(value(&scrape, "distributed_lock_held", &holder_labels), 1.0);
    let waiters: Vec<_> = (0..2).map(|_| tokio::spawn(job(1))).collect();
    let con = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    eventually(LIMIT, "two calls queued for job:1", || {
        let mut con = con.clone();
        async move {
            let queued: usize = con.zcard("queue:{lock:job:1}").await.unwrap();
            queued == 2
        }
    })
    .await;
    held.release().await.unwrap();
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().unwrap(), 1);
    }

    // A call that gives up, and one whose Redis is down.
    let held = holder.lock("job:2").renew(false).acquire().await.unwrap();
    assert!(matches!(job_now(2).await, Err(LockError::Busy { .. })));
    held.release().await.unwrap();
    assert!(matches!(
        job_on_a_dead_server(3).await,
        Err(LockError::Backend { .. })
    ));

    let scrape = metrics.render();
    let acquisitions = "distributed_lock_acquisitions_total";
    assert_eq!(
        value(&scrape, acquisitions, &with(("outcome", "acquired"))),
        2.0
    );
    assert_eq!(
        value(&scrape, acquisitions, &with(("outcome", "busy"))),
        1.0
    );
    let down = [
        ("registry", "metrics-down"),
        ("lock", "job:<id>"),
        ("outcome", "error"),
    ];
    assert_eq!(value(&scrape, acquisitions, &down), 1.0);
    let mut holder_acquired = holder_labels.to_vec();
    holder_acquired.push(("outcome", "acquired"));
    assert_eq!(value(&scrape, acquisitions, &holder_acquired), 2.0);

    // The second waiter was certainly queued long before its turn; the first almost always.
    let handoffs = value(&scrape, "distributed_lock_handoffs_total", &attr);
    assert!((1.0..=2.0).contains(&handoffs), "handoffs: {handoffs}");
    let waited_busy = with(("outcome", "busy"));
    assert_eq!(
        value(&scrape, "distributed_lock_wait_seconds_count", &waited_busy),
        1.0
    );
    let busy_wait = value(&scrape, "distributed_lock_wait_seconds_sum", &waited_busy);
    assert!(
        busy_wait >= 0.2,
        "a busy call waited its 200 ms: {busy_wait}"
    );
    assert_eq!(
        value(&scrape, "distributed_lock_hold_seconds_count", &attr),
        2.0
    );
    assert_eq!(value(&scrape, "distributed_lock_held", &attr), 0.0);
    assert_eq!(value(&scrape, "distributed_lock_held", &holder_labels), 0.0);
    assert!(
        !scrape.contains("job:1") && !scrape.contains("job:2"),
        "a rendered key is never a label:\n{scrape}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_and_a_lost_lease_are_counted_and_the_lease_stops_counting_as_held() {
    let metrics = recorder();
    let server = RedisServer::start();
    let registry = named(&server, "metrics-lease");
    let labels = [("registry", "metrics-lease"), ("lock", "lease:<n>")];
    let with = |extra| and(&labels, extra);
    let guard = registry
        .lock("lease:7")
        .template("lease:<n>")
        // Long enough that the deletion below is found by a renewal (`gone`), never by a
        // deadline passing on a loaded machine (`expired`).
        .ttl(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    let renewed = with(("outcome", "renewed"));
    eventually(LIMIT, "two renewals counted", || async {
        sample(
            &metrics.render(),
            "distributed_lock_renewals_total",
            &renewed,
        )
        .is_some_and(|n| n >= 2.0)
    })
    .await;
    let mut con = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let deleted: u32 = con.del("lock:lease:7").await.unwrap();
    assert_eq!(deleted, 1);
    assert!(matches!(
        guard.lost().await,
        LockError::Lost {
            reason: LostReason::Gone,
            ..
        }
    ));

    // The keeper's counts are recorded from the library's reporting thread.
    let (lost, refused) = (with(("reason", "gone")), with(("outcome", "refused")));
    eventually(
        LIMIT,
        "the loss and its refused renewal counted",
        || async {
            let scrape = metrics.render();
            sample(&scrape, "distributed_lock_lost_total", &lost) == Some(1.0)
                && sample(&scrape, "distributed_lock_renewals_total", &refused) == Some(1.0)
        },
    )
    .await;
    let scrape = metrics.render();
    assert_eq!(value(&scrape, "distributed_lock_held", &labels), 1.0);
    assert!(matches!(
        guard.release().await,
        Err(LockError::NotOwner { .. })
    ));
    let scrape = metrics.render();
    assert_eq!(value(&scrape, "distributed_lock_held", &labels), 0.0);
    assert_eq!(
        value(&scrape, "distributed_lock_hold_seconds_count", &labels),
        1.0
    );
}

/// Pauses `server` until `guard`'s lease (3 s) is at risk, then lets it answer again until
/// the lease is out of risk.
async fn put_at_risk_and_back(server: &RedisServer, guard: &lock_runtime::LockGuard) {
    server.pause();
    tokio::time::timeout(Duration::from_secs(3), guard.at_risk())
        .await
        .expect("at risk within the ttl");
    server.resume();
    tokio::time::timeout(Duration::from_secs(3), guard.out_of_risk())
        .await
        .expect("out of risk within the ttl");
}

/// A lease whose renewal goes unanswered for a third of its ttl counts once as at risk; its
/// late answer keeps it (nothing is counted lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_put_at_risk_is_counted_once() {
    let metrics = recorder();
    let server = RedisServer::start();
    let registry = named(&server, "metrics-risk");
    let labels = [("registry", "metrics-risk"), ("lock", "risk:<n>")];
    let guard = registry
        .lock("risk:1")
        .template("risk:<n>")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    put_at_risk_and_back(&server, &guard).await;
    assert!(!guard.is_lost());
    eventually(LIMIT, "the risk counted", || async {
        sample(&metrics.render(), "distributed_lock_at_risk_total", &labels) == Some(1.0)
    })
    .await;
    assert_eq!(
        sample(
            &metrics.render(),
            "distributed_lock_lost_total",
            &and(&labels, ("reason", "expired"))
        ),
        None
    );
    guard.release().await.expect("still ours");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_stops_waiting_is_counted_cancelled_and_an_unwatched_lease_lost() {
    let metrics = recorder();
    let server = RedisServer::start();
    let registry = named(&server, "metrics-quiet");
    let labels = [("registry", "metrics-quiet"), ("lock", "quiet:<n>")];
    let with = |extra| and(&labels, extra);
    // Not renewed and never watched: the keeper reports it lost when its ttl runs out.
    let guard = registry
        .lock("quiet:1")
        .template("quiet:<n>")
        .ttl(Duration::from_millis(500))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    // A caller that gives up on its own while waiting for it.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(100),
        registry
            .lock("quiet:1")
            .template("quiet:<n>")
            .wait(Duration::from_secs(10))
            .acquire(),
    )
    .await;
    assert!(gave_up.is_err(), "still waiting when the caller stopped");
    let not_renewed = with(("reason", "not_renewed"));
    eventually(LIMIT, "the unwatched lease counted lost", || async {
        sample(
            &metrics.render(),
            "distributed_lock_lost_total",
            &not_renewed,
        ) == Some(1.0)
    })
    .await;
    assert!(guard.is_lost());
    let scrape = metrics.render();
    let acquisitions = "distributed_lock_acquisitions_total";
    assert_eq!(
        value(&scrape, acquisitions, &with(("outcome", "cancelled"))),
        1.0
    );
    assert_eq!(
        value(&scrape, acquisitions, &with(("outcome", "acquired"))),
        1.0
    );
    assert_eq!(value(&scrape, "distributed_lock_held", &labels), 1.0);
    drop(guard);
}

/// An election's terms are counted where they are won and end (by reason), the leader gauge
/// says whether this registry leads, and an observer measures the time without a leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elections_terms_leader_and_leaderless_time_are_measured() {
    let metrics = recorder();
    let server = RedisServer::start();
    let (candidate, watcher) = (
        named(&server, "metrics-election"),
        named(&server, "metrics-watcher"),
    );
    let labels = [("registry", "metrics-election"), ("election", "sweeper")];
    let election = candidate
        .election("sweeper")
        .identity("a")
        // Renewed every second: the keeper finds a taken term gone soon.
        .ttl(Duration::from_secs(3));
    let mut observer = watcher.election("sweeper").observe();
    assert_eq!(
        observer.next().await.expect("observe"),
        None,
        "nobody leads yet"
    );

    let leadership = election.campaign().await.expect("elected");
    let seen = tokio::time::timeout(LIMIT, observer.next())
        .await
        .expect("the observer sees the leader")
        .expect("observe");
    assert_eq!(seen.map(|l| l.identity).as_deref(), Some("a"));
    let scrape = metrics.render();
    assert_eq!(
        value(&scrape, "distributed_lock_terms_won_total", &labels),
        1.0
    );
    assert_eq!(value(&scrape, "distributed_lock_leader", &labels), 1.0);
    eventually(
        LIMIT,
        "the leaderless time seen by the observer",
        || async {
            sample(
                &metrics.render(),
                "distributed_lock_leaderless_seconds_count",
                &[("registry", "metrics-watcher"), ("election", "sweeper")],
            ) == Some(1.0)
        },
    )
    .await;

    leadership.resign().await.expect("resign");
    eventually(LIMIT, "the resigned term counted", || async {
        let scrape = metrics.render();
        sample(
            &scrape,
            "distributed_lock_terms_ended_total",
            &and(&labels, ("reason", "resigned")),
        ) == Some(1.0)
            && sample(&scrape, "distributed_lock_leader", &labels) == Some(0.0)
    })
    .await;

    // A second term, taken away by an operator: lost, with the reason the keeper saw.
    let leadership = election.campaign().await.expect("elected again");
    assert!(watcher.force_unlock("sweeper").await.expect("force-unlock"));
    tokio::time::timeout(LIMIT, leadership.of_term().lost())
        .await
        .expect("lost within the limit");
    eventually(LIMIT, "the lost term counted", || async {
        let scrape = metrics.render();
        sample(
            &scrape,
            "distributed_lock_terms_ended_total",
            &and(&labels, ("reason", "gone")),
        ) == Some(1.0)
            && sample(&scrape, "distributed_lock_terms_won_total", &labels) == Some(2.0)
            && sample(&scrape, "distributed_lock_leader", &labels) == Some(0.0)
    })
    .await;
}

/// The leader gauge is the count of terms led here when each report runs: one leader reads 1
/// (never 2 across a handover, whichever thread tells which end), and 0 once every term
/// ended, also after reports were dropped while the application's recorder blocked.
#[test]
fn the_leader_gauge_is_back_to_zero_once_every_term_ended() {
    const TERMS: usize = 5000;
    recorder();
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let labels = [("registry", "metrics-leader-drift"), ("election", "drift")];
    let gate = Gate::close();
    let went_on = on_a_thread_of_its_own(LIMIT * 12, None, move || async move {
        // The application's recorder blocks (on another registry's loss): the reporting
        // thread is held, and its queue fills.
        let _stalled = stall_the_reporter(STALLED).await;
        let registry = Registry::builder()
            .memory(lock_runtime::MemoryStore::new())
            .name("metrics-leader-drift")
            .build()
            .unwrap();
        let election = registry
            .election("drift")
            .identity("a")
            .ttl(Duration::from_secs(60));
        let mut during_second_term = None;
        for i in 0..TERMS {
            let leadership = election.campaign().await.expect("elected");
            if i == 1 {
                during_second_term =
                    sample(&recorder().render(), "distributed_lock_leader", &labels);
            }
            leadership.resign().await.expect("resign");
        }
        during_second_term
    });
    drop(gate);
    let during_second_term = went_on.expect("the terms went on while the reporter blocked");
    runtime().block_on(async {
        // Told after every term's end: once it shows, the queue has been drained.
        let sentinel = Registry::builder()
            .memory(lock_runtime::MemoryStore::new())
            .name("metrics-leader-drift-sentinel")
            .build()
            .unwrap();
        let _guard = sentinel
            .lock("sentinel")
            .ttl(Duration::from_millis(50))
            .renew(false)
            .acquire()
            .await
            .unwrap();
        eventually(LIMIT, "the sentinel's loss is told", || async {
            sample(
                &recorder().render(),
                "distributed_lock_lost_total",
                &[
                    ("registry", "metrics-leader-drift-sentinel"),
                    ("lock", "untemplated"),
                    ("reason", "not_renewed"),
                ],
            ) == Some(1.0)
        })
        .await;
    });
    let after = sample(&recorder().render(), "distributed_lock_leader", &labels);
    assert_eq!(
        (during_second_term, after),
        (Some(1.0), Some(0.0)),
        "the leader gauge while the second term was led, and after all {TERMS} terms ended"
    );
}

/// The dashboard in `dashboards/` asks only for series the library exports, with the labels
/// they carry, and shows every metric the library exports: each of its queries is checked
/// against a scrape taken after this test made the library report every metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_queries_what_the_library_exports_and_shows_all_of_it() {
    let metrics = recorder();
    report_every_metric().await;
    let exported = exported(&metrics.render());
    let families: BTreeSet<&str> = exported.keys().map(|name| family(name)).collect();
    let described: BTreeSet<&str> = [
        "distributed_lock_acquisitions_total",
        "distributed_lock_wait_seconds",
        "distributed_lock_handoffs_total",
        "distributed_lock_hold_seconds",
        "distributed_lock_held",
        "distributed_lock_renewals_total",
        "distributed_lock_at_risk_total",
        "distributed_lock_lost_total",
        "distributed_lock_leader",
        "distributed_lock_terms_won_total",
        "distributed_lock_terms_ended_total",
        "distributed_lock_leaderless_seconds",
    ]
    .into();
    assert_eq!(families, described, "every metric was reported here");
    for histogram in ["wait", "hold", "leaderless"] {
        let buckets = format!("distributed_lock_{histogram}_seconds_bucket");
        assert!(exported[buckets.as_str()].contains("le"), "{buckets}");
    }

    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dashboards/distributed-lock.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the dashboard")).unwrap();
    let mut queries: Vec<String> = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            assert_eq!(
                target["datasource"]["uid"], "${datasource}",
                "{}: the dashboard's own data source",
                panel["title"]
            );
            queries.push(target["expr"].as_str().expect("a query").to_owned());
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(query) = variable["query"]["query"].as_str() {
            queries.push(query.to_owned());
        }
    }
    let mut shown = BTreeSet::new();
    for query in &queries {
        let problems = check_query(query, &exported);
        assert!(problems.is_empty(), "{query}:\n{}", problems.join("\n"));
        shown.extend(metric_names(query).into_iter().map(family));
    }
    assert_eq!(shown, described, "every metric is on the dashboard");
}

/// Makes the library report every metric under the registries `metrics-dashboard` and
/// `metrics-dashboard-watcher`: a handoff, a busy request, renewals, a lease at risk, one lost,
/// and an election's term won, its leaderless time and its end.
async fn report_every_metric() {
    let server = RedisServer::start();
    let registry = named(&server, "metrics-dashboard");
    let lock = |key: &'static str| registry.lock(key).template("dash:<n>");
    let held = lock("dash:1").acquire().await.unwrap();
    assert!(matches!(
        lock("dash:1").acquire().await,
        Err(LockError::Busy { .. })
    ));
    let waiter = tokio::spawn(lock("dash:1").wait(LIMIT).acquire());
    eventually(LIMIT, "a waiter queued", || async {
        registry.inspect("dash:1").await.unwrap().waiters == 1
    })
    .await;
    held.release().await.unwrap();
    waiter
        .await
        .unwrap()
        .expect("handed over")
        .release()
        .await
        .unwrap();

    // Renewed every second; put at risk by a pause, and lost to a deletion.
    let guard = lock("dash:2")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    put_at_risk_and_back(&server, &guard).await;
    assert!(registry.force_unlock("dash:2").await.unwrap());
    tokio::time::timeout(LIMIT, guard.lost())
        .await
        .expect("lost at the next renewal");
    drop(guard);

    let watcher = named(&server, "metrics-dashboard-watcher");
    let mut observer = watcher.election("dash").observe();
    assert_eq!(observer.next().await.expect("observe"), None);
    let leadership = registry.election("dash").campaign().await.unwrap();
    tokio::time::timeout(LIMIT, observer.next())
        .await
        .expect("the observer sees the leader")
        .expect("observe");
    leadership.resign().await.unwrap();

    let labels = [("registry", "metrics-dashboard"), ("election", "dash")];
    eventually(LIMIT, "every report told", || async {
        let scrape = recorder().render();
        sample(
            &scrape,
            "distributed_lock_terms_ended_total",
            &and(&labels, ("reason", "resigned")),
        ) == Some(1.0)
            && sample(
                &scrape,
                "distributed_lock_lost_total",
                &[
                    ("registry", "metrics-dashboard"),
                    ("lock", "dash:<n>"),
                    ("reason", "gone"),
                ],
            ) == Some(1.0)
            && sample(
                &scrape,
                "distributed_lock_leaderless_seconds_count",
                &[
                    ("registry", "metrics-dashboard-watcher"),
                    ("election", "dash"),
                ],
            ) == Some(1.0)
    })
    .await;
}

/// Each series name of a Prometheus scrape with the label names it carries.
fn exported(scrape: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut exported: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let series = line.rsplit_once(' ').map_or(line, |(series, _)| series);
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let names = exported.entry(name.to_owned()).or_default();
        for pair in labels.trim_end_matches('}').split("\",") {
            if let Some((label, _)) = pair.split_once("=\"") {
                names.insert(label.to_owned());
            }
        }
    }
    exported
}

/// A histogram's or summary's family (`x_bucket`, `x_sum`, `x_count`: `x`), else the name.
fn family(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

/// The library's metric names a PromQL query reads.
fn metric_names(query: &str) -> Vec<&str> {
    read_series(query)
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// Each of the library's series a PromQL query reads, with what follows its name.
fn read_series(query: &str) -> Vec<(&str, &str)> {
    let mut series = Vec::new();
    let mut rest = query;
    while let Some(at) = rest.find("distributed_lock_") {
        let name = &rest[at..];
        let end = name
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(name.len());
        series.push((&name[..end], &name[end..]));
        rest = &name[end..];
    }
    series
}

/// What is wrong with `query` against `exported`: a series the library does not export, a
/// label matched, grouped by or asked for that the series it reads do not carry. Labels a
/// Prometheus server adds to every target (`instance`, `job`) are allowed in groupings.
fn check_query(query: &str, exported: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut carried: BTreeSet<String> = ["instance", "job"].map(str::to_owned).into();
    for (name, after) in read_series(query) {
        let Some(labels) = exported.get(name) else {
            problems.push(format!("{name} is not exported"));
            continue;
        };
        carried.extend(labels.iter().cloned());
        // The matchers right after the name: `name{label="..", label=~".."}`.
        if let Some(matchers) = after.strip_prefix('{') {
            let matchers = &matchers[..matchers.find('}').expect("a closed selector")];
            for matcher in matchers.split(',') {
                let label = matcher.split(['=', '!']).next().unwrap().trim();
                if !labels.contains(label) {
                    problems.push(format!("{name} carries no label {label}"));
                }
            }
        }
    }
    // Groupings (`by (a, b)`) and a variable's `label_values(series, label)`.
    let mut grouped = Vec::new();
    for clause in query.split("by (").skip(1) {
        grouped.extend(
            clause[..clause.find(')').unwrap()]
                .split(',')
                .map(str::trim),
        );
    }
    if let Some(args) = query.strip_prefix("label_values(") {
        grouped.push(
            args.rsplit_once(',')
                .unwrap()
                .1
                .trim_end_matches(')')
                .trim(),
        );
    }
    for label in grouped {
        if !carried.contains(label) {
            problems.push(format!("no series read carries {label}"));
        }
    }
    problems
}

#[test]
fn a_query_that_asks_for_what_is_not_exported_is_found() {
    let exported: BTreeMap<String, BTreeSet<String>> = [(
        "distributed_lock_held".to_owned(),
        ["registry", "lock"].map(str::to_owned).into(),
    )]
    .into();
    let check = |query| check_query(query, &exported);
    assert!(check("sum by (lock, instance) (distributed_lock_held{registry=~\"$r\"})").is_empty());
    assert_eq!(
        check("sum by (election) (distributed_lock_held)"),
        ["no series read carries election"]
    );
    assert_eq!(
        check("distributed_lock_held{outcome=\"busy\"}"),
        ["distributed_lock_held carries no label outcome"]
    );
    assert_eq!(
        check("rate(distributed_lock_hold_seconds_bucket[5m])"),
        ["distributed_lock_hold_seconds_bucket is not exported"]
    );
    assert_eq!(
        check("label_values(distributed_lock_held, outcome)"),
        ["no series read carries outcome"]
    );
}
