use std::time::Duration;

use lock_runtime::LockError;
use lock_tests::{command_calls, RedisServer};
use redis::AsyncCommands;

use super::support::{raw, registry, spawn_waiter};

/// Waits until the server reports `n` subscribers on `channel`: the waiter is now parked.
async fn until_subscribed(server: &RedisServer, channel: &str, n: i64) {
    let mut con = raw(&server.url()).await;
    loop {
        let (_, count): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(&mut con)
            .await
            .unwrap();
        if count == n {
            return;
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_sends_no_commands_while_parked_and_holds_the_lock_when_the_release_arrives() {
    let server = RedisServer::start();
    let (holder_reg, waiter_reg) = (registry(&server), registry(&server));
    let held = holder_reg
        .lock("queue")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        waiter_reg
            .lock("queue")
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    });
    until_subscribed(&server, "lock:queue", 1).await;

    let mut con = server.connection();
    // Script calls and SETs: `commandstats` counts commands run inside scripts too, so one
    // refused attempt (a plain SET, then the ACQUIRE script with its own SET) counts 3.
    let sent = |con: &mut redis::Connection| {
        let calls = command_calls(con);
        ["evalsha", "set"].map(|c| calls.get(c).copied().unwrap_or(0))
    };
    let before = sent(&mut con);
    // Give a polling implementation every chance to show itself.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = sent(&mut con);
    let parked = (after[0] - before[0]) + (after[1] - before[1]);
    // At most the one retry a waiter makes right after subscribing (it may land in the window);
    // a polling waiter would send dozens. The holder renews only every 10 s.
    assert!(
        parked <= 3,
        "a parked waiter must not poll: {parked} commands"
    );

    held.release().await.unwrap();
    let guard = waiter
        .await
        .unwrap()
        .expect("the waiter gets the lock after the release");
    let end = sent(&mut con);
    // The release script hands the lock to the queued waiter with a SET of its own, and its
    // notification tells the waiter so: the waiter sends nothing more.
    assert_eq!(
        [end[0] - after[0], end[1] - after[1]],
        [1, 1],
        "the release script alone, handing the lock over"
    );
    assert_eq!(guard.key(), "queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_local_waiters_share_one_subscription_and_all_get_the_lock_in_turn() {
    let server = RedisServer::start();
    let (holder_reg, waiter_reg) = (registry(&server), registry(&server));
    let held = holder_reg.lock("turns").acquire().await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..8 {
        let reg = waiter_reg.clone();
        waiters.push(tokio::spawn(async move {
            reg.lock("turns")
                .wait(Duration::from_secs(60))
                .run(async { Ok::<_, LockError>(()) })
                .await
        }));
    }
    // One subscription per registry, however many tasks wait.
    until_subscribed(&server, "lock:turns", 1).await;
    held.release().await.unwrap();
    for w in waiters {
        w.await.unwrap().expect("every waiter gets its turn");
    }
    // The last waiter gave up its interest, so the registry unsubscribed.
    until_subscribed(&server, "lock:turns", 0).await;
}

#[tokio::test]
async fn a_wait_that_runs_out_returns_busy() {
    let server = RedisServer::start();
    let (a, b) = (registry(&server), registry(&server));
    let _held = a.lock("long-held").acquire().await.unwrap();
    let err = b
        .lock("long-held")
        .wait(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap_err();
    assert!(err.is_busy(), "{err:?}");
}

#[tokio::test]
async fn a_lock_freed_by_expiry_is_taken_without_any_release_message() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let mut con = raw(&server.url()).await;
    // A foreign holder that will never publish a release.
    let _: () = redis::cmd("SET")
        .arg("lock:expiring")
        .arg("foreign")
        .arg("PX")
        .arg(300)
        .query_async(&mut con)
        .await
        .unwrap();
    let guard = reg
        .lock("expiring")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("woken by the holder's remaining lease, not a message");
    let value: String = con.get("lock:expiring").await.unwrap();
    assert_eq!(value, guard.token());
}

/// Regression (issue 10, item 5): a waiter cancelled while its subscription was on its way kept
/// its interest counted forever, so the channel was never unsubscribed (and was subscribed
/// again on every reconnect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_cancelled_while_subscribing_leave_no_subscription_behind() {
    const KEYS: usize = 1000;
    let server = RedisServer::start();
    let proxy = lock_tests::proxy::Proxy::start(server.port());
    let reg = super::support::patient_registry(&proxy.url());
    // Connection and subscriber made before the latency, so each step below costs round trips
    // only: a refused attempt is two (`SET NX`, then the script that reads the holder's
    // lease), the subscription one more.
    lock_tests::warm_up(&reg).await;
    let held = reg.lock("warm").acquire().await.unwrap();
    let waiter = reg.clone();
    let waiting = tokio::spawn(async move {
        waiter
            .lock("warm")
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    until_subscribed(&server, "lock:warm", 1).await;
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();

    let mut con = raw(&server.url()).await;
    let mut foreign = redis::pipe();
    foreign.set_options(
        "lock:barrier",
        "another-service",
        redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(60_000)),
    );
    for i in 0..KEYS {
        foreign.set_options(
            format!("lock:busy:{i}"),
            "another-service",
            redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(60_000)),
        );
    }
    let () = foreign.query_async(&mut con).await.unwrap();

    let rtt = Duration::from_millis(100);
    proxy.set_latency(rtt / 2);
    // Cancelled after the two round trips of the refused attempt, while subscribing.
    let cancelled = futures_util::future::join_all((0..KEYS).map(|i| {
        tokio::time::timeout(
            rtt * 5 / 2,
            reg.lock(format!("busy:{i}"))
                .wait(Duration::from_secs(60))
                .acquire(),
        )
    }))
    .await;
    assert!(
        cancelled.iter().all(Result::is_err),
        "every waiter was cancelled"
    );
    proxy.set_latency(Duration::ZERO);

    // A barrier: the subscriber handles its commands in order, so once one more waiter's
    // subscription shows on the server, every earlier subscribe and unsubscribe has been done.
    let barrier = reg.clone();
    let last = tokio::spawn(async move {
        barrier
            .lock("barrier")
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    });
    until_subscribed(&server, "lock:barrier", 1).await;
    let channels: Vec<String> = (0..KEYS).map(|i| format!("lock:busy:{i}")).collect();
    let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(&channels)
        .query_async(&mut con)
        .await
        .unwrap();
    let left: Vec<&String> = counts
        .iter()
        .filter(|(_, n)| *n != 0)
        .map(|(c, _)| c)
        .collect();
    assert!(
        left.is_empty(),
        "{} channels still subscribed: {left:?}",
        left.len()
    );
    last.abort();
}

/// A waiting acquisition is subscribed to its key's releases; when its caller stops waiting it
/// must stop too and unsubscribe, never take the lock later for nobody.
#[tokio::test]
async fn a_cancelled_wait_never_takes_the_lock_afterwards() {
    let server = RedisServer::start();
    let (holder, waiter) = (registry(&server), registry(&server));
    let held = holder.lock("k").acquire().await.unwrap();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            waiter
                .lock("k")
                .wait(Duration::from_secs(30))
                .acquire()
                .await
        }
    });
    until_subscribed(&server, "lock:k", 1).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    // The cancelled waiter has gone when its subscription has.
    tokio::time::timeout(
        Duration::from_secs(10),
        until_subscribed(&server, "lock:k", 0),
    )
    .await
    .expect("the cancelled waiter stopped and unsubscribed");
    held.release().await.unwrap();
    // Another client can take the lock at once: the cancelled waiter did not.
    let next = holder
        .lock("k")
        .acquire()
        .await
        .expect("free after the release");
    assert!(waiter.held().is_empty());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_nobody_waited_for_wakes_nobody_and_runs_no_script_where_the_server_has_delifeq()
{
    let server = RedisServer::start();
    let registry = registry(&server);
    let mut con = server.connection();
    let before = command_calls(&mut con);
    for _ in 0..3 {
        let guard = registry.lock("alone").acquire().await.unwrap();
        guard.release().await.unwrap();
    }
    let after = command_calls(&mut con);
    let sent = |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
    assert_eq!(sent("publish"), 0, "nobody waited: no notification");
    if lock_tests::has_command(&mut con, "DELIFEQ") {
        assert_eq!(
            [sent("set"), sent("delifeq"), sent("evalsha")],
            [3, 3, 0],
            "a plain SET NX and a DELIFEQ per cycle, no Lua"
        );
    } else {
        assert_eq!(
            [sent("set"), sent("evalsha")],
            [3, 3],
            "a plain SET NX and the release script per cycle"
        );
    }
    let free: Option<String> = raw(&server.url()).await.get("lock:alone").await.unwrap();
    assert_eq!(free, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_someone_waits_for_is_marked_renewed_by_its_owner_and_handed_over() {
    let server = RedisServer::start();
    let (holder_reg, waiter_reg) = (registry(&server), registry(&server));
    let held = holder_reg
        .lock("marked")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let token = held.token().to_owned();
    let waiter = spawn_waiter(waiter_reg, "marked");
    until_subscribed(&server, "lock:marked", 1).await;
    let mut con = raw(&server.url()).await;
    let value: Option<String> = con.get("lock:marked").await.unwrap();
    assert_eq!(
        value,
        Some(format!("{token}+w")),
        "the waiter marked the holder's token"
    );
    // Three leases long: the keeper renews the marked lock (`SET .. IFEQ` of the bare token
    // leaves it alone on Valkey; the script renews it).
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!held.is_lost(), "renewed while marked");
    let info = holder_reg.inspect("marked").await.unwrap();
    assert_eq!(
        info.owner.as_deref(),
        Some(token.as_str()),
        "shown without the mark"
    );
    held.release().await.unwrap();
    let guard = waiter.await.unwrap().expect("handed over on release");
    let value: Option<String> = con.get("lock:marked").await.unwrap();
    assert_eq!(
        value.as_deref(),
        Some(guard.token()),
        "nobody else waits: unmarked"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_leaves_another_clients_lock_value_as_it_wrote_it() {
    let server = RedisServer::start();
    let registry = registry(&server);
    let mut con = raw(&server.url()).await;
    let _: () = redis::cmd("SET")
        .arg("lock:foreign")
        .arg("their-token")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut con)
        .await
        .unwrap();
    let waiter = spawn_waiter(registry, "foreign");
    until_subscribed(&server, "lock:foreign", 1).await;
    let value: Option<String> = con.get("lock:foreign").await.unwrap();
    assert_eq!(
        value.as_deref(),
        Some("their-token"),
        "for their compare-and-delete"
    );
    // Their release, a compare-and-delete of the value they wrote, still works.
    let deleted: i64 = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
    .key("lock:foreign")
    .arg("their-token")
    .invoke_async(&mut con)
    .await
    .unwrap();
    assert_eq!(deleted, 1);
    waiter.abort();
}
