use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::LockError;
use lock_tests::RedisServer;

use super::support::registry;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_over_several_connections_never_hold_one_key_together() {
    let server = RedisServer::start();
    // Four registries: four independent connection sets, like four replicas.
    let registries: Vec<_> = (0..4).map(|_| registry(&server)).collect();
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (i, reg) in registries.iter().cycle().take(16).enumerate() {
        let (reg, inside, max_inside, done) = (
            reg.clone(),
            inside.clone(),
            max_inside.clone(),
            done.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                reg.lock("shared")
                    .wait(Duration::from_secs(30))
                    .run(async {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        max_inside.fetch_max(now, Ordering::SeqCst);
                        // Let other tasks run while we hold the lock.
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        done.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, LockError>(())
                    })
                    .await
                    .unwrap_or_else(|e| panic!("task {i}: {e}"));
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(max_inside.load(Ordering::SeqCst), 1, "two holders at once");
    assert_eq!(done.load(Ordering::SeqCst), 160);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_strictly_increase_over_1000_contended_acquisitions() {
    let server = RedisServer::start();
    let registries: Vec<_> = (0..2).map(|_| registry(&server)).collect();
    let seen = Arc::new(Mutex::new(Vec::with_capacity(1000)));
    let mut tasks = Vec::new();
    for reg in registries.iter().cycle().take(8) {
        let (reg, seen) = (reg.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..125 {
                let guard = reg
                    .lock("fenced")
                    .fencing(true)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .expect("acquire");
                // Recorded while holding the lock, so the order of the log is the order of holders.
                seen.lock()
                    .unwrap()
                    .push(guard.fence().expect("fencing was asked for"));
                guard.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1000);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens must strictly increase in holder order"
    );
}

#[tokio::test]
async fn a_busy_lock_fails_fast_with_the_holders_remaining_lease() {
    let server = RedisServer::start();
    let (a, b) = (registry(&server), registry(&server));
    let held = a
        .lock("busy")
        .ttl(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let err = b.lock("busy").acquire().await.unwrap_err();
    match &err {
        LockError::Busy { key, retry_after } => {
            assert_eq!(key, "busy");
            let left = retry_after.expect("the holder's lock has a ttl");
            assert!(
                left <= Duration::from_secs(20) && left > Duration::ZERO,
                "{left:?}"
            );
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("`busy`") && message.contains("raise `wait`"),
        "{message}"
    );
    held.release().await.unwrap();
    b.lock("busy")
        .acquire()
        .await
        .expect("free after release")
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn the_wire_format_is_a_plain_string_with_a_random_token_and_px_expiry() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let guard = reg
        .lock("deploy:9")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let mut con = super::support::raw(&server.url()).await;
    let (kind, value, pttl): (String, String, i64) = redis::pipe()
        .cmd("TYPE")
        .arg("lock:deploy:9")
        .cmd("GET")
        .arg("lock:deploy:9")
        .cmd("PTTL")
        .arg("lock:deploy:9")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(kind, "string");
    assert_eq!(value, guard.token());
    assert!(pttl > 50_000 && pttl <= 60_000, "{pttl}");
    let random = value.rsplit(':').next().unwrap();
    assert_eq!(random.len(), 32, "128 random bits in hex");
    // A Python or Go service that takes the same key with SET NX excludes us.
    guard.release().await.unwrap();
    let foreign: Option<String> = redis::cmd("SET")
        .arg("lock:deploy:9")
        .arg("python-owner")
        .arg("NX")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(foreign.as_deref(), Some("OK"));
    assert!(reg.lock("deploy:9").acquire().await.unwrap_err().is_busy());
}
