use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockError, Registry};
use lock_tests::sentinel::{RedisSentinels, SERVICE};
use lock_tests::{
    eventually, free_port, renewed_on, spawn_hung_body_holding, subscribers, with_timeouts,
    RedisServer,
};

/// Short timeouts, so operations on a dead master fail quickly and are retried by the library
/// while the sentinels promote the replica. A TLS deployment's CA is trusted.
fn registry(deployment: &RedisSentinels) -> Registry {
    let builder = Registry::builder().sentinel(SERVICE, deployment.urls());
    if deployment.urls()[0].starts_with("rediss://") {
        // A connection is two TLS handshakes (a sentinel's, then the master's): on a loaded
        // machine (a clean clone's suite, beside `cargo doc`) every attempt outlasted 600 ms
        // for the warm-up's 10 s. The TLS tests inject no network fault that needs them short.
        with_timeouts(
            builder.tls_root_cert(deployment.ca_pem()),
            Duration::from_secs(2),
        )
    } else {
        with_timeouts(builder, Duration::from_millis(300))
    }
}

/// As [`registry`], counting only what `replicas` replicas acknowledged.
fn confirming(deployment: &RedisSentinels, replicas: u32) -> Registry {
    with_timeouts(
        Registry::builder()
            .sentinel(SERVICE, deployment.urls())
            .confirm_replicas(replicas),
        Duration::from_millis(300),
    )
}

/// Waits for `key` on `registry` (up to 20 s), releases it at once and returns its fence.
fn fenced_waiter(
    registry: Registry,
    key: &'static str,
) -> tokio::task::JoinHandle<Result<Option<u64>, LockError>> {
    tokio::spawn(async move {
        let guard = registry
            .lock(key)
            .fencing(true)
            .wait(Duration::from_secs(20))
            .acquire()
            .await?;
        let fence = guard.fence();
        guard.release().await?;
        Ok(fence)
    })
}

