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
    assert_eq!(waited.field("lock.handed_over"), Some("true"), "{waited:?}");
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
