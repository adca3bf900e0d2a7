//! One registry used from several Tokio runtimes, as every test suite with more than one
//! `#[tokio::test]` does: its connections, lease keeper and subscriber must not die with the
//! runtime that happened to use it first.
//!
//! Its own test binary: these tests install the process-wide default registry.

use std::time::Duration;

use lock_runtime::{distributed_lock, LockError, Registry};
use lock_tests::{raw, RedisServer};
use redis::AsyncCommands;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[distributed_lock(key = "deploy:<id>", ttl = "1s")]
async fn deploy(id: u64, url: &str, hold: Duration) -> Result<(), LockError> {
    tokio::time::sleep(hold).await;
    // After 3.5 lease lengths the key is still ours on the server only if it was renewed.
    let mut con = raw(url).await;
    let owner: Option<String> = con.get(format!("lock:deploy:{id}")).await.unwrap();
    let current = lock_runtime::current().expect("inside a guarded body");
    assert_eq!(
        owner.as_deref(),
        Some(current.token()),
        "renewed by its owner"
    );
    assert!(!current.is_lost(), "the lease is not lost");
    Ok(())
}

#[test]
fn the_default_registry_serves_a_second_runtime_after_the_first_is_gone() {
    let server = RedisServer::start();
    Registry::from_url(&server.url())
        .expect("registry")
        .install_default();
    let url = server.url();

    // Runtime A connects, starts the keeper and releases; then it is dropped.
    runtime()
        .block_on(deploy(1, &url, Duration::ZERO))
        .expect("first runtime");

    // Runtime B: a 1 s lease held for 3.5 s must be renewed, then released.
    let b = runtime();
    b.block_on(deploy(2, &url, Duration::from_millis(3500)))
        .expect("a lease taken in the second runtime is renewed");
    b.block_on(async {
        let mut con = raw(&url).await;
        let left: Option<String> = con.get("lock:deploy:2").await.unwrap();
        assert_eq!(left, None, "released at the end of the body");
        assert!(lock_runtime::registry().unwrap().held().is_empty());
    });
}

/// A holder with a `ttl` lease and a waiter with a `wait` budget on `job`: the waiter gets the
/// lock once the holder releases.
async fn hand_over(registry: &Registry, url: &str, ttl: Duration, wait: Duration) {
    let held = registry.lock("job").ttl(ttl).acquire().await.unwrap();
    let waiter = registry.clone();
    let waiting = tokio::spawn(async move { waiter.lock("job").wait(wait).acquire().await });
    lock_tests::eventually(Duration::from_secs(10), "waiter subscribed", || async {
        lock_tests::subscribers(url, "lock:job").await == 1
    })
    .await;
    held.release().await.unwrap();
    let got = waiting.await.unwrap().expect("woken by the release");
    got.release().await.unwrap();
}

#[test]
fn a_waiter_in_a_second_runtime_is_woken_by_a_release_notification() {
    let server = RedisServer::start();
    let registry = Registry::from_url(&server.url()).expect("registry");
    // Runtime A starts the subscriber by waiting once.
    runtime().block_on(hand_over(
        &registry,
        &server.url(),
        Duration::from_secs(30),
        Duration::from_secs(10),
    ));
    // Runtime B: the holder's lease (60 s) outlives the waiter's budget (20 s), so the waiter
    // gets the lock only if the release notification reaches it.
    runtime().block_on(hand_over(
        &registry,
        &server.url(),
        Duration::from_secs(60),
        Duration::from_secs(20),
    ));
}

#[test]
fn a_registry_serves_a_runtime_while_the_one_that_first_used_it_is_idle() {
    let server = RedisServer::start();
    let registry = Registry::builder()
        .url(server.url())
        .command_timeout(Duration::from_secs(5))
        .build()
        .expect("registry");
    // Runtime A makes the connection, then stays alive but is never driven again (a
    // current-thread runtime runs its tasks only inside `block_on`).
    let a = runtime();
    a.block_on(lock_tests::warm_up(&registry));

    runtime().block_on(async {
        let guard = registry
            .lock("k")
            .acquire()
            .await
            .expect("served while the first runtime idles");
        guard.release().await.unwrap();
    });
    drop(a);
}

#[test]
fn an_in_memory_registry_renews_in_a_second_runtime_after_the_first_is_gone() {
    let registry = Registry::in_memory();
    runtime().block_on(async {
        let guard = registry.lock("job").acquire().await.unwrap();
        guard.release().await.unwrap();
    });

    runtime().block_on(async {
        let ttl = lock_tests::RENEWED_TTL;
        let guard = registry.lock("job").ttl(ttl).acquire().await.unwrap();
        tokio::time::sleep(ttl * 2).await;
        assert!(!guard.is_lost(), "renewed by a keeper on this runtime");
        let info = registry.inspect("job").await.unwrap();
        assert_eq!(info.owner.as_deref(), Some(guard.token()));
        guard.release().await.unwrap();
    });
}

/// Callers send straight into the registry's connection from their own runtime; a connection
/// that breaks while one of them uses it is made again on the library's I/O thread, never on
/// that runtime: once the runtime that saw the break is gone, the next one still gets a lock
/// at its first attempt.
#[test]
fn a_connection_remade_while_one_runtime_used_it_outlives_that_runtime() {
    let server = RedisServer::start();
    let registry = Registry::from_url(&server.url()).expect("registry");
    let first = runtime();
    first.block_on(async {
        let guard = registry.lock("k").acquire().await.expect("connected");
        guard.release().await.expect("released");
    });
    // The registry's connection is cut (the killing connection itself is skipped).
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query(&mut server.connection())
        .expect("CLIENT KILL");
    assert!(killed >= 1, "the registry's connection was cut");
    // The first runtime's next acquisition meets the cut connection, and a new one is made
    // while it waits and retries.
    first.block_on(async {
        let guard = registry
            .lock("k")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .expect("taken on a new connection");
        guard.release().await.expect("released");
    });
    drop(first);
    runtime().block_on(async {
        let guard = registry
            .lock("k")
            .acquire()
            .await
            .expect("the new connection outlived the runtime that made the request");
        guard.release().await.expect("released");
    });
}
