//! What `#[distributed_lock]` does at run time, against real `redis-server` processes.
//!
//! Each test starts its own server and installs a registry under its own name, which its
//! annotated fns name with `registry = ".."`, so tests never share a registry or a server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{current, distributed_lock, LockError, Registry};
use lock_tests::{raw, RedisServer};
use redis::AsyncCommands;
use tokio::sync::{mpsc, oneshot};

/// A user's error type: lock failures arrive as `Lock`.
#[derive(Debug)]
enum JobError {
    Lock(LockError),
    Failed,
}

impl From<LockError> for JobError {
    fn from(error: LockError) -> Self {
        JobError::Lock(error)
    }
}

fn install(server: &RedisServer, name: &str) {
    Registry::from_url(&server.url())
        .expect("registry")
        .install_as(name);
}

/// Holds the lock until `release` fires, telling `held` once inside.
async fn hold_until(
    held: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
) -> Result<(), JobError> {
    held.send(()).expect("test is listening");
    release.await.expect("test releases");
    Ok(())
}

#[distributed_lock(key = "exclusion", wait = "30s", registry = "attr_exclusion")]
async fn exclusive_step(inside: Arc<AtomicUsize>, runs: Arc<AtomicUsize>) -> Result<(), JobError> {
    assert_eq!(
        inside.fetch_add(1, Ordering::SeqCst),
        0,
        "two holders at once"
    );
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    runs.fetch_add(1, Ordering::SeqCst);
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_never_hold_the_same_key_at_once() {
    let server = RedisServer::start();
    install(&server, "attr_exclusion");
    let inside = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (inside, runs) = (inside.clone(), runs.clone());
            tokio::spawn(async move {
                for _ in 0..3 {
                    exclusive_step(inside.clone(), runs.clone())
                        .await
                        .expect("acquired within wait");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("no holder saw another");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 24);
}

#[distributed_lock(key = "deploy:<id>", registry = "attr_busy")]
async fn deploy_busy(
    id: u64,
    held: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
) -> Result<(), JobError> {
    hold_until(held, release).await
}

#[distributed_lock(key = "deploy:<id>", registry = "attr_busy")]
async fn deploy_now(id: u64) -> Result<&'static str, JobError> {
    Ok("deployed")
}

#[tokio::test]
async fn busy_lock_returns_users_error() {
    let server = RedisServer::start();
    install(&server, "attr_busy");
    let (held_tx, held) = oneshot::channel();
    let (release, release_rx) = oneshot::channel();
    let holder = tokio::spawn(deploy_busy(7, held_tx, release_rx));
    held.await.expect("holder inside");

    match deploy_now(7).await {
        Err(JobError::Lock(LockError::Busy { key, .. })) => assert_eq!(key, "deploy:7"),
        other => panic!("expected the user's error built from LockError::Busy, got {other:?}"),
    }
    // Another key is not affected.
    assert_eq!(deploy_now(8).await.expect("free key"), "deployed");

    release.send(()).expect("holder waits");
    holder.await.expect("task").expect("holder finished");
    assert_eq!(deploy_now(7).await.expect("released"), "deployed");
}

#[distributed_lock(key = "report", registry = "attr_wait")]
async fn report_hold(
    held: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
    done: Arc<AtomicUsize>,
) -> Result<(), JobError> {
    hold_until(held, release).await?;
    // Inside the body: after it the release hands the lock over, and the waiter may run
    // before this task is polled again.
    done.store(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "report", wait = "30s", registry = "attr_wait")]
async fn report_waiting(holder_done: Arc<AtomicUsize>) -> Result<usize, JobError> {
    Ok(holder_done.load(Ordering::SeqCst))
}

#[tokio::test]
async fn wait_acquires_once_the_holder_releases() {
    let server = RedisServer::start();
    install(&server, "attr_wait");
    let mut con = raw(&server.url()).await;
    let (held_tx, held) = oneshot::channel();
    let (release, release_rx) = oneshot::channel();
    let holder_done = Arc::new(AtomicUsize::new(0));
    let done = holder_done.clone();
    let holder = tokio::spawn(report_hold(held_tx, release_rx, done));
    held.await.expect("holder inside");

    let waiter = tokio::spawn(report_waiting(holder_done));
    // The waiter found the lock busy once it listens for the release (its wait is notified,
    // not polled): only then let the holder go.
    wait_for_subscriber(&mut con).await;
    release.send(()).expect("holder waits");
    holder.await.expect("task").expect("holder finished");

    let seen = waiter.await.expect("task").expect("acquired within wait");
    assert_eq!(seen, 1, "the waiter ran only after the holder finished");
}

/// Until some client subscribed to a channel, i.e. a waiter listens for a release.
async fn wait_for_subscriber(con: &mut redis::aio::MultiplexedConnection) {
    for _ in 0..2000 {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .query_async(con)
            .await
            .expect("PUBSUB CHANNELS");
        if !channels.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("no waiter subscribed within 10 s");
}

#[distributed_lock(
    key = "crashed",
    ttl = "60s",
    wait = "30s",
    registry = "attr_wait_expiry"
)]
async fn after_crashed_holder() -> Result<String, JobError> {
    Ok(current().expect("inside").redis_key().to_owned())
}

#[tokio::test]
async fn wait_outlasts_a_holder_that_never_releases() {
    let server = RedisServer::start();
    install(&server, "attr_wait_expiry");
    let mut con = raw(&server.url()).await;
    // Another service's lock on the same key (same wire convention), whose holder crashed:
    // nobody will release it, it only expires.
    let _: () = redis::cmd("SET")
        .arg("lock:crashed")
        .arg("other-service:token")
        .arg("PX")
        .arg(300)
        .query_async(&mut con)
        .await
        .expect("SET");
    let key = after_crashed_holder()
        .await
        .expect("acquired after the foreign lease expired");
    assert_eq!(key, "lock:crashed");
}

#[distributed_lock(key = "lease:<name>", ttl = "300ms", registry = "attr_cancel")]
async fn cancelled_body(
    name: &str,
    held: oneshot::Sender<()>,
    dropped: mpsc::UnboundedSender<&'static str>,
) -> Result<&'static str, JobError> {
    struct OnDrop(mpsc::UnboundedSender<&'static str>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            let _ = self.0.send("dropped");
        }
    }
    let _on_drop = OnDrop(dropped.clone());
    held.send(()).expect("test is listening");
    std::future::pending::<()>().await;
    dropped.send("finished").expect("test is listening");
    Ok("finished")
}

