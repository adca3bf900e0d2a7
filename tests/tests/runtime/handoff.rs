//! Direct handoff: a release hands the lock to the oldest live waiter in its own script, so the
//! waiter holds the lock when the notification arrives.

use std::time::Duration;

use lock_runtime::Registry;
use lock_tests::proxy::Proxy;
use lock_tests::RedisServer;
use redis::AsyncCommands;

use super::support::{eventually, patient_registry, raw, registry, spawn_waiter};

const LIMIT: Duration = Duration::from_secs(10);

/// How many waiters are queued for `key` (the registry's default prefix).
async fn queued(con: &mut redis::aio::MultiplexedConnection, key: &str) -> usize {
    con.zcard(format!("queue:{{lock:{key}}}")).await.unwrap()
}

/// Until `n` waiters are queued for `key`.
pub(super) async fn until_queued(url: &str, key: &str, n: usize) {
    let con = raw(url).await;
    eventually(LIMIT, &format!("{n} waiter(s) queued for {key}"), || {
        let mut con = con.clone();
        async move { queued(&mut con, key).await == n }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_waiters_first_come_first_served_with_rising_fences() {
    let server = RedisServer::start();
    let holder = registry(&server);
    let held = holder.lock("fifo").fencing(true).acquire().await.unwrap();
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 0..6 {
        // One registry each: six processes, as far as Redis can tell.
        let reg = registry(&server);
        let (done_tx, url) = (done_tx.clone(), server.url());
        waiters.push(tokio::spawn(async move {
            let guard = reg
                .lock("fifo")
                .fencing(true)
                .wait(Duration::from_secs(60))
                .acquire()
                .await
                .expect("every waiter gets its turn");
            // It holds the lock on the server the moment it returns.
            let on_server: Option<String> = raw(&url).await.get("lock:fifo").await.unwrap();
            // Marked as waited for while later waiters are queued.
            let value = if i < 5 {
                format!("{}+w", guard.token())
            } else {
                guard.token().to_owned()
            };
            assert_eq!(on_server, Some(value), "waiter {i}");
            done_tx.send((i, guard.fence().unwrap())).unwrap();
            guard.release().await.unwrap();
        }));
        // The queue itself shows the order of arrival.
        until_queued(&server.url(), "fifo", i + 1).await;
    }
    let mut last_fence = held.fence().unwrap();
    held.release().await.unwrap();
    for expected in 0..6 {
        let (i, fence) = done.recv().await.unwrap();
        assert_eq!(
            i, expected,
            "waiters are served in the order they queued up"
        );
        assert!(fence > last_fence, "fences rise with each handoff");
        last_fence = fence;
    }
    for w in waiters {
        w.await.unwrap();
    }
    let mut con = raw(&server.url()).await;
    assert_eq!(queued(&mut con, "fifo").await, 0);
    let left: Option<String> = con.get("lock:fifo").await.unwrap();
    assert_eq!(
        left, None,
        "the last release found nobody waiting and deleted the lock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_stopped_keeping_its_place_is_skipped_never_handed_the_lock() {
    let server = RedisServer::start();
    let holder = registry(&server);
    let held = holder.lock("skip").acquire().await.unwrap();
    // The first waiter reaches Redis through a proxy that will swallow everything: it can no
    // longer renew its place, as if its process had hung.
    let proxy = Proxy::start(server.port());
    let unreachable = patient_registry(&proxy.url());
    let first = tokio::spawn(async move {
        unreachable
            .lock("skip")
            .ttl(Duration::from_secs(2))
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    });
    until_queued(&server.url(), "skip", 1).await;
    proxy.blackhole();
    let mut con = raw(&server.url()).await;
    let stale: String = con
        .zrange::<_, Vec<String>>("queue:{lock:skip}", 0, 0)
        .await
        .unwrap()
        .remove(0);
    let second = spawn_waiter(registry(&server), "skip");
    until_queued(&server.url(), "skip", 2).await;
    // Its place lasts one ttl (2 s) from its last attempt, on the server's clock.
    eventually(LIMIT, "the first waiter's place to run out", || {
        let (mut con, stale) = (con.clone(), stale.clone());
        async move {
            // The second waiter's place keeps the queue's keys alive.
            let entry: String = con.hget("queued:{lock:skip}", &stale).await.unwrap();
            let deadline: u64 = entry.split(' ').next().unwrap().parse().unwrap();
            let (secs, micros): (u64, u64) =
                redis::cmd("TIME").query_async(&mut con).await.unwrap();
            deadline < secs * 1000 + micros / 1000
        }
    })
    .await;

    let live: Vec<String> = con.zrange("queue:{lock:skip}", 0, -1).await.unwrap();
    let live = live
        .into_iter()
        .find(|token| *token != stale)
        .expect("the live waiter is queued");
    held.release().await.unwrap();
    // The release itself handed the lock over, to the live waiter, past the stale place.
    let handed: Option<String> = con.get("lock:skip").await.unwrap();
    assert_eq!(
        handed.as_deref(),
        Some(live.as_str()),
        "the release handed the lock to the live waiter"
    );
    let guard = second
        .await
        .unwrap()
        .expect("the live waiter gets the lock");
    let on_server: Option<String> = con.get("lock:skip").await.unwrap();
    assert_eq!(on_server.as_deref(), Some(guard.token()));
    assert_ne!(guard.token(), stale);
    let place: Option<f64> = con.zscore("queue:{lock:skip}", &stale).await.unwrap();
    assert_eq!(place, None, "the stale waiter was dropped from the queue");
    assert!(!first.is_finished(), "the unreachable waiter still waits");
    first.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_or_are_cancelled_leave_the_queue() {
    let server = RedisServer::start();
    let (holder, waiters) = (registry(&server), registry(&server));
    let held = holder.lock("leave").acquire().await.unwrap();
    let impatient = waiters
        .lock("leave")
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(impatient.is_busy(), "{impatient:?}");
    let cancelled = spawn_waiter(waiters.clone(), "leave");
    until_queued(&server.url(), "leave", 1).await;
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    until_queued(&server.url(), "leave", 0).await;

    held.release().await.unwrap();
    let mut con = raw(&server.url()).await;
    let left: Option<String> = con.get("lock:leave").await.unwrap();
    assert_eq!(
        left, None,
        "nobody was left in the queue to hand the lock to"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_is_not_ours_still_excludes_and_its_expiry_goes_to_the_oldest_waiter() {
    let server = RedisServer::start();
    let mut con = raw(&server.url()).await;
    // Another language's client: `SET NX PX`, released by expiry, never announced.
    let _: () = redis::cmd("SET")
        .arg("lock:foreign")
        .arg("python-worker")
        .arg("NX")
        .arg("PX")
        .arg(500)
        .query_async(&mut con)
        .await
        .unwrap();
    let (a, b): (Registry, Registry) = (registry(&server), registry(&server));
    let first = spawn_waiter(a, "foreign");
    until_queued(&server.url(), "foreign", 1).await;
    let second = spawn_waiter(b, "foreign");
    until_queued(&server.url(), "foreign", 2).await;
    let owner: Option<String> = con.get("lock:foreign").await.unwrap();
    assert_eq!(owner.as_deref(), Some("python-worker"), "still excluded");
    let guard = first
        .await
        .unwrap()
        .expect("the oldest waiter takes it once it expired");
    let owner: Option<String> = con.get("lock:foreign").await.unwrap();
    assert_eq!(
        owner,
        Some(format!("{}+w", guard.token())),
        "the second still waits"
    );
    assert!(!second.is_finished());
    guard.release().await.unwrap();
    let guard = second.await.unwrap().expect("then the next");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn the_in_memory_store_hands_over_first_come_first_served_too() {
    let store = lock_runtime::MemoryStore::new();
    let replica = || {
        Registry::builder()
            .memory(store.clone())
            .build()
            .expect("an in-memory registry")
    };
    let held = replica()
        .lock("fifo")
        .fencing(true)
        .acquire()
        .await
        .unwrap();
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..5 {
        let (reg, done_tx) = (replica(), done_tx.clone());
        tokio::spawn(async move {
            let guard = reg
                .lock("fifo")
                .fencing(true)
                .wait(Duration::from_secs(60))
                .acquire()
                .await
                .unwrap();
            done_tx.send((i, guard.fence().unwrap())).unwrap();
            guard.release().await.unwrap();
        });
        // On this single-threaded runtime the new waiter runs until it parks (its attempts are
        // synchronous in memory), so it has queued before the next one starts.
        tokio::task::yield_now().await;
    }
    let mut last_fence = held.fence().unwrap();
    let inspector = replica();
    held.release().await.unwrap();
    // Handed over by the release itself, before any waiter ran again.
    let info = inspector.inspect("fifo").await.unwrap();
    assert!(info.owner.is_some(), "the lock went straight to a waiter");
    assert_eq!(
        info.fence,
        Some(last_fence + 1),
        "with a fencing token of its own"
    );
    for expected in 0..5 {
        let (i, fence) = done.recv().await.unwrap();
        assert_eq!(i, expected, "served in the order they queued up");
        assert!(fence > last_fence);
        last_fence = fence;
    }
}

/// The next line `waiter` prints, if one comes within `within`.
async fn next_line(
    waiter: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    within: Duration,
) -> Option<String> {
    tokio::time::timeout(within, waiter.next_line())
        .await
        .ok()
        .map(|line| {
            line.expect("read lock-waiter")
                .expect("lock-waiter ended early")
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_stopped_across_a_handoff_never_takes_the_lock_while_another_holds_it() {
    let server = RedisServer::start();
    let (first, other) = (registry(&server), registry(&server));
    let mut con = raw(&server.url()).await;
    for round in 0..20 {
        let key: &'static str = Box::leak(format!("stalled:{round}").into_boxed_str());
        let (mut child, pid, mut lines) = stopped_across_a_handoff(&server, &first, key).await;
        let theirs = other
            .lock(key)
            .ttl(Duration::from_secs(10))
            .acquire()
            .await
            .expect("free once the handed-over key ran out");
        lock_tests::signal(pid, "CONT");
        // Resumed with the stale handoff in hand and its retry timer overdue: it must go on
        // waiting while the other registry holds the lock.
        let early = next_line(&mut lines, Duration::from_millis(500)).await;
        assert_eq!(
            early, None,
            "round {round}: the resumed waiter returned while another registry held the lock"
        );
        theirs.release().await.unwrap();
        let line = next_line(&mut lines, LIMIT)
            .await
            .expect("the waiter gets the lock once the other registry released it");
        let token = line
            .strip_prefix("held ")
            .unwrap_or_else(|| panic!("{line}"));
        let on_server: Option<String> = con.get(format!("lock:{key}")).await.unwrap();
        assert_eq!(on_server.as_deref(), Some(token), "round {round}");
        drop(child.stdin.take());
        child.wait().await.unwrap();
    }
}

/// A waiter that died in the queue is handed the lock for no longer than its place had left: the
/// lock sits idle no longer than after a dead holder (one ttl), not the ttl its place had plus
/// a whole new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handed_to_a_dead_waiter_expires_with_that_waiters_place() {
    let server = RedisServer::start();
    let holder = registry(&server);
    let held = holder.lock("dead-waiter").acquire().await.unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_lock-waiter"))
        .args([&server.url(), "dead-waiter", "3000", "60000"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start lock-waiter");
    until_queued(&server.url(), "dead-waiter", 1).await;
    child.kill().unwrap();
    child.wait().unwrap();
    // Its place was last kept at most a third of the ttl (1 s) before the kill, and lasts 3 s
    // from there: 1.5 s after the kill it has between 0.5 and 1.5 s left.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    held.release().await.unwrap();
    let mut con = raw(&server.url()).await;
    let left: i64 = con.pttl("lock:dead-waiter").await.unwrap();
    assert!(
        (1..=1550).contains(&left),
        "the handed-over key expires in {left} ms, beyond the dead waiter's place"
    );
}

/// A holder whose own process has a waiter for its lock knows the lock is marked as waited
/// for: its release is the script that hands the lock over, with no `DELIFEQ` tried first
/// (which a marked lock refuses, costing the waiter a round trip).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_with_a_waiter_in_its_own_process_is_one_command() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let held = reg.lock("local").acquire().await.unwrap();
    let mut con = server.connection();
    let sent = |con: &mut redis::Connection, command: &str| {
        lock_tests::command_calls(con)
            .get(command)
            .copied()
            .unwrap_or(0)
    };
    let scripts = sent(&mut con, "evalsha");
    let waiter = reg.lock("local").wait(Duration::from_secs(60)).acquire();
    let waiter = tokio::spawn(waiter);
    // It tries (and queues up), subscribes, and tries again before it parks.
    eventually(LIMIT, "the waiter parked", || {
        let parked = sent(&mut con, "evalsha") - scripts >= 2;
        async move { parked }
    })
    .await;
    let before = (sent(&mut con, "evalsha"), sent(&mut con, "delifeq"));
    held.release().await.unwrap();
    let guard = waiter.await.unwrap().expect("the waiter gets the lock");
    let after = (sent(&mut con, "evalsha"), sent(&mut con, "delifeq"));
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1, 0),
        "(release scripts, DELIFEQs) for one handoff"
    );
    guard.release().await.unwrap();
}

/// A handed-over lease runs from the sending of the attempt that kept the waiter's place (the
/// handed key expires with that place), not from the notification: a waiter that heard of the
/// handoff slowly sees its lease over before anyone else can take the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowly_heard_handoffs_lease_is_over_before_another_can_take_the_key() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let (holder, other) = (registry(&server), registry(&server));
    let slow = patient_registry(&proxy.url());
    lock_tests::warm_up(&slow).await;
    let held = holder.lock("slow-handoff").acquire().await.unwrap();
    // Each message and reply reaches the waiter 150 ms after the server sent it: far more than
    // a 6 s lease's drift, far less than the lease.
    proxy.set_latency(Duration::from_millis(150));
    let waiter = tokio::spawn(async move {
        slow.lock("slow-handoff")
            .ttl(Duration::from_secs(6))
            .renew(false)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    // Its second attempt (the one right after it subscribed) kept its place; the next comes a
    // third of the ttl after it, so the waiter waits for the handoff with no attempt on its way.
    let con = raw(&server.url()).await;
    eventually(LIMIT, "the waiter's second attempt kept its place", || {
        let mut con = con.clone();
        async move {
            let places: Vec<String> = con.hvals("queued:{lock:slow-handoff}").await.unwrap();
            places.iter().any(|place| place.ends_with(" 2"))
        }
    })
    .await;
    held.release().await.unwrap();
    let handed = waiter.await.unwrap().expect("handed the lock");
    let second = other
        .lock("slow-handoff")
        .wait(Duration::from_secs(30))
        .acquire()
        .await
        .expect("the handed key runs out on the server");
    assert!(
        handed.is_lost(),
        "another registry holds the key while the handed lease still holds"
    );
    second.release().await.unwrap();
}

/// A handoff heard only after its lease ran out (the waiter's process was stopped across it, and
/// nobody took the key meanwhile) is not taken as held: the waiter tries again, and holds the
/// key on the server when it says it holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_heard_after_its_lease_ran_out_is_never_taken_as_held() {
    let server = RedisServer::start();
    let holder = registry(&server);
    let mut con = raw(&server.url()).await;
    // Whether the waiter hears the handoff or its overdue timer first is up to its runtime:
    // enough rounds to hear it first in some.
    for round in 0..30 {
        let key: &'static str = Box::leak(format!("late-handoff:{round}").into_boxed_str());
        let (mut child, pid, mut lines) = stopped_across_a_handoff(&server, &holder, key).await;
        lock_tests::signal(pid, "CONT");
        let line = next_line(&mut lines, LIMIT)
            .await
            .expect("the waiter takes the free lock");
        let token = line
            .strip_prefix("held ")
            .unwrap_or_else(|| panic!("{line}"));
        let on_server: Option<String> = con.get(format!("lock:{key}")).await.unwrap();
        assert_eq!(
            on_server.as_deref(),
            Some(token),
            "round {round}: the waiter said it held a lock the server does not give it"
        );
        drop(child.stdin.take());
        child.wait().await.unwrap();
    }
}

/// A `lock-waiter` process queued for `key`, which `holder` held: stopped in the queue, so the
/// release hands it the lock, which it cannot hear of, and the handed key runs out unrenewed
/// while it sleeps. Returns the process, its pid and its output's lines.
async fn stopped_across_a_handoff(
    server: &RedisServer,
    holder: &lock_runtime::Registry,
    key: &'static str,
) -> (
    tokio::process::Child,
    u32,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    use tokio::io::AsyncBufReadExt;
    let held = holder.lock(key).acquire().await.unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lock-waiter"))
        .args([&server.url(), key, "400", "20000"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start lock-waiter");
    let pid = child.id().expect("running");
    let lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    until_queued(&server.url(), key, 1).await;
    lock_tests::signal(pid, "STOP");
    held.release().await.unwrap();
    let con = raw(&server.url()).await;
    eventually(LIMIT, "the handed-over key to run out", || {
        let mut con = con.clone();
        async move { !con.exists::<_, bool>(format!("lock:{key}")).await.unwrap() }
    })
    .await;
    (child, pid, lines)
}
