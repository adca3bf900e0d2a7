//! What a lock shows in traces: `lock.acquire` with its wait's outcome, `lock.hold` with the
//! body inside it and the keeper's events about the lease, and `lock.release`, each under the
//! caller's span.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockError, Registry};
use lock_tests::RedisServer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// One span as the subscriber saw it.
#[derive(Clone, Debug, Default)]
struct Seen {
    name: &'static str,
    id: u64,
    parent: Option<u64>,
    fields: BTreeMap<String, String>,
    /// The messages of the events inside it.
    events: Vec<String>,
    closed: bool,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// Every span and in-span event, in the order they came.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Seen>>>);

impl Spans {
    fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    /// The spans named `name` whose `lock.key` is `key`.
    fn named(&self, name: &str, key: &str) -> Vec<Seen> {
        self.all()
            .into_iter()
            .filter(|s| s.name == name && s.field("lock.key") == Some(key))
            .collect()
    }

    fn the(&self, name: &str, key: &str) -> Seen {
        let mut found = self.named(name, key);
        assert_eq!(
            found.len(),
            1,
            "one `{name}` for `{key}`: {:#?}",
            self.all()
        );
        found.remove(0)
    }

    /// The latest span with this id (a closed span's id may be given again).
    fn update(&self, id: &Id, change: impl FnOnce(&mut Seen)) {
        let mut spans = self.0.lock().unwrap();
        if let Some(seen) = spans.iter_mut().rev().find(|s| s.id == id.into_u64()) {
            change(seen);
        }
    }