fn value(server: &RedisServer, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut server.connection())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_taken_fenced_and_handed_over_on_the_master_the_sentinels_name() {
    let deployment = RedisSentinels::start();
    let (a, b) = (registry(&deployment), registry(&deployment));
    assert!(a.node().starts_with("sentinel mymaster via 127.0.0.1:"));
    let guard = a
        .lock("deploy:7")
        .fencing(true)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let first_fence = guard.fence().expect("fencing was asked for");
    assert_eq!(
        value(&deployment.master, "lock:deploy:7").as_deref(),
        Some(guard.token())
    );
    // A waiter on the other registry is woken by the release's notification (its wait is
    // shorter than the holder's lease, so expiry cannot hand the lock over).
    let waiter = fenced_waiter(b, "deploy:7");
    // The waiter subscribes on the master too: wait until it does, then release.
    let master = deployment.master.url();
    eventually(Duration::from_secs(10), "the waiter subscribed", || async {
        subscribers(&master, "lock:deploy:7").await > 0
    })
    .await;
    guard.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert!(next > Some(first_fence), "{next:?} after {first_fence}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_locks_are_taken_on_the_promoted_replica() {
    let mut deployment = RedisSentinels::start();
    let reg = registry(&deployment);
    let before = reg
        .lock("before")
        .ttl(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    // The key reached the replica before the master dies (replication is asynchronous; a lock
    // lost in that window is the documented limit, not what this test is about).
    let _: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(0)
        .query(&mut deployment.master.connection())
        .unwrap();
    let switch = deployment.watch_switch().await;
    deployment.master.kill();
    let promoted = switch.wait().await;
    assert_eq!(
        promoted,
        deployment.replica.port(),
        "the replica was promoted"
    );
    // The fixture keeps what the sentinels log (a failed fault run writes it out with its
    // histories, where MONITOR shows no promotion).
    eventually(
        Duration::from_secs(10),
        "a sentinel logged the switch",
        || {
            let logged = deployment
                .sentinels
                .iter()
                .any(|s| s.log().iter().any(|line| line.contains("+switch-master")));
            async move { logged }
        },
    )
    .await;
    // The registry follows the sentinels to the new master: acquisitions succeed there.
    let after = reg
        .lock("after")
        .fencing(true)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquired on the new master");
    assert_eq!(
        value(&deployment.replica, "lock:after").as_deref(),
        Some(after.token())
    );
    after.release().await.unwrap();
    // The lock taken before the failover was renewed on the new master, or is reported lost:
    // never held on paper while the server has forgotten it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let on_new_master = value(&deployment.replica, "lock:before");
    assert!(
        before.is_lost() || on_new_master.as_deref() == Some(before.token()),
        "held: {}, on the new master: {on_new_master:?}",
        !before.is_lost()
    );
}

/// The split brain no Redis lock avoids by itself: the old master is cut off from the sentinels
/// and from its replica, but not from the process that holds a lock on it. The sentinels
/// promote the replica; once the key's replicated expiry has passed there, a second client
/// takes the lock on the new master, while the first goes on renewing on the old one, with
/// success, and is never told: two holders at once for as long as the partition lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_with_its_old_master_renews_there_unaware_while_the_promoted_replica_grants_the_lock_again(
) {
    let deployment = RedisSentinels::start_partitionable();
    let ttl = Duration::from_secs(2);
    let (first, body) = spawn_hung_body_holding(registry(&deployment).lock("split").ttl(ttl)).await;
    // The key reached the replica before the partition, as a lock held for a while has.
    eventually(Duration::from_secs(10), "the lock replicated", || async {
        value(&deployment.replica, "lock:split").as_deref() == Some(first.token())
    })
    .await;
    let second = partition_and_lock_on_the_promoted_replica(&deployment, ttl).await;
    assert_eq!(
        value(&deployment.replica, "lock:split").as_deref(),
        Some(second.token())
    );
    assert!(
        !first.is_lost(),
        "the first holder believes it still holds the lock"
    );
    assert_eq!(
        value(&deployment.master, "lock:split").as_deref(),
        Some(first.token()),
        "and its key lives on the old master"
    );
    // It keeps renewing there: the key's expiry on the old master moves forward again.
    renewed_on(
        &deployment.master,
        "lock:split",
        ttl * 2,
        "a renewal on the old master",
    )
    .await;
    assert!(
        !first.is_lost() && !body.is_finished(),
        "the first holder is never told while the partition lasts"
    );
    assert!(!second.is_lost());
    body.abort();
    second.release().await.unwrap();
}

/// Cuts the master off from the sentinels and the replica, waits for the replica's promotion,
/// and takes lock `split` there with a registry that asks the sentinels afresh (and confirms
/// nothing: the new master has no replica left): the lock is free there once the first
/// holder's replicated expiry has passed.
async fn partition_and_lock_on_the_promoted_replica(
    deployment: &RedisSentinels,
    ttl: Duration,
) -> lock_runtime::LockGuard {
    let switch = deployment.watch_switch().await;
    deployment.partition_master();
    assert_eq!(
        switch.wait().await,
        deployment.replica.port(),
        "the replica was promoted"
    );
    registry(deployment)
        .lock("split")
        .ttl(ttl)
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("the second client gets the lock on the new master")
}

/// The same partition, with the holder's registry counting only what the replica acknowledged:
/// its renewals on the cut-off master are never confirmed, so its lease runs out before the
/// replica's copy of the key, and its body is cancelled before the promoted replica can give
/// the lock to anyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_confirms_with_the_replica_is_lost_before_the_promoted_replica_grants_the_lock_again(
) {
    let deployment = RedisSentinels::start_partitionable();
    // Longer than the sentinels take to promote the replica (a 5 s `down-after`, then the
    // failover), so that the replica's copy of the lock is still alive when it becomes master:
    // the second grant waits for it to expire, and the first body must be stopped before.
    let ttl = Duration::from_secs(10);
    let confirmed = confirming(&deployment, 1);
    // When the body was stopped (dropped), on the wall clock the servers' share.
    let stopped = Arc::new(std::sync::Mutex::new(None));
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let body = {
        let stopped = stopped.clone();
        tokio::spawn(confirmed.lock("split").ttl(ttl).run(async move {
            let _stop = StopStamp(stopped);
            started_tx.send(lock_runtime::current().unwrap()).unwrap();
            std::future::pending::<Result<(), LockError>>().await
        }))
    };
    let first = started.await.expect("the body started");
    // Acknowledged by the replica before the acquisition returned.
    assert_eq!(
        value(&deployment.replica, "lock:split").as_deref(),
        Some(first.token())
    );
    let second = partition_and_lock_on_the_promoted_replica(&deployment, ttl).await;
    // When the promoted replica granted it, from the lease it has left: no later than this.
    let before_asking = unix_ms();
    let left = deployment.replica.pttl("lock:split");
    assert!(left > 0, "the second holder's key has a lease: {left}");
    let granted = before_asking - (i64::try_from(ttl.as_millis()).unwrap() - left);
    let outcome = tokio::time::timeout(Duration::from_secs(10), body)
        .await
        .expect("the cancelled body's task ends")
        .unwrap();
    lock_tests::assert_lost(&outcome.unwrap_err(), lock_runtime::LostReason::Expired);
    let stopped = stopped.lock().unwrap().expect("the body was dropped");
    assert!(
        stopped < granted,
        "the first body stopped at {stopped} ms, after the second holder's grant at {granted} ms"
    );
    second.release().await.unwrap();
}