#[tokio::test]
async fn cancel_drops_the_body_when_the_lease_is_lost() {
    let server = RedisServer::start();
    install(&server, "attr_cancel");
    let mut con = raw(&server.url()).await;
    let (held_tx, held) = oneshot::channel();
    let (dropped_tx, mut dropped) = mpsc::unbounded_channel();
    let call = tokio::spawn(async move { cancelled_body("a", held_tx, dropped_tx).await });
    held.await.expect("body inside");

    // Someone else takes the key behind the holder's back: its next renewal finds out.
    let _: () = con.set("lock:lease:a", "intruder").await.expect("SET");

    match call.await.expect("task") {
        Err(JobError::Lock(LockError::Lost { key, .. })) => assert_eq!(key, "lease:a"),
        other => panic!("expected LockError::Lost, got {other:?}"),
    }
    assert_eq!(dropped.recv().await, Some("dropped"));
    let owner: String = con.get("lock:lease:a").await.expect("GET");
    assert_eq!(
        owner, "intruder",
        "a lost lock is never released from under its new owner"
    );
}

#[distributed_lock(
    key = "lease:<name>",
    ttl = "300ms",
    on_lost = "continue",
    registry = "attr_continue"
)]
async fn continued_body(name: &str, held: oneshot::Sender<()>) -> Result<String, JobError> {
    held.send(()).expect("test is listening");
    let lock = current().expect("inside");
    let lost = lock.lost().await;
    assert!(lock.is_lost());
    Ok(format!(
        "finished after: {}",
        matches!(lost, LockError::Lost { .. })
    ))
}

#[tokio::test]
async fn continue_lets_the_body_finish_and_reports_the_loss() {
    let server = RedisServer::start();
    install(&server, "attr_continue");
    let mut con = raw(&server.url()).await;
    let (held_tx, held) = oneshot::channel();
    let call = tokio::spawn(async move { continued_body("b", held_tx).await });
    held.await.expect("body inside");

    let _: () = con.del("lock:lease:b").await.expect("DEL");

    let outcome = call.await.expect("task").expect("the body's own result");
    assert_eq!(outcome, "finished after: true");
}