    async fn closed(&self, name: &'static str, key: &str) -> Seen {
        lock_tests::eventually(Duration::from_secs(10), name, || async {
            self.named(name, key).iter().any(|s| s.closed)
        })
        .await;
        self.the(name, key)
    }
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut seen = Seen {
            name: attrs.metadata().name(),
            id: id.into_u64(),
            parent: ctx
                .span(id)
                .and_then(|s| s.parent())
                .map(|p| p.id().into_u64()),
            ..Seen::default()
        };
        attrs.record(&mut Fields(&mut seen.fields));
        self.0.lock().unwrap().push(seen);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        self.update(id, |seen| values.record(&mut Fields(&mut seen.fields)));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.event_span(event) {
            let mut fields = BTreeMap::new();
            event.record(&mut Fields(&mut fields));
            let message = fields.remove("message").unwrap_or_default();
            self.update(&span.id(), |seen| seen.events.push(message));
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        self.update(&id, |seen| seen.closed = true);
    }
}

/// A subscriber that keeps every span, as the default of this thread (and of the tasks the
/// registries built under it start on the library's own threads).
fn subscriber() -> (Spans, tracing::subscriber::DefaultGuard) {
    let spans = Spans::default();
    let guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    // Callsites the binary's other tests reached without a subscriber may keep an interest of
    // `never` if they registered as this one was installed: asked again now.
    tracing::callsite::rebuild_interest_cache();
    (spans, guard)
}

fn registry(server: &RedisServer) -> Registry {
    super::support::patient_registry(&server.url())
}

#[tokio::test]
async fn a_wait_its_hold_and_its_release_show_as_spans_under_the_callers() {
    let (spans, _default) = subscriber();
    let server = RedisServer::start();
    let (holder, waiter) = (registry(&server), registry(&server));
    let held = holder
        .lock("report:7")
        .template("report:<id>")
        .acquire()
        .await
        .unwrap();
    let caller = tracing::info_span!("request");
    let request = async move {
        waiter
            .lock("report:7")
            .template("report:<id>")
            .fencing(true)
            .wait(Duration::from_secs(10))
            .run(async {
                let inside = tracing::Span::current();
                tracing::info!("the body's own event");
                Ok::<_, LockError>(inside.metadata().map(|m| m.name()))
            })
            .await
    };
    let waiting = tokio::spawn(tracing::Instrument::instrument(request, caller.clone()));
    // Queued: its first attempt found the lock taken, so the release hands it over.
    super::handoff::until_queued(&server.url(), "report:7", 1).await;
    held.release().await.unwrap();
    let body_ran_in = waiting.await.unwrap().unwrap();
    assert_eq!(
        body_ran_in,
        Some("lock.hold"),
        "the body runs inside the hold"
    );

    let caller = caller.id().unwrap().into_u64();
    let acquires = spans.named("lock.acquire", "report:7");
    let waited = acquires
        .iter()
        .find(|s| s.parent == Some(caller))
        .expect("the waiter's request under the caller's span");
    assert_eq!(waited.field("lock.outcome"), Some("acquired"), "{waited:?}");
    assert_eq!(waited.field("lock.template"), Some("report:<id>"));
    assert_eq!(waited.field("lock.mode"), Some("exclusive"));
    assert_eq!(waited.field("lock.wait_ms"), Some("10000"));
    // A release handed it over; whether the notice or the waiter's next attempt told it first
    // is a race the span reports either way.
    assert!(
        matches!(waited.field("lock.handed_over"), Some("true" | "false")),
        "{waited:?}"
    );
    assert!(waited
        .field("lock.fence")
        .is_some_and(|f| f.parse::<u64>().is_ok()));
    assert!(waited.closed, "the request's span ends with it");

    let holds: Vec<Seen> = spans
        .named("lock.hold", "report:7")
        .into_iter()
        .filter(|s| s.parent == Some(caller))
        .collect();
    assert_eq!(holds.len(), 1, "the hold beside the request: {holds:#?}");
    let hold = &holds[0];
    assert_eq!(hold.field("lock.fence"), waited.field("lock.fence"));
    assert_eq!(hold.events, ["the body's own event"]);
    let release = spans
        .all()
        .into_iter()
        .find(|s| s.name == "lock.release" && s.parent == Some(hold.id))
        .expect("the release inside the hold");
    assert_eq!(release.field("lock.outcome"), Some("released"));
    let hold = {
        lock_tests::eventually(Duration::from_secs(10), "the hold's end", || async {
            spans
                .named("lock.hold", "report:7")
                .iter()
                .any(|s| s.parent == Some(caller) && s.closed)
        })
        .await;
        spans
            .named("lock.hold", "report:7")
            .into_iter()
            .find(|s| s.parent == Some(caller))
            .unwrap()
    };
    assert_eq!(hold.field("lock.end"), Some("released"));
    assert_eq!(hold.field("lock.renewals"), Some("0"));
}

#[tokio::test]
async fn a_request_that_gets_no_lock_says_why() {
    let (spans, _default) = subscriber();
    let server = RedisServer::start();
    let (holder, other) = (registry(&server), registry(&server));
    let _held = holder.lock("taken").acquire().await.unwrap();

    let busy = other.lock("taken").wait(Duration::ZERO).acquire().await;
    assert!(busy.unwrap_err().is_busy());
    let timed_out = other
        .lock("taken")
        .wait(Duration::from_millis(50))
        .acquire()
        .await;
    assert!(timed_out.unwrap_err().is_busy());
    let cancelled = tokio::time::timeout(
        Duration::from_millis(50),
        other.lock("taken").wait(Duration::from_secs(60)).acquire(),
    )
    .await;
    assert!(cancelled.is_err(), "the caller stopped waiting");
    let outcomes: Vec<Option<String>> = spans
        .named("lock.acquire", "taken")
        .iter()
        .map(|s| s.field("lock.outcome").map(str::to_owned))
        .collect();
    assert_eq!(
        outcomes,
        [
            Some("acquired".to_owned()),
            Some("busy".to_owned()),
            Some("timed_out".to_owned()),
            Some("cancelled".to_owned())
        ]
    );

    let invalid = other.lock("").acquire().await;
    assert!(matches!(invalid, Err(LockError::InvalidKey { .. })));
    let refused = spans.the("lock.acquire", "");
    assert_eq!(refused.field("lock.outcome"), Some("error"));
    assert_eq!(refused.field("error.type"), Some("invalid_key"));
    assert_eq!(refused.field("otel.status_code"), Some("ERROR"));
    assert!(refused
        .field("otel.status_description")
        .is_some_and(|d| d.contains("key")));
}

#[tokio::test]
async fn a_lost_lease_ends_its_hold_with_the_reason_and_says_so_inside_it() {
    let (spans, _default) = subscriber();
    let server = RedisServer::start();
    let (holder, admin) = (registry(&server), registry(&server));
    let held = holder
        .lock("doomed")
        .ttl(Duration::from_millis(900))
        .acquire()
        .await
        .unwrap();
    // Renewed at least once (every 300 ms) before it is taken away: past 450 ms, only a
    // renewal leaves more than 450 ms of the 900.
    let (acquired, url) = (tokio::time::Instant::now(), server.url());
    lock_tests::eventually(Duration::from_secs(10), "a renewal", || async {
        let mut con = lock_tests::raw(&url).await;
        let left: i64 = redis::cmd("PTTL")
            .arg("lock:doomed")
            .query_async(&mut con)
            .await
            .unwrap();
        acquired.elapsed() > Duration::from_millis(450) && left > 600
    })
    .await;
    assert!(admin.force_unlock("doomed").await.unwrap());
    let lost = held.lost().await;
    assert!(lost.is_lost(), "{lost}");
    drop(held);
    let hold = spans.closed("lock.hold", "doomed").await;
    assert_eq!(hold.field("lock.end"), Some("gone"), "{hold:?}");
    assert_eq!(hold.field("otel.status_code"), Some("ERROR"));
    assert!(hold
        .field("lock.renewals")
        .and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|n| n >= 1));
    assert!(
        hold.events.iter().any(|e| e == "lock lease lost"),
        "{:?}",
        hold.events
    );
}