/// Records, when dropped, the wall-clock ms: when a body was stopped.
struct StopStamp(Arc<std::sync::Mutex<Option<i64>>>);

impl Drop for StopStamp {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(unix_ms());
    }
}

fn unix_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

/// Both connections of a confirming registry (the shared one and the one that waits for
/// replicas) follow the sentinels to the promoted replica. It has no replica of its own, so
/// nothing is confirmed there; once the old master is back and the sentinels have made it a
/// replica of the new one, locks are taken again, acknowledged by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirming_registry_follows_a_failover_and_locks_again_once_a_replica_has_joined() {
    let mut deployment = RedisSentinels::start();
    let reg = confirming(&deployment, 1);
    let ttl = Duration::from_secs(2);
    let before = reg.lock("before").ttl(ttl).acquire().await.unwrap();
    assert_eq!(
        value(&deployment.replica, "lock:before").as_deref(),
        Some(before.token())
    );
    before.release().await.unwrap();
    let switch = deployment.watch_switch().await;
    deployment.master.kill();
    assert_eq!(switch.wait().await, deployment.replica.port());
    let err = reg
        .lock("after")
        .ttl(ttl)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("0 of the 1 replicas asked for acknowledged it"),
        "the new master was reached, and has no replica to confirm with: {err}"
    );
    assert_eq!(value(&deployment.replica, "lock:after"), None, "released");
    // Back empty; the sentinels turn it into a replica of the new master.
    deployment.master.restart();
    let after = reg
        .lock("after")
        .ttl(ttl)
        .wait(Duration::from_secs(60))
        .acquire()
        .await
        .expect("confirmed once the old master replicates the new one");
    assert_eq!(
        value(&deployment.master, "lock:after").as_deref(),
        Some(after.token()),
        "acknowledged by the old master, now a replica"
    );
    after.release().await.unwrap();
}

/// Makes the old master, back on its address, a replica of the promoted one: what the sentinels
/// do once they see it again, done at once so the test need not wait for them.
fn demote_old_master(deployment: &RedisSentinels) {
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(deployment.replica.port())
        .query(&mut deployment.master.connection())
        .unwrap();
}

/// Starts a failover with `fault` on the master, and waits until the replica is promoted.
async fn fail_over(deployment: &mut RedisSentinels, fault: impl FnOnce(&mut RedisServer)) {
    let switch = deployment.watch_switch().await;
    fault(&mut deployment.master);
    assert_eq!(
        switch.wait().await,
        deployment.replica.port(),
        "the replica was promoted"
    );
}

/// A registry that locked once, so it is connected to the master before the fault.
async fn connected_registry(deployment: &RedisSentinels) -> Registry {
    let reg = registry(deployment);
    lock_tests::warm_up(&reg).await;
    reg
}

/// A lock taken now lands on the promoted replica, not on the old master that is back on its
/// address as a replica (and answers writes with `READONLY`).
async fn locks_on_the_new_master(reg: &Registry, deployment: &RedisSentinels) {
    let after = reg
        .lock("after")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("acquired on the new master");
    assert_eq!(
        value(&deployment.replica, "lock:after").as_deref(),
        Some(after.token())
    );
    after.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_old_master_returns_as_a_replica_locks_are_taken_on_the_new_master() {
    let mut deployment = RedisSentinels::start();
    let reg = connected_registry(&deployment).await;
    // The registry is idle from the kill until the old master is back, empty, as a replica.
    fail_over(&mut deployment, RedisServer::kill).await;
    deployment.master.restart();
    demote_old_master(&deployment);
    locks_on_the_new_master(&reg, &deployment).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_through_the_failover_do_not_leave_the_registry_on_the_returned_old_master() {
    let mut deployment = RedisSentinels::start();
    let reg = registry(&deployment);
    // Workers lock one key in a loop, as the fault workload does: their attempts meet the dead
    // master before the sentinels switch, and keep the connection reconnecting to its address
    // until the old master is back there.
    let stop = Arc::new(AtomicBool::new(false));
    let (locked, mut first_lock) = tokio::sync::mpsc::unbounded_channel();
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let (reg, stop, locked) = (reg.clone(), stop.clone(), locked.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let attempt = reg.lock("register").wait(Duration::from_millis(200));
                    if let Ok(guard) = attempt.acquire().await {
                        let _ = guard.release().await;
                        let _ = locked.send(());
                    }
                }
            })
        })
        .collect();
    // The registry is connected to the master before it dies.
    first_lock
        .recv()
        .await
        .expect("a worker locked on the master");
    fail_over(&mut deployment, RedisServer::kill).await;
    deployment.master.restart();
    demote_old_master(&deployment);
    locks_on_the_new_master(&reg, &deployment).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_demoted_under_an_open_connection_is_left_for_the_new_one() {
    let mut deployment = RedisSentinels::start();
    let reg = connected_registry(&deployment).await;
    // The old master stalls long enough to be replaced, then comes back as a replica: the
    // registry's connection to it never broke, and writes on it now answer `READONLY`.
    fail_over(&mut deployment, |master| master.pause()).await;
    deployment.master.resume();
    demote_old_master(&deployment);
    locks_on_the_new_master(&reg, &deployment).await;
}