#[distributed_lock(key = "nightly:<job>", min_hold = "1h", registry = "attr_min_hold")]
async fn nightly(job: &str, fail: bool) -> Result<(), JobError> {
    if fail {
        return Err(JobError::Failed);
    }
    Ok(())
}

#[tokio::test]
async fn min_hold_keeps_the_key_after_success_and_releases_at_once_after_an_error() {
    let server = RedisServer::start();
    install(&server, "attr_min_hold");
    let mut con = raw(&server.url()).await;

    nightly("ok", false).await.expect("ran");
    let kept: bool = con.exists("lock:nightly:ok").await.expect("EXISTS");
    assert!(kept, "a successful run keeps the key for min_hold");
    let ttl: i64 = con.pttl("lock:nightly:ok").await.expect("PTTL");
    assert!(ttl > 0, "the kept key still expires");
    assert!(matches!(
        nightly("ok", false).await,
        Err(JobError::Lock(LockError::Busy { .. }))
    ));

    assert!(matches!(nightly("bad", true).await, Err(JobError::Failed)));
    let kept: bool = con.exists("lock:nightly:bad").await.expect("EXISTS");
    assert!(
        !kept,
        "a failed run releases at once so another replica can retry"
    );
    nightly("bad", false).await.expect("free again");
}

#[distributed_lock(key = "invoice:<id>", fencing = true, registry = "attr_fencing")]
async fn fenced(id: u32) -> Result<Option<u64>, JobError> {
    Ok(current().expect("inside").fence())
}

#[distributed_lock(key = "invoice:<id>", registry = "attr_fencing")]
async fn unfenced(id: u32) -> Result<Option<u64>, JobError> {
    Ok(current().expect("inside").fence())
}

#[tokio::test]
async fn fencing_makes_the_token_visible_and_increasing() {
    let server = RedisServer::start();
    install(&server, "attr_fencing");
    let first = fenced(1).await.expect("ran").expect("a fencing token");
    let second = fenced(1).await.expect("ran").expect("a fencing token");
    assert!(second > first, "{second} after {first}");
    assert_eq!(unfenced(1).await.expect("ran"), None);
}

#[distributed_lock(key = "account:<id>", registry = "attr_reentry")]
async fn transfer(id: u64) -> Result<(String, String), JobError> {
    let outer = current().expect("inside").token().to_owned();
    let inner = debit(id).await?;
    Ok((outer, inner))
}

#[distributed_lock(key = "account:<id>", registry = "attr_reentry")]
async fn debit(id: u64) -> Result<String, JobError> {
    Ok(current().expect("inside").token().to_owned())
}

#[tokio::test]
async fn nested_calls_on_the_same_key_reenter() {
    let server = RedisServer::start();
    install(&server, "attr_reentry");
    let (outer, inner) = transfer(3).await.expect("no deadlock, no busy");
    assert_eq!(outer, inner, "the nested call ran inside the outer lease");
    let mut con = raw(&server.url()).await;
    let kept: bool = con.exists("lock:account:3").await.expect("EXISTS");
    assert!(!kept, "the outer call released the lock");
}

#[distributed_lock(key = "dropped", registry = "attr_drop")]
async fn abandoned(held: oneshot::Sender<()>) -> Result<(), JobError> {
    held.send(()).expect("test is listening");
    std::future::pending().await
}

#[distributed_lock(key = "dropped", wait = "30s", registry = "attr_drop")]
async fn after_abandoned() -> Result<(), JobError> {
    Ok(())
}

#[tokio::test]
async fn dropping_the_call_releases_the_lock() {
    let server = RedisServer::start();
    install(&server, "attr_drop");
    let (held_tx, held) = oneshot::channel();
    let call = tokio::spawn(abandoned(held_tx));
    held.await.expect("body inside");
    call.abort();
    assert!(call.await.expect_err("aborted").is_cancelled());
    after_abandoned().await.expect("released in the background");
}

#[distributed_lock(key = "orphan", registry = "attr_never_installed")]
async fn without_registry() -> Result<(), JobError> {
    Ok(())
}

#[tokio::test]
async fn a_missing_registry_is_the_users_error() {
    match without_registry().await {
        Err(JobError::Lock(LockError::NotConfigured { registry })) => {
            assert_eq!(registry.as_deref(), Some("attr_never_installed"));
        }
        other => panic!("expected LockError::NotConfigured, got {other:?}"),
    }
}

