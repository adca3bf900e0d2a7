use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockError, LostReason, Registry};
use lock_tests::RedisServer;

fn nodes(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn registry(nodes: &[RedisServer]) -> Registry {
    Registry::builder()
        .redlock(nodes.iter().map(RedisServer::url))
        .connect_timeout(Duration::from_millis(300))
        .command_timeout(Duration::from_millis(300))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_lock_is_held_on_a_quorum_and_released_on_every_node() {
    let nodes = nodes(3);
    let (a, b) = (registry(&nodes), registry(&nodes));
    assert!(a.node().starts_with("redlock(127.0.0.1:"), "{}", a.node());
    let guard = a.lock("job").acquire().await.unwrap();
    for node in &nodes {
        let value: Option<String> = redis::cmd("GET")
            .arg("lock:job")
            .query(&mut node.connection())
            .unwrap();
        assert_eq!(value.as_deref(), Some(guard.token()));
    }
    assert!(b.lock("job").acquire().await.unwrap_err().is_busy());
    guard.release().await.unwrap();
    for node in &nodes {
        let exists: bool = redis::cmd("EXISTS")
            .arg("lock:job")
            .query(&mut node.connection())
            .unwrap();
        assert!(!exists);
    }
}

#[tokio::test]
async fn fencing_is_refused_on_redlock_with_the_reason() {
    let nodes = nodes(3);
    let err = registry(&nodes)
        .lock("job")
        .fencing(true)
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOptions { .. }), "{err:?}");
    assert!(err.to_string().contains("only look"), "{err}");
}

#[tokio::test]
async fn a_killed_or_paused_minority_does_not_stop_acquisition() {
    let mut nodes = nodes(3);
    let reg = registry(&nodes);
    nodes[0].kill();
    reg.lock("a")
        .acquire()
        .await
        .expect("2 of 3")
        .release()
        .await
        .unwrap();
    nodes[1].pause();
    let err = reg.lock("b").acquire().await.unwrap_err();
    nodes[1].resume();
    match err {
        LockError::Backend { node, message, .. } => {
            assert!(node.starts_with("redlock("), "{node}");
            assert!(message.contains("a quorum is 2"), "{message}");
        }
        other => panic!("a majority down must be a clean backend error: {other:?}"),
    }
    let mut paused_one = self::nodes(3);
    let reg = registry(&paused_one);
    paused_one[2].pause();
    let guard = reg
        .lock("c")
        .acquire()
        .await
        .expect("2 of 3 while one is paused");
    paused_one[2].resume();
    guard.release().await.unwrap();
    paused_one[0].kill();
}

#[tokio::test]
async fn a_majority_down_fails_cleanly_within_wait() {
    let mut nodes = nodes(3);
    let reg = registry(&nodes);
    nodes[0].kill();
    nodes[1].kill();
    let outcome = tokio::time::timeout(
        Duration::from_secs(30),
        reg.lock("k").wait(Duration::from_secs(1)).acquire(),
    )
    .await
    .expect("bounded by `wait`, never hangs");
    let err = outcome.unwrap_err();
    assert!(
        err.to_string().contains("only 1 of 3 nodes answered"),
        "{err}"
    );
    let survivor: Option<String> = redis::cmd("GET")
        .arg("lock:k")
        .query(&mut nodes[2].connection())
        .unwrap();
    assert_eq!(
        survivor, None,
        "the failed attempt was undone on the node that granted it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_registries_never_both_hold_while_nodes_fail_and_return() {
    let mut nodes = nodes(3);
    let regs = [registry(&nodes), registry(&nodes)];
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let reg = regs[i % 2].clone();
        let (inside, max_inside, done) = (inside.clone(), max_inside.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while done.load(Ordering::SeqCst) < 120 {
                let outcome = reg
                    .lock("contended")
                    .ttl(Duration::from_millis(600))
                    .wait(Duration::from_secs(5))
                    .run(async {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        max_inside.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, LockError>(())
                    })
                    .await;
                if outcome.is_ok() {
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    // One node at a time fails; it returns only after the longest lease (600 ms) has passed,
    // the restart delay Redlock needs without persistence.
    for round in 0..4 {
        let victim = round % 3;
        tokio::time::sleep(Duration::from_millis(150)).await;
        nodes[victim].kill();
        tokio::time::sleep(Duration::from_millis(700)).await;
        nodes[victim].restart();
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(max_inside.load(Ordering::SeqCst), 1, "two holders at once");
    assert!(done.load(Ordering::SeqCst) >= 120);
}

#[tokio::test]
async fn a_holder_learns_it_lost_when_a_majority_restarts_without_persistence() {
    let mut nodes = nodes(3);
    let (a, b) = (registry(&nodes), registry(&nodes));
    let guard = a
        .lock("amnesia")
        .ttl(Duration::from_millis(900))
        .acquire()
        .await
        .unwrap();
    // Two masters come back empty at once: the documented unsafe case. Another client can now
    // take a quorum, and the old holder learns at its next renewal (within ttl/3).
    nodes[0].restart();
    nodes[1].restart();
    let taken = b
        .lock("amnesia")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let err = guard.lost().await;
    assert!(
        matches!(
            err,
            LockError::Lost {
                reason: LostReason::Stolen,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!taken.is_lost());
}
