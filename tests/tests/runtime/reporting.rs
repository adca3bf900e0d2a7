//! What the library tells the application from its I/O thread (`tracing` events, metrics) is
//! told from a thread of its own: the application's subscriber or recorder, however slow,
//! never holds up the connections every lock of the process shares.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use lock_runtime::LockError;
use lock_tests::RedisServer;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// A subscriber whose every event on one of the library's threads waits until the gate
/// opens, and says when the first one began waiting.
struct Stuck {
    gate: Arc<(Mutex<bool>, Condvar)>,
    stuck: Mutex<Option<tokio::sync::oneshot::Sender<String>>>,
}

impl Subscriber for Stuck {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        if !thread.starts_with("lock-runtime") {
            return;
        }
        if let Some(stuck) = self.stuck.lock().unwrap().take() {
            drop(stuck.send(thread));
        }
        let (open, opened) = &*self.gate;
        let mut open = open.lock().unwrap();
        while !*open {
            open = opened.wait(open).unwrap();
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Opens the gate however the test ends: the reporting thread is the whole process's.
struct Opens(Arc<(Mutex<bool>, Condvar)>);

impl Drop for Opens {
    fn drop(&mut self) {
        *self
            .0
             .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        self.0 .1.notify_all();
    }
}

#[tokio::test]
async fn a_subscriber_stuck_in_an_event_holds_up_no_lock() {
    let server = RedisServer::start();
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let _opens = Opens(gate.clone());
    let (stuck, first) = tokio::sync::oneshot::channel();
    let _default = tracing::subscriber::set_default(Stuck {
        gate,
        stuck: Mutex::new(Some(stuck)),
    });
    let registry = super::support::patient_registry(&server.url());
    // Renewed by the keeper every 100 ms, which tells the subscriber each time.
    let held = registry
        .lock("renewed")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let thread = first.await.expect("the keeper tells of its renewals");
    assert_eq!(
        thread, "lock-runtime-report",
        "where the library's events are told"
    );
    // With the subscriber stuck, locks are taken and released, and the held one stays renewed.
    let cycles = async {
        for i in 0..20 {
            registry
                .lock(format!("meanwhile:{i}"))
                .run(async { Ok::<_, LockError>(()) })
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
    };
    tokio::time::timeout(Duration::from_secs(30), cycles)
        .await
        .expect("locks go on while the application's subscriber is stuck");
    assert!(!held.is_lost(), "a lease kept through two ttls");
    held.release().await.unwrap();
}