// --- Across processes: the `attr-cron` binary is the second process. ---

#[distributed_lock(key = "cron:<job>", registry = "attr_processes")]
async fn cron_holding(job: &str, url: String) -> Result<(), JobError> {
    // While this process holds the lock, another process finds it busy.
    run_child(&url, "busy").await;
    Ok(())
}

#[tokio::test]
async fn processes_never_hold_the_same_key_at_once() {
    let server = RedisServer::start();
    install(&server, "attr_processes");
    cron_holding("backup", server.url()).await.expect("held");
    // Released: now the other process gets it.
    run_child(&server.url(), "acquired").await;
}

async fn run_child(url: &str, expect: &str) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_attr-cron"))
        .args([url, expect])
        .output()
        .await
        .expect("run the second process");
    assert!(
        output.status.success(),
        "the second process expecting {expect} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Starts two calls of `body` (which holds until released, telling once inside) one after the
/// other, each inside before the next starts: both hold at once. Returns their tasks and the
/// senders that release them.
async fn two_inside<F, Fut>(
    body: F,
) -> (
    Vec<tokio::task::JoinHandle<Result<(), JobError>>>,
    Vec<oneshot::Sender<()>>,
)
where
    F: Fn(oneshot::Sender<()>, oneshot::Receiver<()>) -> Fut,
    Fut: std::future::Future<Output = Result<(), JobError>> + Send + 'static,
{
    let (mut tasks, mut releases) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        let (held_tx, held) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        tasks.push(tokio::spawn(body(held_tx, release_rx)));
        held.await.expect("two bodies inside at once");
        releases.push(release);
    }
    (tasks, releases)
}

/// Holds one of two permits until `release` fires, telling `held` once inside.
#[distributed_lock(key = "pool", permits = 2, wait = "30s", registry = "attr_permits")]
async fn pooled(held: oneshot::Sender<()>, release: oneshot::Receiver<()>) -> Result<(), JobError> {
    hold_until(held, release).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_let_that_many_bodies_in_and_the_next_one_after_a_release() {
    let server = RedisServer::start();
    install(&server, "attr_permits");
    let (tasks, mut releases) = two_inside(pooled).await;
    let registry = lock_runtime::named("attr_permits").unwrap();
    let err = registry
        .lock("pool")
        .permits(2)
        .acquire()
        .await
        .unwrap_err();
    assert!(
        err.is_busy(),
        "both permits are held by the bodies: {err:?}"
    );
    let (held_tx, third) = oneshot::channel();
    let (release_third, release_rx) = oneshot::channel();
    let waiting = tokio::spawn(pooled(held_tx, release_rx));
    releases.pop().unwrap().send(()).unwrap();
    third
        .await
        .expect("the third body runs once a permit is returned");
    release_third.send(()).unwrap();
    for release in releases {
        release.send(()).unwrap();
    }
    for task in tasks.into_iter().chain([waiting]) {
        task.await.unwrap().expect("each body ran under a permit");
    }
}

/// Reads the catalog until `release` fires, telling `held` once inside.
#[distributed_lock(key = "catalog", mode = "read", wait = "30s", registry = "attr_rw")]
async fn read_catalog(
    held: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
) -> Result<(), JobError> {
    hold_until(held, release).await
}

#[distributed_lock(key = "catalog", wait = "30s", registry = "attr_rw")]
async fn write_catalog() -> Result<&'static str, JobError> {
    Ok("written")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_read_together_and_the_writer_waits_for_them() {
    let server = RedisServer::start();
    install(&server, "attr_rw");
    // The second reader gets in while the first still reads.
    let (readers, releases) = two_inside(read_catalog).await;
    let registry = lock_runtime::named("attr_rw").unwrap();
    let err = registry.lock("catalog").acquire().await.unwrap_err();
    assert!(err.is_busy(), "a writer waits for the readers: {err:?}");
    let writer = tokio::spawn(write_catalog());
    for release in releases {
        release.send(()).unwrap();
    }
    for reader in readers {
        reader.await.unwrap().expect("each reader ran");
    }
    assert_eq!(
        writer.await.unwrap().expect("the writer ran after them"),
        "written"
    );
}

/// Moves `amount` from one balance to another: a read-modify-write of both under one lock.
#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "30s", registry = "attr_keys")]
async fn move_money(
    balances: Arc<std::sync::Mutex<[i64; 3]>>,
    from: usize,
    to: usize,
    amount: i64,
) -> Result<(), JobError> {
    let (a, b) = {
        let b = balances.lock().unwrap();
        (b[from], b[to])
    };
    tokio::task::yield_now().await;
    let mut now = balances.lock().unwrap();
    now[from] = a - amount;
    now[to] = b + amount;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_under_several_keys_never_lose_money_in_either_direction() {
    let server = RedisServer::start();
    install(&server, "attr_keys");
    let balances = Arc::new(std::sync::Mutex::new([100, 100, 100]));
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let balances = balances.clone();
            let (from, to) = [(0, 1), (1, 0), (1, 2), (2, 0)][i % 4];
            tokio::spawn(async move {
                for _ in 0..10 {
                    move_money(balances.clone(), from, to, 1).await?;
                }
                Ok::<_, JobError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().expect("every transfer ran");
    }
    let balances = *balances.lock().unwrap();
    assert_eq!(balances.iter().sum::<i64>(), 300, "{balances:?}");
    // Three tasks each for 0->1, 1->0, 1->2 and 2->0, ten transfers of 1 apiece.
    assert_eq!(
        balances,
        [130, 70, 100],
        "each transfer applied exactly once"
    );
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobError::Lock(error) => error.fmt(f),
            JobError::Failed => f.write_str("the job failed"),
        }
    }
}

/// A leader's loop: each term runs the body afresh (on clones of the arguments), with the
/// term in `current()`; a failed term is followed by another, numbered higher, and so is one
/// that stepped down.
#[distributed_lock(
    key = "scheduler:<region>",
    ttl = "2s",
    leader = true,
    registry = "attr_leader"
)]
async fn lead_region(
    region: &str,
    calls: Arc<AtomicUsize>,
    terms: mpsc::UnboundedSender<(String, u64)>,
) -> Result<(), JobError> {
    let term = current().expect("inside a term");
    let number = term.fence().expect("terms are numbered");
    terms
        .send((term.key().to_owned(), number))
        .expect("the test listens");
    // The first term fails; the next ones lead until asked to step down (or the registry shuts
    // down), then return.
    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(JobError::Failed);
    }
    term.stepping_down().await;
    Ok(())
}