/// Two masters at once: the old master stalls past `down-after-milliseconds`, the sentinels
/// promote the replica, and the old master comes back still a master, until they see it and
/// demote it (`+convert-to-slave`, seconds later). `reg` locked on it before, and its
/// connection never broke.
async fn two_masters(deployment: &mut RedisSentinels, reg: &Registry) {
    lock_tests::warm_up(reg).await;
    fail_over(deployment, |master| master.pause()).await;
    deployment.master.resume();
    let role: Vec<redis::Value> = redis::cmd("ROLE")
        .query(&mut deployment.master.connection())
        .unwrap();
    assert_eq!(
        role.first(),
        Some(&redis::Value::BulkString(b"master".to_vec())),
        "nothing has demoted the old master yet"
    );
}

/// The limit: on the default deployment, a registry still connected to the old master takes a
/// lock there while a registry that asks the sentinels takes the same lock on the promoted
/// replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_master_back_beside_the_promoted_one_grants_a_lock_held_on_the_new_master_too() {
    let mut deployment = RedisSentinels::start();
    let reg = registry(&deployment);
    two_masters(&mut deployment, &reg).await;
    let ttl = Duration::from_secs(5);
    let first = reg.lock("split").ttl(ttl).acquire().await.unwrap();
    assert_eq!(
        value(&deployment.master, "lock:split").as_deref(),
        Some(first.token()),
        "taken on the old master"
    );
    let second = registry(&deployment)
        .lock("split")
        .ttl(ttl)
        .acquire()
        .await
        .expect("taken again on the promoted replica");
    assert_eq!(
        value(&deployment.replica, "lock:split").as_deref(),
        Some(second.token())
    );
    assert!(!first.is_lost() && !second.is_lost(), "two holders at once");
    let _ = first.release().await;
    second.release().await.unwrap();
}

/// The same two masters on the deployment `GUARANTEES.md` promises exclusion for: with the
/// servers' `min-replicas-to-write 1` and the registry's `confirm_replicas(1)`, a master whose
/// replica left grants nothing; once the sentinels have made it follow the new master, locks
/// are taken on the new master again, acknowledged by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_back_beside_the_promoted_one_grants_no_lock_until_it_follows_it() {
    let mut deployment = RedisSentinels::start_min_replicas();
    let reg = confirming(&deployment, 1);
    two_masters(&mut deployment, &reg).await;
    let ttl = Duration::from_secs(2);
    let refused = reg.lock("split").ttl(ttl).acquire().await;
    assert!(
        refused.is_err(),
        "a master whose replica was promoted away granted a lock"
    );
    assert_eq!(value(&deployment.master, "lock:split"), None);
    let after = reg
        .lock("split")
        .ttl(ttl)
        .wait(Duration::from_secs(60))
        .acquire()
        .await
        .expect("locked once the old master follows the new one");
    assert_eq!(
        value(&deployment.replica, "lock:split").as_deref(),
        Some(after.token()),
        "taken on the promoted replica"
    );
    assert_eq!(
        value(&deployment.master, "lock:split").as_deref(),
        Some(after.token()),
        "and acknowledged by the old master, now its replica"
    );
    after.release().await.unwrap();
}

#[tokio::test]
async fn unreachable_sentinels_fail_cleanly_and_name_the_sentinels() {
    let port = free_port();
    let reg = Registry::builder()
        .sentinel(SERVICE, [format!("redis://127.0.0.1:{port}")])
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(60), reg.lock("k").acquire())
        .await
        .expect("an error, not a hang")
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(&format!("sentinel mymaster via 127.0.0.1:{port}")),
        "{message}"
    );
}

