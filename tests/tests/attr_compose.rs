//! `#[distributed_lock]` together with `#[tracing::instrument]` and `#[async_trait]`.
//!
//! - `#[tracing::instrument]` works above or below the attribute on an `async fn`.
//! - With `#[async_trait]` (on the impl or trait) the attribute goes on the method as usual:
//!   async-trait runs first and the attribute recognises its `Box::pin(async move { .. })`.
//!   `#[tracing::instrument]` goes above or below it there too, and destructured parameters
//!   can be used in the key.
//!
//! The in-memory registry is enough here: what is pinned is how the attributes compose.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lock_runtime::{current, distributed_lock, LockError, Registry};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::DefaultGuard;
use tracing::{Event, Metadata, Subscriber};

const REGISTRY: &str = "attr_compose";

/// The key of the innermost lock, and the names of the spans the body runs in, outermost first.
fn observed() -> (String, Vec<&'static str>) {
    let key = current().expect("inside a guarded body").key().to_owned();
    let spans = tracing::dispatcher::get_default(|dispatch| {
        dispatch
            .downcast_ref::<SpanStack>()
            .map(SpanStack::entered)
            .unwrap_or_default()
    });
    (key, spans)
}

/// The body ran inside both the instrumented function's span and its lock's `lock.hold`.
fn inside_both(spans: &[&str], instrumented: &str) {
    assert!(
        spans.contains(&instrumented) && spans.contains(&"lock.hold"),
        "{spans:?}"
    );
}

#[tracing::instrument]
#[distributed_lock(key = "instrumented:<id>", registry = "attr_compose")]
async fn instrument_above(id: u64) -> Result<(String, Vec<&'static str>), LockError> {
    Ok(observed())
}

#[distributed_lock(key = "instrumented:<id>", registry = "attr_compose")]
#[tracing::instrument]
async fn instrument_below(id: u64) -> Result<(String, Vec<&'static str>), LockError> {
    Ok(observed())
}