/// The next term the leader's body reported.
async fn next(terms: &mut mpsc::UnboundedReceiver<(String, u64)>) -> (String, u64) {
    tokio::time::timeout(Duration::from_secs(20), terms.recv())
        .await
        .expect("a term within the limit")
        .expect("leading")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_fn_runs_its_body_for_each_term_steps_down_and_ends_at_shutdown() {
    let server = RedisServer::start();
    let registry = Registry::builder()
        .url(server.url())
        .identity("replica-7")
        .build()
        .expect("registry");
    registry.install_as("attr_leader");
    let (terms_tx, mut terms) = mpsc::unbounded_channel();
    let calls = Arc::new(AtomicUsize::new(0));
    let leading = tokio::spawn(async move { lead_region("eu", calls, terms_tx).await });
    let (key, first) = next(&mut terms).await;
    assert_eq!(key, "scheduler:eu");
    let (second_key, second) = next(&mut terms).await;
    assert_eq!(second_key, key);
    assert!(second > first, "term {second} after the failed {first}");
    let leader = registry.election("scheduler:eu").leader().await.unwrap();
    let leader = leader.expect("the second term leads on");
    assert_eq!(leader.identity, "replica-7", "the registry's identity");
    assert_eq!(leader.term, Some(second));
    // Asked from outside the body, as a deploy's shutdown hook would: the body returns, and the
    // loop, the only candidate, leads the next term.
    let ended = registry
        .election("scheduler:eu")
        .step_down(Duration::from_secs(20))
        .await
        .expect("step down")
        .expect("it led");
    assert_eq!((ended.term, ended.finished), (Some(second), true));
    let (_, third) = next(&mut terms).await;
    assert!(
        third > second,
        "term {third} after the one stepped down, {second}"
    );
    registry.shutdown().await;
    let ended = tokio::time::timeout(Duration::from_secs(20), leading)
        .await
        .expect("ends");
    assert!(
        ended.expect("task").is_ok(),
        "a leader's loop ends with Ok at shutdown"
    );
}