// Found by an adversarial review of the first cut: the threads subscriber callbacks run on,
// releases after a loss, multi-key names, refused requests, and a subscriber stuck closing.

/// A subscriber callback: which, on which span or event, on which thread.
type Call = (String, &'static str, String);

/// Every subscriber callback with the thread it ran on; when `gate` is closed, an event told or
/// a span closed on one of the library's threads waits there until it opens (a subscriber stuck
/// in `on_event` or `on_close`: an exporter that blocks, say).
#[derive(Clone)]
struct Threads {
    calls: Arc<Mutex<Vec<Call>>>,
    gate: Arc<(Mutex<bool>, std::sync::Condvar)>,
    stuck: Arc<Mutex<Option<tokio::sync::mpsc::UnboundedSender<String>>>>,
}

impl Threads {
    fn new(open: bool) -> Self {
        Self {
            calls: Arc::default(),
            gate: Arc::new((Mutex::new(open), std::sync::Condvar::new())),
            stuck: Arc::default(),
        }
    }

    fn note(&self, what: &str, name: &'static str) {
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((what.to_owned(), name, thread));
    }

    /// The callbacks that ran on the I/O thread.
    fn on_io(&self) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, t)| t == "lock-runtime-io")
            .cloned()
            .collect()
    }

    fn open(&self) {
        *self
            .gate
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        self.gate.1.notify_all();
    }
}

/// Opens the gate however the test ends: the reporting and I/O threads are the process's.
struct OpensGate(Threads);

impl Drop for OpensGate {
    fn drop(&mut self) {
        self.0.open();
    }
}

fn name_of<S: Subscriber + for<'a> LookupSpan<'a>>(id: &Id, ctx: &Context<'_, S>) -> &'static str {
    ctx.span(id).map_or("?", |s| s.name())
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Threads {
    fn register_callsite(
        &self,
        meta: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        self.note("register_callsite", meta.name());
        tracing::subscriber::Interest::always()
    }
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        self.note("new_span", attrs.metadata().name());
    }
    fn on_record(&self, id: &Id, _: &Record<'_>, ctx: Context<'_, S>) {
        self.note("record", name_of(id, &ctx));
    }
    fn on_follows_from(&self, id: &Id, _: &Id, ctx: Context<'_, S>) {
        self.note("follows_from", name_of(id, &ctx));
    }
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        self.note("event", event.metadata().name());
        self.hold_up();
    }
    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        self.note("enter", name_of(id, &ctx));
    }
    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        self.note("exit", name_of(id, &ctx));
    }
    fn on_id_change(&self, _: &Id, id: &Id, ctx: Context<'_, S>) {
        self.note("clone/id_change", name_of(id, &ctx));
    }
    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        self.note("close", name_of(&id, &ctx));
        self.hold_up();
    }
}

impl Threads {
    /// While the gate is closed, a callback on one of the library's threads waits for it.
    fn hold_up(&self) {
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        if !thread.starts_with("lock-runtime") {
            return;
        }
        if let Some(stuck) = &*self.stuck.lock().unwrap() {
            drop(stuck.send(thread.clone()));
        }
        let (open, opened) = &*self.gate;
        let open = open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if thread == "lock-runtime-io" {
            // Stuck there for at most 3 s: the I/O thread is the whole test process's.
            drop(opened.wait_timeout_while(open, Duration::from_secs(3), |open| !*open));
        } else {
            drop(opened.wait_while(open, |open| !*open));
        }
    }
}

/// Both layers: the spans, and the threads of every callback.
fn watched(threads: &Threads) -> (Spans, tracing::subscriber::DefaultGuard) {
    let spans = Spans::default();
    let guard = tracing::subscriber::set_default(
        tracing_subscriber::registry()
            .with(spans.clone())
            .with(threads.clone()),
    );
    tracing::callsite::rebuild_interest_cache();
    (spans, guard)
}