#[async_trait]
trait Deploy {
    async fn deploy(&self, id: u64) -> Result<(String, Vec<&'static str>), LockError>;

    async fn rollback(&self, id: u64) -> Result<String, LockError>;

    async fn audit(&self, id: u64) -> Result<(String, Vec<&'static str>), LockError>;

    #[distributed_lock(key = "default:<id>", registry = "attr_compose")]
    async fn default_method(&self, id: u64) -> Result<String, LockError> {
        Ok(observed().0)
    }
}

struct Service {
    region: String,
}

#[async_trait]
impl Deploy for Service {
    #[tracing::instrument(skip(self))]
    #[distributed_lock(key = "deploy:<self.region>:<id>", registry = "attr_compose")]
    async fn deploy(&self, id: u64) -> Result<(String, Vec<&'static str>), LockError> {
        Ok(observed())
    }

    #[distributed_lock(key = "audit:<self.region>:<id>", registry = "attr_compose")]
    #[tracing::instrument(skip(self))]
    async fn audit(&self, id: u64) -> Result<(String, Vec<&'static str>), LockError> {
        Ok(observed())
    }

    #[distributed_lock(key = "rollback:<self.region>:<id>", registry = "attr_compose")]
    async fn rollback(&self, id: u64) -> Result<String, LockError> {
        if id == 0 {
            return Err(LockError::NotConfigured { registry: None });
        }
        Ok(observed().0)
    }
}

#[async_trait(?Send)]
trait LocalJob {
    async fn run(self: Box<Self>, (a, b): (u8, u8)) -> Result<String, LockError>;
}

struct Local;

#[async_trait(?Send)]
impl LocalJob for Local {
    #[distributed_lock(key = "local:<a>:<b>", registry = "attr_compose")]
    async fn run(self: Box<Self>, (a, b): (u8, u8)) -> Result<String, LockError> {
        Ok(format!("{} {}", observed().0, a + b))
    }
}

#[tokio::test]
async fn instrument_above_the_attribute_spans_the_locked_body() {
    let _tracing = SpanStack::install();
    Registry::in_memory().install_as(REGISTRY);
    let (key, spans) = instrument_above(1).await.expect("locked");
    assert_eq!(key, "instrumented:1");
    // The lock outside, the instrumented function's span inside it.
    assert_eq!(spans, ["lock.hold", "instrument_above"]);
}

#[tokio::test]
async fn instrument_below_the_attribute_spans_the_locked_body() {
    let _tracing = SpanStack::install();
    Registry::in_memory().install_as(REGISTRY);
    let (key, spans) = instrument_below(2).await.expect("locked");
    assert_eq!(key, "instrumented:2");
    // The instrumented function's span outside, its lock's hold (under it) inside.
    assert_eq!(spans, ["instrument_below", "lock.hold"]);
}

#[tokio::test]
async fn async_trait_methods_run_under_their_lock() {
    let _tracing = SpanStack::install();
    Registry::in_memory().install_as(REGISTRY);
    let service = Service {
        region: "eu:west".into(),
    };
    let (key, spans) = service.deploy(7).await.expect("locked");
    assert_eq!(key, "deploy:eu%3Awest:7");
    inside_both(&spans, "deploy");
    let (key, spans) = service.audit(8).await.expect("locked");
    assert_eq!(key, "audit:eu%3Awest:8");
    inside_both(&spans, "audit");
    assert_eq!(
        service.rollback(3).await.expect("locked"),
        "rollback:eu%3Awest:3"
    );
    assert!(matches!(
        service.rollback(0).await,
        Err(LockError::NotConfigured { .. })
    ));
    assert_eq!(
        service.default_method(5).await.expect("locked"),
        "default:5"
    );
}

#[tokio::test]
async fn async_trait_futures_stay_send() {
    // Every test here has the subscriber: a callsite first reached on a thread without one,
    // while another thread installs its own, can keep an interest of `never` (tracing-core
    // computes it from the dispatchers that existed then), and the spans it makes go unseen.
    let _tracing = SpanStack::install();
    Registry::in_memory().install_as(REGISTRY);
    let service: Arc<dyn Deploy + Send + Sync> = Arc::new(Service {
        region: "us".into(),
    });
    let task = tokio::spawn(async move { service.rollback(9).await });
    assert_eq!(task.await.expect("task").expect("locked"), "rollback:us:9");
}

#[tokio::test]
async fn async_trait_without_send_and_with_destructured_parameters() {
    let _tracing = SpanStack::install();
    Registry::in_memory().install_as(REGISTRY);
    let job: Box<dyn LocalJob> = Box::new(Local);
    assert_eq!(job.run((2, 3)).await.expect("locked"), "local:2:3 5");
}

/// Just enough of a subscriber to name the spans a body runs in.
#[derive(Default)]
struct SpanStack {
    spans: Mutex<Vec<&'static Metadata<'static>>>,
    entered: Mutex<Vec<Id>>,
}

impl SpanStack {
    /// Installs a fresh one for this thread (the tests use current-thread runtimes).
    fn install() -> DefaultGuard {
        tracing::subscriber::set_default(SpanStack::default())
    }

    fn entered(&self) -> Vec<&'static str> {
        let entered = self.entered.lock().expect("not poisoned");
        let spans = self.spans.lock().expect("not poisoned");
        entered
            .iter()
            .map(|id| spans[usize::try_from(id.into_u64() - 1).expect("small ids")].name())
            .collect()
    }
}

impl Subscriber for SpanStack {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut spans = self.spans.lock().expect("not poisoned");
        spans.push(span.metadata());
        Id::from_u64(spans.len() as u64)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, span: &Id) {
        self.entered
            .lock()
            .expect("not poisoned")
            .push(span.clone());
    }

    fn exit(&self, span: &Id) {
        let mut entered = self.entered.lock().expect("not poisoned");
        if let Some(at) = entered.iter().rposition(|id| id == span) {
            entered.remove(at);
        }
    }
}