#[test]
fn sentinel_configuration_mistakes_are_refused_by_name() {
    let refused = |master: &str, sentinels: &[&str]| {
        Registry::builder()
            .sentinel(master, sentinels.iter().copied())
            .build()
            .unwrap_err()
            .to_string()
    };
    assert!(refused("mymaster", &[]).contains("no sentinel URL given"));
    assert!(refused("my master", &["redis://127.0.0.1:26379"]).contains("not a plain name"));
    assert!(refused(
        "mymaster",
        &["rediss://127.0.0.1:26379", "redis://127.0.0.1:26380"]
    )
    .contains("differ in TLS"));
    // The master's login rides on a URL whose host is the service name; never echoed back.
    let reg = Registry::builder()
        .sentinel(
            "redis://locker:s3cret@mymaster/2",
            ["redis://127.0.0.1:26379"],
        )
        .build()
        .unwrap();
    assert!(!format!("{reg:?}").contains("s3cret"));
}

/// `PUBSUB NUMSUB` on a server of any kind (the shared helper speaks plain TCP only).
fn subscribers_on(server: &RedisServer, channel: &str) -> i64 {
    let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query(&mut server.connection())
        .unwrap();
    counts.first().map_or(0, |(_, n)| *n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_taken_renewed_and_handed_over_through_tls_sentinels_on_a_tls_master() {
    let deployment = RedisSentinels::start_tls();
    assert!(deployment.urls().iter().all(|u| u.starts_with("rediss://")));
    let a = registry(&deployment);
    // The waiter connects (TLS to a sentinel, then to the master, then its subscription) with
    // timeouts a loaded machine cannot run out: with 300 ms, beside a build, it had not
    // subscribed after 10 s. No fault is injected here.
    let b = with_timeouts(
        Registry::builder()
            .sentinel(SERVICE, deployment.urls())
            .tls_root_cert(deployment.ca_pem()),
        Duration::from_secs(10),
    );
    let ttl = Duration::from_secs(1);
    // Its first connection (TLS to a sentinel, then to the master) may take longer than the
    // 300 ms connect timeout on a loaded machine: tried again within `wait`.
    let guard = a
        .lock("tls:7")
        .fencing(true)
        .ttl(ttl)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let first_fence = guard.fence().expect("fencing was asked for");
    assert_eq!(
        value(&deployment.master, "lock:tls:7").as_deref(),
        Some(guard.token())
    );
    // Renewed over TLS: the key's remaining time goes up again (only a renewal raises it).
    renewed_on(
        &deployment.master,
        "lock:tls:7",
        ttl * 3,
        "a renewal raised the key's expiry",
    )
    .await;
    assert!(!guard.is_lost());
    // Handed over on release: the waiter's subscription is on the TLS master too.
    let waiter = fenced_waiter(b, "tls:7");
    eventually(Duration::from_secs(10), "the waiter subscribed", || {
        let subscribed = subscribers_on(&deployment.master, "lock:tls:7") > 0;
        async move { subscribed }
    })
    .await;
    guard.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert!(next > Some(first_fence), "{next:?} after {first_fence}");
    assert_eq!(value(&deployment.master, "lock:tls:7"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_under_tls_locks_are_taken_on_the_promoted_replica() {
    let mut deployment = RedisSentinels::start_tls();
    let reg = connected_registry(&deployment).await;
    fail_over(&mut deployment, RedisServer::kill).await;
    locks_on_the_new_master(&reg, &deployment).await;
}

#[tokio::test]
async fn a_plain_client_of_tls_only_sentinels_fails_fast_naming_them() {
    let deployment = RedisSentinels::start_tls();
    let plain: Vec<String> = deployment
        .urls()
        .iter()
        .map(|u| u.replacen("rediss://", "redis://", 1))
        .collect();
    let message = refusal(&deployment, plain).await;
    assert!(message.contains("rediss://"), "{message}");
}

#[tokio::test]
async fn tls_sentinels_without_the_deployment_ca_are_refused_naming_them() {
    let deployment = RedisSentinels::start_tls();
    let message = refusal(&deployment, deployment.urls()).await;
    assert!(
        message.contains("tls_root_cert"),
        "says what to do: {message}"
    );
    assert_eq!(value(&deployment.master, "lock:k"), None);
}

/// The error of a client that reaches the TLS deployment's sentinels through `urls` with no
/// CA: it must come fast and name the first sentinel.
async fn refusal(deployment: &RedisSentinels, urls: Vec<String>) -> String {
    let reg = Registry::builder()
        .sentinel(SERVICE, urls)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(30), reg.lock("k").acquire())
        .await
        .expect("an error, not a hang")
        .unwrap_err();
    let message = err.to_string();
    let sentinel = format!("127.0.0.1:{}", deployment.sentinels[0].port());
    assert!(message.contains(&sentinel), "{message}");
    message
}