async fn del(url: &str, key: &str) {
    let mut con = lock_tests::raw(url).await;
    let _: i64 = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap();
}

/// Every lock path a subscriber sees, with no callback on the I/O thread.
#[tokio::test]
async fn no_subscriber_callback_runs_on_the_io_thread() {
    let threads = Threads::new(true);
    let (spans, _default) = watched(&threads);
    let server = RedisServer::start();
    let url = server.url();
    let (a, b) = (registry(&server), registry(&server));

    // Acquire, renewals, release.
    let held = a
        .lock("t:renewed")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    held.release().await.unwrap();

    // Contended wait with handoff.
    let held = a.lock("t:handoff").acquire().await.unwrap();
    let waiter = super::support::spawn_waiter(b.clone(), "t:handoff");
    super::handoff::until_queued(&url, "t:handoff", 1).await;
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();

    // A lease lost: force-unlocked by another registry, and deleted by a raw DEL.
    let held = a
        .lock("t:forced")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    assert!(b.force_unlock("t:forced").await.unwrap());
    let _ = held.lost().await;
    drop(held);
    let lost_body = a
        .lock("t:deleted")
        .ttl(Duration::from_millis(300))
        .run(async {
            del(&url, "lock:t:deleted").await;
            std::future::pending::<Result<(), LockError>>().await
        })
        .await;
    assert!(lost_body.is_err());

    // A dropped guard (background release), min_hold, read locks and permits.
    drop(a.lock("t:dropped").acquire().await.unwrap());
    let kept = a
        .lock("t:min")
        .min_hold(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap();
    kept.release().await.unwrap();
    let r = a
        .lock("t:read")
        .mode(lock_runtime::Mode::Read)
        .acquire()
        .await
        .unwrap();
    let p = a.lock("t:permits").permits(3).acquire().await.unwrap();
    drop(r);
    drop(p);

    // Elections: a campaign, a term's work that returns, a resignation.
    let election = a
        .election("t:leader")
        .identity("one")
        .ttl(Duration::from_millis(300));
    let leadership = election.campaign().await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    leadership.resign().await.unwrap();
    let spawned = tokio::spawn(election.campaign()).await.unwrap().unwrap();
    drop(spawned);
    let mut terms = 0;
    let led = tokio::time::timeout(
        Duration::from_secs(5),
        election.lead(|_term| {
            terms += 1;
            async { Err::<(), _>("done") }
        }),
    )
    .await;
    assert!(led.is_err() && terms >= 1, "led {terms} terms");

    // Redlock over three servers.
    let (n2, n3) = (RedisServer::start(), RedisServer::start());
    let redlock = lock_tests::with_timeouts(
        lock_runtime::Registry::builder().redlock([server.url(), n2.url(), n3.url()]),
        Duration::from_secs(10),
    );
    let held = redlock
        .lock("t:redlock")
        .ttl(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    held.release().await.unwrap();
    let held = redlock
        .lock("t:redlock-lost")
        .ttl(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    for node in [&server, &n2, &n3] {
        del(&node.url(), "lock:t:redlock-lost").await;
    }
    let _ = held.lost().await;
    drop(held);

    // Shutdown mid-hold.
    let held = a.lock("t:shutdown").acquire().await.unwrap();
    a.shutdown().await;
    let _ = held.release().await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    assert!(!spans.all().is_empty(), "the subscriber saw the spans");
    let on_io = threads.on_io();
    assert!(
        on_io.is_empty(),
        "subscriber callbacks on the I/O thread: {on_io:#?}"
    );
}

/// Every `lock.release` is inside its `lock.hold` (guide::tracing's tree: "lock.release inside
/// the hold"), also when the lease was lost first: a guard released after its loss was
/// noticed (`NotOwner`), and one released after a shutdown marked it lost. (A guarded body
/// cancelled by its loss races the same way: `run`'s release is inside the hold or not,
/// depending on whether the keeper ended the hold span first.)
#[tokio::test]
async fn a_lost_leases_release_is_inside_its_hold() {
    let (spans, _default) = subscriber();
    let server = RedisServer::start();
    let (holder, admin) = (registry(&server), registry(&server));

    // A guard whose loss the keeper noticed, then released: NotOwner.
    let held = holder
        .lock("orphan:forced")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    assert!(admin.force_unlock("orphan:forced").await.unwrap());
    let _ = held.lost().await;
    let released = held.release().await;
    assert!(
        matches!(released, Err(LockError::NotOwner { .. })),
        "{released:?}"
    );
    let hold = spans.closed("lock.hold", "orphan:forced").await;
    assert_eq!(hold.field("lock.end"), Some("gone"), "{hold:?}");

    // A guard released after a shutdown.
    let held = holder.lock("orphan:shutdown").acquire().await.unwrap();
    holder.shutdown().await;
    let _ = held.release().await;
    let shut = spans.closed("lock.hold", "orphan:shutdown").await;

    let releases: Vec<Seen> = spans
        .all()
        .into_iter()
        .filter(|s| s.name == "lock.release")
        .collect();
    assert_eq!(releases.len(), 2, "{releases:#?}");
    let parents: Vec<Option<u64>> = releases.iter().map(|r| r.parent).collect();
    assert_eq!(
        parents,
        [Some(hold.id), Some(shut.id)],
        "each release inside its hold, not a root span of a trace of its own: {releases:#?}"
    );
}

/// A multi-key lock's request and hold name the same key (guide::tracing: the hold's
/// `lock.key` is "as above").
#[tokio::test]
async fn a_multi_key_locks_spans_name_one_key() {
    let (spans, _default) = subscriber();
    let server = RedisServer::start();
    let registry = registry(&server);
    let both = registry
        .lock_all(["account:9", "account:7"])
        .acquire()
        .await
        .unwrap();
    assert_eq!(both.key(), "account:7 + account:9");
    both.release().await.unwrap();
    let keys = |name: &str| -> Vec<String> {
        spans
            .all()
            .into_iter()
            .filter(|s| s.name == name)
            .filter_map(|s| s.field("lock.key").map(str::to_owned))
            .collect()
    };
    assert_eq!(
        keys("lock.acquire"),
        keys("lock.hold"),
        "one lock, one `lock.key` in its request and its hold"
    );
}

/// A subscriber stuck closing a span (a blocking exporter, say) holds up no lock, as one stuck
/// in an event holds up none (`reporting.rs`): the I/O thread never calls it, also once the
/// reporting thread's queue is full and reports are dropped.
///
/// Ignored in the binary's run: it blocks the process-wide reporting thread and overflows its
/// queue, which would drop the reports of every test beside it. `scripts/test` runs it alone, in
/// a process of its own (`cargo test --test runtime -- --ignored --exact
/// runtime::spans::a_subscriber_stuck_closing_a_span_holds_up_no_lock`).
#[tokio::test]
#[ignore = "run alone, in a process of its own: scripts/test does"]
async fn a_subscriber_stuck_closing_a_span_holds_up_no_lock() {
    let threads = Threads::new(false);
    let _opens = OpensGate(threads.clone());
    let (stuck_tx, mut stuck) = tokio::sync::mpsc::unbounded_channel();
    *threads.stuck.lock().unwrap() = Some(stuck_tx);
    let (_spans, _default) = watched(&threads);
    let server = RedisServer::start();
    let url = server.url();
    let registry = registry(&server);

    // The reporting thread gets stuck telling the first lost lease's loss.
    let first = registry
        .lock("first")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let victim = registry
        .lock("victim")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    del(&url, "lock:first").await;
    let thread = tokio::time::timeout(Duration::from_secs(10), stuck.recv())
        .await
        .expect("the first loss is told")
        .unwrap();
    assert_eq!(thread, "lock-runtime-report");
    lock_tests::eventually(Duration::from_secs(10), "the first loss", || async {
        first.is_lost()
    })
    .await;

    // Held leases renewed every 100 ms: the keeper has a report for each renewal, more than
    // the queue holds within a second.
    let mut flood = Vec::new();
    for i in 0..1000 {
        flood.push(
            registry
                .lock(format!("flood:{i}"))
                .ttl(Duration::from_millis(300))
                .acquire()
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // A lease lost now, found by the keeper on the I/O thread.
    del(&url, "lock:victim").await;
    lock_tests::eventually(Duration::from_secs(10), "the victim's loss", || async {
        victim.is_lost()
    })
    .await;
    let cycle = tokio::time::timeout(
        Duration::from_secs(2),
        registry.lock("after").run(async { Ok::<_, LockError>(()) }),
    )
    .await;
    let on_io = threads.on_io();
    assert!(
        on_io.is_empty() && cycle.is_ok(),
        "subscriber callbacks on the I/O thread: {on_io:?}; a lock cycle meanwhile: {cycle:?}"
    );
    threads.open();
    drop(flood);
}

/// A request refused with `shut_down` (its registry shut down while it waited, so it gives the
/// lock back when it would have taken it) held nothing: it shows no `lock.hold`.
#[tokio::test]
async fn a_request_refused_by_a_shutdown_shows_no_hold() {
    let (spans, _default) = subscriber();
    let server = RedisServer::start();
    let (holder, waiter) = (registry(&server), registry(&server));
    let held = holder.lock("closing").acquire().await.unwrap();
    let waiting = super::support::spawn_waiter(waiter.clone(), "closing");
    super::handoff::until_queued(&server.url(), "closing", 1).await;
    waiter.shutdown().await;
    held.release().await.unwrap();
    let refused = waiting.await.unwrap();
    assert!(
        matches!(refused, Err(LockError::ShutDown { .. })),
        "{refused:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let acquires = spans.named("lock.acquire", "closing");
    let holds = spans.named("lock.hold", "closing");
    assert_eq!(
        holds.len(),
        1,
        "one hold (the holder's) for one lease; the refused request's: {acquires:#?}\nholds: \
         {holds:#?}"
    );
}

/// Under `OnLost::Continue` the body runs on after the loss: the hold records its end when the
/// loss is found, and closes once the body that runs in it is done (guide::tracing).
#[tokio::test]
async fn a_hold_lost_under_continue_records_its_end_at_once_and_closes_after_the_body() {
    let (spans, _default) = subscriber();
    let server = RedisServer::start();
    let url = server.url();
    let holder = registry(&server);
    let probe = spans.clone();
    let during = holder
        .lock("continued")
        .ttl(Duration::from_millis(300))
        .on_lost(lock_runtime::OnLost::Continue)
        .run(async move {
            del(&url, "lock:continued").await;
            lock_tests::eventually(Duration::from_secs(10), "the loss recorded", || async {
                probe.named("lock.hold", "continued")[0]
                    .field("lock.end")
                    .is_some()
            })
            .await;
            Ok::<_, LockError>(probe.the("lock.hold", "continued"))
        })
        .await
        .unwrap();
    assert_eq!(during.field("lock.end"), Some("gone"));
    assert!(
        !during.closed,
        "open while the body runs in it: {during:#?}"
    );
    let after = spans.closed("lock.hold", "continued").await;
    assert_eq!(after.field("lock.end"), Some("gone"));
}

/// What held: modes' fields, a re-entered lock's missing spans, a backend error's fields.
#[tokio::test]
async fn fields_of_modes_reentry_and_backend_errors() {
    let (spans, _default) = subscriber();
    let mut server = RedisServer::start();
    let holder = registry(&server);
    let r = holder
        .lock("m:read")
        .mode(lock_runtime::Mode::Read)
        .acquire()
        .await
        .unwrap();
    let p = holder.lock("m:permits").permits(3).acquire().await.unwrap();
    assert_eq!(
        spans.the("lock.acquire", "m:read").field("lock.mode"),
        Some("read")
    );
    let permits = spans.the("lock.acquire", "m:permits");
    assert_eq!(permits.field("lock.mode"), Some("permits"));
    assert_eq!(permits.field("lock.permits"), Some("3"));
    r.release().await.unwrap();
    p.release().await.unwrap();

    let inner = holder.clone();
    holder
        .lock("m:reentered")
        .run(async move {
            inner
                .lock("m:reentered")
                .run(async { Ok::<_, LockError>(()) })
                .await?;
            let again = inner.lock("m:reentered").acquire().await?;
            assert!(again.is_reentrant());
            again.release().await
        })
        .await
        .unwrap();
    assert_eq!(spans.named("lock.acquire", "m:reentered").len(), 1);
    assert_eq!(spans.named("lock.hold", "m:reentered").len(), 1);
    let releases = spans
        .all()
        .into_iter()
        .filter(|s| s.name == "lock.release")
        .count();
    assert_eq!(releases, 3);

    server.kill();
    let failed = holder.lock("m:down").acquire().await;
    assert!(
        matches!(failed, Err(LockError::Backend { .. })),
        "{failed:?}"
    );
    let failed = spans.the("lock.acquire", "m:down");
    assert_eq!(failed.field("lock.outcome"), Some("error"), "{failed:#?}");
    assert_eq!(failed.field("error.type"), Some("backend"));
    assert_eq!(failed.field("otel.status_code"), Some("ERROR"));
    assert!(spans.named("lock.hold", "m:down").is_empty());
}
