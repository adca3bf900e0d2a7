//! Releases of locks nobody holds any more (a dropped guard's, a cancelled acquisition's) as
//! the registry, the runtime or the server goes: none may leave a lock held by nobody until its
//! ttl, and none may be sent for an attempt that reached no server. The in-memory store runs a
//! registry's background work on its caller's runtime, which a test's end drops.
//!
//! Each test builds its runtimes by hand, as `#[tokio::test]` does for each test: a
//! current-thread runtime that runs `block_on` once and is dropped.

use std::time::Duration;

use lock_runtime::{MemoryStore, Registry};

/// A lease no test waits out.
const LONG: Duration = Duration::from_secs(60);
/// What the next caller waits: far beyond any background release, far below `LONG`.
const NEXT_WAIT: Duration = Duration::from_secs(3);

/// A fresh runtime, as `#[tokio::test]` makes for each test.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn on(store: &MemoryStore) -> Registry {
    Registry::builder().memory(store.clone()).build().unwrap()
}

/// Another replica on the same store (as a second test on a process-wide store would) asks for
/// `key`, waiting a few seconds: it should get it, not find it held by nobody for a minute.
fn next_caller_gets(store: &MemoryStore, key: &str, why: &str) {
    runtime().block_on(async {
        let next = on(store);
        let got = next.lock(key).ttl(LONG).wait(NEXT_WAIT).acquire().await;
        let info = next.inspect(key).await.unwrap();
        assert!(
            got.is_ok(),
            "{why}: the lock is still held (owner {:?}, {:?} left) by nobody: {got:?}",
            info.owner,
            info.remaining
        );
    });
}

/// 146e1cc on the in-memory store: the guard and then the registry go at the end of the
/// runtime's main future (the end of a `#[tokio::test]`). The keeper's drop spawns the release
/// on that runtime, which is dropped before running it.
#[test]
fn a_guard_dropped_with_its_in_memory_registry_as_the_runtime_ends_is_released() {
    let store = MemoryStore::new();
    runtime().block_on(async {
        let registry = on(&store);
        let _guard = registry
            .lock("end-of-block")
            .ttl(LONG)
            .acquire()
            .await
            .unwrap();
        // The guard goes first, then the registry, as at the end of this block.
    });
    next_caller_gets(
        &store,
        "end-of-block",
        "guard and registry dropped at the end of block_on",
    );
}

/// 146e1cc on the in-memory store: a task holding a guard and its registry's last handle is
/// dropped by its runtime's shutdown; the keeper's drop spawns onto the runtime shutting down.
#[test]
fn a_guard_and_its_in_memory_registry_dropped_by_a_runtime_shutdown_are_released() {
    let store = MemoryStore::new();
    let rt = runtime();
    let (held_tx, held) = tokio::sync::oneshot::channel();
    let task_store = store.clone();
    rt.spawn(async move {
        let registry = on(&task_store);
        let guard = registry.lock("shutdown").ttl(LONG).acquire().await.unwrap();
        held_tx.send(()).unwrap();
        std::future::pending::<()>().await;
        drop((guard, registry));
    });
    rt.block_on(held).unwrap();
    drop(rt);
    next_caller_gets(
        &store,
        "shutdown",
        "task with guard and registry dropped by runtime shutdown",
    );
}

/// 7d5ac56's path on the in-memory store: a queued waiter is handed the lock, then its
/// acquisition is dropped by its runtime's shutdown before it woke. Its `LetGo` spawns the
/// release on the runtime shutting down.
#[test]
fn a_handed_over_lock_whose_waiter_dies_with_its_runtime_is_let_go() {
    let store = MemoryStore::new();
    let main = runtime();
    let holder = on(&store);
    let guard = main
        .block_on(holder.lock("handed").ttl(LONG).acquire())
        .unwrap();
    let waiters = runtime();
    let waiter = on(&store);
    let _waiting = waiters.spawn(waiter.lock("handed").ttl(LONG).wait(LONG).acquire());
    waiters.block_on(async {
        for _ in 0..500 {
            if holder.inspect("handed").await.unwrap().waiters == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the waiter never queued");
    });
    // Handed to the waiter, which is not running now.
    main.block_on(guard.release()).unwrap();
    drop(waiters);
    drop(main);
    next_caller_gets(
        &store,
        "handed",
        "handed-over lock whose waiter died with its runtime",
    );
}

/// Not from these changes, the same family: a registry that lives on, whose guard was dropped
/// after the runtime its keeper ran on was gone. The keeper restarts only on the next `hold`,
/// so the registry's own next request for that key waits out the ttl.
#[test]
fn a_guard_that_outlived_its_runtime_is_released_before_the_registrys_next_request() {
    let store = MemoryStore::new();
    let registry = on(&store);
    let first = runtime();
    let guard = first
        .block_on(registry.lock("outlived").ttl(LONG).acquire())
        .unwrap();
    drop(first);
    runtime().block_on(async {
        drop(guard);
        let got = registry
            .lock("outlived")
            .ttl(LONG)
            .wait(NEXT_WAIT)
            .acquire()
            .await;
        let info = registry.inspect("outlived").await.unwrap();
        assert!(
            got.is_ok(),
            "the dropped guard's lock is still held (owner {:?}, {:?} left): {got:?}",
            info.owner,
            info.remaining
        );
    });
}

/// Control: the same end of a runtime, but the registry's last handle goes outside every
/// runtime (the keeper's drop then runs the release in place): released. Shows the checks
/// above can pass.
#[test]
fn control_a_guard_dropped_in_a_runtime_whose_registry_goes_outside_it_is_released() {
    let store = MemoryStore::new();
    let registry = on(&store);
    runtime().block_on(async {
        let _guard = registry.lock("control").ttl(LONG).acquire().await.unwrap();
    });
    drop(registry);
    next_caller_gets(&store, "control", "control");
}

/// Try-locks refused while their server is down reached no server: no release follows them,
/// neither at once nor retried once the server is back. Only the attempt that met the
/// connection as the server died may have reached it (its bytes were written), and its release
/// is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_locks_refused_while_the_server_is_down_leave_no_release_retries_behind() {
    const TRIES: usize = 20;
    let mut server = lock_tests::RedisServer::start();
    let registry = super::support::registry(&server);
    lock_tests::warm_up(&registry).await;
    server.kill();
    for i in 0..TRIES {
        let got = registry
            .lock(format!("down:{i}"))
            .ttl(Duration::from_secs(3600))
            .acquire()
            .await;
        assert!(got.is_err(), "the server is down: {got:?}");
    }
    server.restart();
    // Nothing to wait for: retries would come within the backoff's longest pause (1 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut con = server.connection();
    let calls = lock_tests::command_calls(&mut con);
    let scripts: u64 = ["evalsha", "eval", "fcall", "fcall_ro"]
        .iter()
        .filter_map(|c| calls.get(*c))
        .sum();
    assert!(
        scripts <= 1,
        "{scripts} script calls reached the restarted server for {TRIES} try-locks that never \
         reached it (commands: {calls:?})"
    );
}
