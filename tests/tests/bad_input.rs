//! Bad input at runtime, through the manual API, against real redis-server processes: keys
//! Redis would take but a lock should not (or should, byte for byte), keys that hold other data,
//! out-of-range durations, server-side errors, and a connection lost in the middle of an
//! acquisition. Each case ends with a clear error or a correct lock, and with no foreign data
//! touched and no lock left behind beyond its ttl.

use std::time::Duration;

use lock_runtime::{LockError, Registry, MAX_KEY_BYTES};
use lock_tests::proxy::Proxy;
use lock_tests::{command_calls, eventually, raw, subscribers, RedisServer};
use redis::AsyncCommands;

use lock_tests::fast_registry as registry;

/// Commands the server ran, excluding the `INFO` that reads the counters.
fn commands_run(server: &RedisServer) -> u64 {
    let mut con = server.connection();
    command_calls(&mut con)
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(_, n)| n)
        .sum()
}

fn invalid_key_reason(err: &LockError) -> &str {
    match err {
        LockError::InvalidKey { reason, .. } => reason,
        other => panic!("expected InvalidKey, got {other:?}"),
    }
}

#[tokio::test]
async fn an_empty_key_is_refused_before_any_command_reaches_redis() {
    let server = RedisServer::start();
    let reg = registry(&server.url());
    let before = commands_run(&server);
    let err = reg.lock("").acquire().await.unwrap_err();
    assert!(
        invalid_key_reason(&err).contains("the key is empty"),
        "{err}"
    );
    let err = reg
        .lock("")
        .run(async { Ok::<_, LockError>(()) })
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
    assert!(reg.inspect("").await.is_err());
    assert!(reg.force_unlock("").await.is_err());
    assert_eq!(commands_run(&server), before, "nothing was sent");
}

#[tokio::test]
async fn a_one_mib_key_is_refused_with_a_short_message_and_nothing_sent() {
    let server = RedisServer::start();
    let reg = registry(&server.url());
    let before = commands_run(&server);
    let huge = "k".repeat(1 << 20);
    let err = reg.lock(huge.clone()).acquire().await.unwrap_err();
    let reason = invalid_key_reason(&err);
    assert!(reason.contains(&format!("{} bytes", 1 << 20)), "{reason}");
    assert!(
        reason.contains(&MAX_KEY_BYTES.to_string()),
        "names the limit: {reason}"
    );
    let message = err.to_string();
    assert!(
        message.len() < 1000,
        "the message must not echo a 1 MiB key ({} bytes)",
        message.len()
    );
    assert!(reg.inspect(&huge).await.is_err());
    assert_eq!(commands_run(&server), before, "nothing was sent");
    // The limit itself is accepted.
    let at_limit = "k".repeat(MAX_KEY_BYTES);
    reg.lock(at_limit)
        .acquire()
        .await
        .expect("a key of exactly the limit")
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn control_bytes_and_non_ascii_keys_lock_exactly_those_bytes_and_print_escaped() {
    let server = RedisServer::start();
    let (a, b) = (registry(&server.url()), registry(&server.url()));
    let mut con = raw(&server.url()).await;
    for key in [
        "tab\there\nnewline\r\0nul\u{7f}",
        "ключ:数据:🔒",
        "e\u{301}", // 'e' + combining accent: not the same bytes as 'é'
        "é",
        " ",
    ] {
        let guard = a
            .lock(key)
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        // The Redis key is the prefix plus exactly the key's bytes.
        let stored: Option<String> = con.get(format!("lock:{key}").as_bytes()).await.unwrap();
        assert_eq!(stored.as_deref(), Some(guard.token()), "{key:?}");
        // Another owner is excluded from exactly that key, and the message escapes it.
        let err = b.lock(key).acquire().await.unwrap_err();
        assert!(err.is_busy(), "{err:?}");
        let message = err.to_string();
        assert!(
            !message.chars().any(|c| c.is_control()),
            "control bytes are escaped in messages: {message:?}"
        );
        guard.release().await.unwrap();
    }
    // Near-identical keys are different locks.
    let composed = a.lock("é").acquire().await.unwrap();
    let decomposed = b.lock("e\u{301}").acquire().await.unwrap();
    composed.release().await.unwrap();
    decomposed.release().await.unwrap();
    let keys: Vec<String> = con.keys("lock:*").await.unwrap();
    assert!(keys.is_empty(), "every lock was released: {keys:?}");
}

/// Fills `key` with a value of `kind` and returns a snapshot to compare with later.
async fn plant(con: &mut redis::aio::MultiplexedConnection, key: &str, kind: &str) -> String {
    let _: () = match kind {
        "list" => con.rpush(key, "payload").await.unwrap(),
        "hash" => con.hset(key, "field", "payload").await.unwrap(),
        "set" => con.sadd(key, "payload").await.unwrap(),
        "zset" => con.zadd(key, "payload", 1).await.unwrap(),
        "stream" => redis::cmd("XADD")
            .arg(key)
            .arg("1-1")
            .arg("f")
            .arg("payload")
            .query_async::<String>(con)
            .await
            .map(|_| ())
            .unwrap(),
        other => panic!("unknown kind {other}"),
    };
    snapshot(con, key).await
}

async fn snapshot(con: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
    let (kind, ttl, dump): (String, i64, Vec<u8>) = redis::pipe()
        .cmd("TYPE")
        .arg(key)
        .cmd("PTTL")
        .arg(key)
        .cmd("DUMP")
        .arg(key)
        .query_async(con)
        .await
        .unwrap();
    format!("{kind} ttl={ttl} {dump:?}")
}

#[tokio::test]
async fn a_key_holding_another_type_is_a_clear_error_and_the_foreign_data_stays_untouched() {
    let server = RedisServer::start();
    let reg = registry(&server.url());
    let mut con = raw(&server.url()).await;
    for kind in ["list", "hash", "set", "zset", "stream"] {
        let key = format!("jobs-{kind}");
        let redis_key = format!("lock:{key}");
        let before = plant(&mut con, &redis_key, kind).await;
        for fencing in [false, true] {
            let err = reg
                .lock(key.clone())
                .fencing(fencing)
                .wait(Duration::from_millis(300))
                .acquire()
                .await
                .unwrap_err();
            let reason = invalid_key_reason(&err);
            assert!(
                reason.contains(&format!("holds a {kind}, not a lock"))
                    && reason.contains("left untouched"),
                "{kind}, fencing {fencing}: {err}"
            );
        }
        // Nor is it taken for a semaphore.
        let err = reg
            .lock(key.clone())
            .permits(2)
            .acquire()
            .await
            .unwrap_err();
        let reason = invalid_key_reason(&err);
        assert!(
            reason.contains(&format!("holds a {kind}, not a lock")),
            "{kind}, permits: {err}"
        );
        // Reading and the operator's force-unlock leave it alone too.
        let info = reg.inspect(&key).await.unwrap();
        assert_eq!(info.owner, None, "{kind}");
        assert!(!reg.force_unlock(&key).await.unwrap(), "{kind}");
        assert_eq!(
            snapshot(&mut con, &redis_key).await,
            before,
            "{kind} untouched"
        );
        let fence: Option<String> = con.get(format!("fence:{{{redis_key}}}")).await.unwrap();
        assert_eq!(fence, None, "no fencing token was spent on a refused key");
    }
}

#[tokio::test]
async fn a_fencing_counter_holding_another_type_fails_clearly_and_leaves_no_lock_behind() {
    let server = RedisServer::start();
    let reg = registry(&server.url());
    let mut con = raw(&server.url()).await;
    let before = plant(&mut con, "fence:{lock:billing}", "hash").await;
    let ttl = Duration::from_millis(800);
    let err = reg
        .lock("billing")
        .ttl(ttl)
        .fencing(true)
        .acquire()
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("`billing`") && message.contains("`DEL fence:{lock:billing}`"),
        "names the lock, the counter and what to do: {message}"
    );
    assert_eq!(snapshot(&mut con, "fence:{lock:billing}").await, before);
    // The counter is checked before anything is written: no lock was set.
    let exists: bool = con.exists("lock:billing").await.unwrap();
    assert!(!exists, "no lock was set");
    // Without fencing the counter is not involved.
    reg.lock("billing")
        .acquire()
        .await
        .expect("a plain lock ignores the counter")
        .release()
        .await
        .unwrap();
}

/// Every key in the database, in order: its type, whether it has an expiry (`no expiry`
/// otherwise) and its value.
async fn every_key(con: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let mut keys: Vec<String> = con.keys("*").await.unwrap();
    keys.sort();
    let mut all = Vec::new();
    for key in keys {
        let (kind, ttl, dump): (String, i64, Vec<u8>) = redis::pipe()
            .cmd("TYPE")
            .arg(&key)
            .cmd("PTTL")
            .arg(&key)
            .cmd("DUMP")
            .arg(&key)
            .query_async(con)
            .await
            .unwrap();
        let expiry = if ttl > 0 { "expires" } else { "no expiry" };
        all.push(format!("{key}: {kind} {expiry} {dump:?}"));
    }
    all
}

/// A key the library keeps beside a lock (its fencing counter, the waiters' queue and the
/// queue's hash) that holds something the library did not write fails the acquisition before
/// anything is written, with an `InvalidKey` error that names that key and says to delete it:
/// no lock is set, no other counter moves, and no key is left without an expiry. Deleted, the
/// next acquisition works and leaves every key with an expiry.
#[tokio::test]
async fn a_corrupt_counter_or_queue_fails_the_acquisition_naming_it_and_changes_nothing() {
    let server = RedisServer::start();
    let reg = registry(&server.url());
    let mut con = raw(&server.url()).await;
    let plants: [(&str, &str); 6] = [
        ("fence:{lock:a}", "hash"),
        ("fence:{lock:a}", "abc"),
        ("fence:{lock:a}", "12.5"),
        ("fence:{lock:a}", "99999999999999999999"),
        ("queue:{lock:a}", "string"),
        ("queued:{lock:a}", "list"),
    ];
    for (planted, what) in plants {
        let counter = planted.starts_with("fence:");
        // "0" sorts first: a multi-key lock would take its counter before the bad one.
        let shapes: &[&[&str]] = if counter {
            &[&["a"], &["0", "a"]]
        } else {
            &[&["a"]]
        };
        for keys in shapes {
            let _: () = redis::cmd("FLUSHDB").query_async(&mut con).await.unwrap();
            let _: () = match what {
                "hash" => con.hset(planted, "field", "payload").await.unwrap(),
                "list" => con.rpush(planted, "payload").await.unwrap(),
                "string" => con.set(planted, "payload").await.unwrap(),
                value => con.set(planted, value).await.unwrap(),
            };
            // The other key's counter has a token already.
            if keys.len() > 1 {
                reg.lock(keys[0])
                    .fencing(true)
                    .acquire()
                    .await
                    .unwrap()
                    .release()
                    .await
                    .unwrap();
            }
            let before = every_key(&mut con).await;
            let err = reg
                .lock_all(keys.iter().copied())
                .fencing(true)
                .acquire()
                .await
                .unwrap_err();
            let reason = invalid_key_reason(&err);
            assert!(
                reason.contains(&format!("`{planted}`"))
                    && reason.contains(&format!("DEL {planted}")),
                "{planted} = {what}, {keys:?}: {err}"
            );
            assert_eq!(
                every_key(&mut con).await,
                before,
                "{planted} = {what}, {keys:?}: nothing changed"
            );
            let err = reg.inspect("a").await.unwrap_err();
            assert!(
                invalid_key_reason(&err).contains(&format!("`{planted}`")),
                "inspect: {err}"
            );
            // What the error says to do.
            let _: () = con.del(planted).await.unwrap();
            let guard = reg
                .lock_all(keys.iter().copied())
                .fencing(true)
                .acquire()
                .await
                .unwrap();
            for key in every_key(&mut con).await {
                assert!(
                    !key.contains("no expiry"),
                    "{planted} = {what}, {keys:?}: {key}"
                );
            }
            guard.release().await.unwrap();
        }
    }
}

#[tokio::test]
async fn a_zero_ttl_is_refused_and_so_is_one_beyond_what_redis_takes() {
    let server = RedisServer::start();
    let reg = registry(&server.url());
    let before = commands_run(&server);
    for ttl in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::from_secs(365 * 24 * 3600) + Duration::from_millis(1),
        Duration::from_secs(u64::MAX / 1000),
        Duration::MAX,
    ] {
        let err = reg.lock("k").ttl(ttl).acquire().await.unwrap_err();
        assert!(
            matches!(err, LockError::InvalidOptions { .. }) && err.to_string().contains("`ttl`"),
            "{ttl:?}: {err:?}"
        );
    }
    for min_hold in [Duration::ZERO, Duration::MAX] {
        let err = reg
            .lock("k")
            .min_hold(min_hold)
            .acquire()
            .await
            .unwrap_err();
        assert!(err.to_string().contains("`min_hold`"), "{err}");
    }
    assert_eq!(commands_run(&server), before, "nothing was sent");
    // The largest accepted ttl reaches Redis intact.
    let year = Duration::from_secs(365 * 24 * 3600);
    let guard = reg.lock("k").ttl(year).acquire().await.unwrap();
    let mut con = raw(&server.url()).await;
    let pttl: i64 = con.pttl("lock:k").await.unwrap();
    let year_ms = i64::try_from(year.as_millis()).unwrap();
    assert!(pttl > year_ms - 60_000 && pttl <= year_ms, "{pttl}");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_ttl_too_short_to_outlast_its_drift_margin_is_refused_with_the_minimum() {
    let server = RedisServer::start();
    let reg = registry(&server.url());
    let before = commands_run(&server);
    // The local deadline is ttl minus drift (ttl/100 + 2 ms): these leases would be lost at birth.
    for ms in [1, 2, 9] {
        let err = reg
            .lock("k")
            .ttl(Duration::from_millis(ms))
            .acquire()
            .await
            .unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(err, LockError::InvalidOptions { .. })
                && message.contains("`ttl`")
                && message.contains("10 ms")
                && message.contains("drift"),
            "{ms} ms: says the minimum and why: {message}"
        );
    }
    assert_eq!(commands_run(&server), before, "nothing was sent");
    let minimum = reg
        .lock("k")
        .ttl(Duration::from_millis(10))
        .renew(false)
        .acquire()
        .await;
    // On a loaded machine a 10 ms lease can run out before its reply is read: given up as
    // untrustworthy then, never refused as invalid.
    if let Err(err) = minimum {
        assert!(
            !matches!(err, LockError::InvalidOptions { .. }),
            "the minimum itself is accepted: {err}"
        );
    }
}

#[tokio::test]
async fn a_wait_beyond_the_clock_range_is_an_error_or_waits_but_never_panics() {
    let server = RedisServer::start();
    let reg = registry(&server.url());
    let held = reg.lock("k").acquire().await.unwrap();
    // Duration::MAX is the natural way to say "wait as long as it takes".
    let waiter = tokio::spawn({
        let reg = reg.clone();
        async move { reg.lock("k").wait(Duration::MAX).acquire().await }
    });
    tokio::task::yield_now().await;
    held.release().await.unwrap();
    let outcome = waiter.await.expect("the waiter must not panic");
    match outcome {
        Ok(guard) => guard.release().await.unwrap(),
        Err(err) => assert!(matches!(err, LockError::InvalidOptions { .. }), "{err:?}"),
    }
}

#[tokio::test]
async fn a_max_hold_beyond_the_clock_range_is_an_error_or_ignored_but_never_kills_the_keeper() {
    let server = RedisServer::start();
    let reg = registry(&server.url());
    let ttl = lock_tests::RENEWED_TTL;
    let outcome = reg
        .lock("k")
        .ttl(ttl)
        .max_hold(Duration::MAX)
        .acquire()
        .await;
    if let Err(err) = outcome {
        assert!(matches!(err, LockError::InvalidOptions { .. }), "{err:?}");
        return;
    }
    let guard = outcome.unwrap();
    // Another lock of the same registry must keep being renewed: the keeper is shared.
    let other = reg.lock("other").ttl(ttl).acquire().await.unwrap();
    tokio::time::sleep(ttl * 2).await;
    assert!(!other.is_lost(), "the lease keeper died");
    assert!(!guard.is_lost(), "the lease keeper died");
    other.release().await.unwrap();
    guard.release().await.unwrap();
}

/// Puts the server over its memory limit: junk first, then a `maxmemory` below what it uses.
async fn push_over_maxmemory(con: &mut redis::aio::MultiplexedConnection) {
    let junk = "x".repeat(64 * 1024);
    for i in 0..32 {
        let _: () = con.set(format!("junk:{i}"), &junk).await.unwrap();
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async(con)
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1mb")
        .query_async(con)
        .await
        .unwrap();
    let refused: redis::RedisResult<()> = con.set("junk:more", 1).await;
    assert!(refused.unwrap_err().to_string().contains("OOM"));
}

#[tokio::test]
async fn oom_under_maxmemory_fails_new_locks_clearly_while_held_locks_renew_and_release() {
    let server = RedisServer::start();
    let reg = registry(&server.url());
    let ttl = lock_tests::RENEWED_TTL;
    let held = reg.lock("held").ttl(ttl).acquire().await.unwrap();
    let mut con = raw(&server.url()).await;
    push_over_maxmemory(&mut con).await;
    for fencing in [false, true] {
        let err = reg
            .lock("new")
            .fencing(fencing)
            .acquire()
            .await
            .unwrap_err();
        match &err {
            LockError::Backend { command, .. } => assert_eq!(*command, "acquire"),
            other => panic!("expected a backend error, got {other:?}"),
        }
        assert!(err.to_string().contains("OOM"), "says why: {err}");
    }
    let exists: bool = con.exists("lock:new").await.unwrap();
    assert!(!exists, "nothing was written");
    // Renewal (PEXPIRE) and release (DEL) need no memory: the held lock survives 2 ttls.
    tokio::time::sleep(ttl * 2).await;
    assert!(!held.is_lost(), "renewals kept working under OOM");
    held.release().await.expect("release works under OOM");
    let exists: bool = con.exists("lock:held").await.unwrap();
    assert!(!exists);
}

#[tokio::test]
async fn a_read_only_replica_refuses_clearly_and_nothing_is_written_there() {
    let master = RedisServer::start();
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let reg = registry(&replica.url());
    for fencing in [false, true] {
        let err = reg.lock("k").fencing(fencing).acquire().await.unwrap_err();
        match &err {
            LockError::Backend { command, .. } => assert_eq!(*command, "acquire"),
            other => panic!("expected a backend error, got {other:?}"),
        }
        assert!(
            err.to_string().contains("read only replica"),
            "says why: {err}"
        );
    }
    let mut con = raw(&replica.url()).await;
    let keys: Vec<String> = con.keys("*").await.unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}

#[tokio::test]
async fn scripts_flushed_from_the_server_are_reloaded_transparently() {
    let server = RedisServer::start();
    let reg = registry(&server.url());
    let ttl = lock_tests::RENEWED_TTL;
    let first = reg
        .lock("k")
        .fencing(true)
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    let mut con = raw(&server.url()).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .unwrap();
    // Renewal, release, a fenced acquisition, inspection and force-unlock all run scripts.
    tokio::time::sleep(ttl * 2).await;
    assert!(!first.is_lost(), "renewals reloaded the script");
    let first_fence = first.fence().unwrap();
    first.release().await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .unwrap();
    let second = reg.lock("k").fencing(true).acquire().await.unwrap();
    assert!(second.fence().unwrap() > first_fence);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(reg.inspect("k").await.unwrap().fence, second.fence());
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(reg.force_unlock("k").await.unwrap());
    let calls = command_calls(&mut server.connection());
    assert!(
        calls.get("script|load").copied().unwrap_or(0) > 5,
        "reloaded after each flush: {calls:?}"
    );
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_lost_mid_acquire_is_retried_with_the_same_token_and_yields_one_lock() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let reg = registry(&proxy.url());
    // Connect first, so the lost reply is the acquisition's and not the handshake's.
    lock_tests::warm_up(&reg).await;
    for fencing in [false, true] {
        let key = format!("k{}", u8::from(fencing));
        proxy.drop_replies();
        let acquire = tokio::spawn({
            let (reg, key) = (reg.clone(), key.clone());
            async move {
                reg.lock(key)
                    .fencing(fencing)
                    .ttl(Duration::from_secs(30))
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
            }
        });
        // The SET ran on the server; its reply is gone. Then the connection breaks.
        let dropped = proxy.stats().replies_dropped();
        proxy.replies_dropped_at_least(dropped + 1).await;
        proxy.heal();
        let guard = acquire.await.unwrap().expect("the retry takes the lock");
        let info = reg.inspect(&key).await.unwrap();
        assert_eq!(
            info.owner.as_deref(),
            Some(guard.token()),
            "the retry recognised its own token instead of waiting for itself"
        );
        if fencing {
            // The lost attempt's token was spent; the one handed out is newer.
            assert!(guard.fence().unwrap() >= 1);
            assert_eq!(info.fence, guard.fence());
        }
        guard.release().await.unwrap();
        assert_eq!(reg.inspect(&key).await.unwrap().owner, None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_gave_up_after_a_lost_reply_leaves_no_lock_beyond_its_ttl() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let reg = registry(&proxy.url());
    lock_tests::warm_up(&reg).await;
    let ttl = Duration::from_millis(1500);
    proxy.drop_replies();
    // No waiting: the first failure is final, and the caller is told.
    let err = reg.lock("k").ttl(ttl).acquire().await.unwrap_err();
    assert!(
        matches!(
            err,
            LockError::Backend {
                command: "acquire",
                ..
            }
        ),
        "{err:?}"
    );
    // The SET did run on the server...
    let calls = command_calls(&mut server.connection());
    assert!(calls.get("set").copied().unwrap_or(0) >= 1, "{calls:?}");
    // ...so the lock exists with an expiry no longer than its ttl, unless the runtime's
    // clean-up (an owner-checked release, whose request still gets through) already ran.
    let mut con = raw(&server.url()).await;
    let pttl: i64 = con.pttl("lock:k").await.unwrap();
    assert!(pttl == -2 || (pttl > 0 && pttl <= 1500), "{pttl}");
    proxy.heal();
    // The runtime releases the orphan in the background once Redis answers again; at worst it
    // expires by its ttl. Either way a new owner gets it within the ttl.
    let other = registry(&server.url());
    let guard = other
        .lock("k")
        .wait(ttl + Duration::from_millis(200))
        .acquire()
        .await
        .expect("the orphan is gone within its ttl");
    guard.release().await.unwrap();
}

#[test]
fn a_zero_timeout_is_refused_when_the_registry_is_built() {
    for (which, builder) in [
        (
            "connect_timeout",
            Registry::builder().connect_timeout(Duration::ZERO),
        ),
        (
            "command_timeout",
            Registry::builder().command_timeout(Duration::ZERO),
        ),
    ] {
        let message = configure_message(builder.url("redis://127.0.0.1:1/").build());
        assert!(
            message.contains(which) && message.contains("zero"),
            "names the option and why: {message}"
        );
    }
}

#[test]
fn a_url_that_is_not_a_redis_url_is_refused_without_showing_its_password() {
    for url in [
        "http://u:s3cret@10.0.0.1:6379/",
        "redis://u:s3cret@[::1:6379/",
    ] {
        let message = configure_message(Registry::builder().url(url).build());
        assert!(
            message.contains("not a valid Redis URL") && message.contains("redis://[user"),
            "says what a URL looks like: {message}"
        );
        assert!(!message.contains("s3cret"), "{message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_beyond_a_day_are_clamped_so_waiting_never_overflows() {
    let server = RedisServer::start();
    // `Duration::MAX` is the natural way to say "no timeout".
    let reg = Registry::builder()
        .url(server.url())
        .connect_timeout(Duration::MAX)
        .command_timeout(Duration::MAX)
        .build()
        .expect("a huge timeout is clamped, not refused");
    let held = reg.lock("k").acquire().await.unwrap();
    let waiter = tokio::spawn({
        let reg = reg.clone();
        async move { reg.lock("k").wait(Duration::from_secs(60)).acquire().await }
    });
    // The waiter's subscriber connects with these timeouts: it must subscribe, not panic.
    eventually(Duration::from_secs(30), "the waiter subscribed", || async {
        subscribers(&server.url(), "lock:k").await == 1
    })
    .await;
    held.release().await.unwrap();
    let next = waiter
        .await
        .expect("the waiter must not panic")
        .expect("woken by the release");
    next.release().await.unwrap();
}

/// A configuration error's message; it is its own variant, final, and does not send the user
/// to check a server that was never contacted.
fn configure_message(result: Result<Registry, LockError>) -> String {
    match result {
        Err(err @ LockError::InvalidConfig { .. }) => {
            assert!(!err.is_transient(), "{err:?}");
            let message = err.to_string();
            assert!(!message.contains("reachable"), "{message}");
            message
        }
        Err(other) => panic!("expected a configuration error, got {other:?}"),
        Ok(registry) => panic!("expected a configuration error, got {registry:?}"),
    }
}

#[test]
fn an_empty_entry_in_a_node_list_is_refused_naming_its_position() {
    let a = "redis://10.0.0.1:6379/";
    let b = "redis://10.0.0.2:6379/";
    let c = "redis://10.0.0.3:6379/";
    let cases = [
        (
            "Redlock node",
            Registry::builder().redlock([a, b, c, ""]),
            4,
        ),
        (
            "Redlock node",
            Registry::builder().redlock([a, " ", b, c]),
            2,
        ),
        ("cluster seed", Registry::builder().cluster([a, "", b]), 2),
        (
            "sentinel",
            Registry::builder().sentinel("mymaster", ["", a]),
            1,
        ),
    ];
    for (what, builder, position) in cases {
        let message = configure_message(builder.build());
        assert!(
            message.contains(what) && message.contains(&format!("entry {position} ")),
            "names the list and the empty entry's position: {message}"
        );
    }
}

#[test]
fn a_redlock_of_fewer_than_three_nodes_is_refused_with_advice() {
    for nodes in [
        vec!["redis://u:pw@10.0.0.1:6379/"],
        vec!["redis://u:pw@10.0.0.1:6379/", "redis://u:pw@10.0.0.2:6379/"],
    ] {
        let message = configure_message(Registry::builder().redlock(nodes.clone()).build());
        assert!(
            message.contains(&format!("{} node", nodes.len()))
                && message.contains("single server")
                && message.contains("3 or 5"),
            "says why and what to use instead: {message}"
        );
        assert!(!message.contains("pw"), "{message}");
    }
}

#[test]
fn duplicate_redlock_nodes_are_refused_naming_the_duplicate_without_its_password() {
    for (first, again) in [
        ("redis://u:pw@10.0.0.1:6379/", "redis://u:pw@10.0.0.1:6379/"),
        // Another database on the same server fails with it: not an independent node.
        (
            "redis://u:pw@10.0.0.1:6379/0",
            "redis://u:other-pw@10.0.0.1:6379/2",
        ),
    ] {
        let nodes = [first, "redis://u:pw@10.0.0.2:6379/", again];
        let message = configure_message(Registry::builder().redlock(nodes).build());
        assert!(
            message.contains("10.0.0.1:6379")
                && message.contains("entries 1 and 3")
                && message.contains("independent"),
            "names the duplicate: {message}"
        );
        assert!(!message.contains("pw"), "{message}");
    }
}

/// Under `maxmemory`, a release that would hand the lock to a fenced waiter either hands it
/// over (the lock and counter written in the waiter's name) or tells the waiter nothing: a
/// waiter is never granted a lock that Redis still holds in its releaser's name. (The handoff's
/// message goes out before its first write, and the first write, the fencing counter's `SET`,
/// is the one Redis refuses when over its memory limit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_oom_a_fenced_waiter_is_never_granted_a_lock_the_release_did_not_hand_over() {
    let server = RedisServer::start();
    let holder = registry(&server.url());
    let waiter = registry(&server.url());
    let ttl = Duration::from_secs(30);
    let held = holder
        .lock("handed")
        .ttl(ttl)
        .fencing(true)
        .acquire()
        .await
        .unwrap();
    let mut waiting = tokio::spawn(async move {
        waiter
            .lock("handed")
            .ttl(ttl)
            .fencing(true)
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    });
    eventually(Duration::from_secs(10), "the waiter queued", || async {
        holder.inspect("handed").await.unwrap().waiters == 1
    })
    .await;
    let mut con = raw(&server.url()).await;
    push_over_maxmemory(&mut con).await;
    let released = held.release_now().await;
    // A grant is published at once by the release: a waiter told nothing still waits then.
    let Ok(outcome) = tokio::time::timeout(Duration::from_secs(3), &mut waiting).await else {
        waiting.abort();
        return;
    };
    let guard = outcome.expect("task").expect("the waiter's acquire");
    let value: Option<String> = con.get("lock:handed").await.unwrap();
    let counter: Option<String> = con.get("fence:{lock:handed}").await.unwrap();
    assert!(
        value
            .as_deref()
            .is_some_and(|v| v.starts_with(guard.token())),
        "the waiter was granted the lock (fence {:?}) but Redis holds {value:?} (counter \
         {counter:?}); the release said {released:?}",
        guard.fence()
    );
}

/// A counter the scripts accept (digits, below 2^53) never becomes, through the library's own
/// next token, one they refuse: at the top of the range the acquisition is refused before it
/// writes, or the lock can be taken again after it, with a greater token.
#[tokio::test]
async fn a_counter_at_the_top_of_its_range_is_never_turned_into_one_the_library_refuses() {
    let server = RedisServer::start();
    let reg = registry(&server.url());
    let mut con = raw(&server.url()).await;
    let top = (1u64 << 53) - 1;
    let _: () = con.set("fence:{lock:top}", top.to_string()).await.unwrap();
    let Ok(first) = reg.lock("top").fencing(true).acquire().await else {
        return;
    };
    let first_fence = first.fence().unwrap();
    first.release().await.unwrap();
    let written: String = con.get("fence:{lock:top}").await.unwrap();
    let second = reg.lock("top").fencing(true).acquire().await;
    assert!(
        second.as_ref().is_ok_and(|g| g.fence() > Some(first_fence)),
        "the library handed out {first_fence} and wrote {written} to the counter, then: {second:?}"
    );
}

/// A prefix made only of `{`: lock `b` (`{b`, untagged) would keep its companions at
/// `<namespace>{{b}`, the very names lock `{b}` (`{{b}`, tagged) keeps its own at, so two locks
/// would share a fencing counter, a waiters' queue and a note of how long they are held. Any
/// other prefix, one with a hash tag too, names each lock's companions apart (found by an
/// attack on the notes of how long a lock is held).
#[test]
fn a_registry_prefix_under_which_two_locks_would_share_companions_is_refused() {
    let build = |prefix: &str| {
        lock_runtime::Registry::builder()
            .url("redis://127.0.0.1:1/")
            .prefix(prefix)
            .build()
    };
    for prefix in ["{", "{{{"] {
        let err = build(prefix).expect_err(prefix);
        assert!(err.to_string().contains("only of `{`"), "{prefix}: {err}");
    }
    for prefix in ["since:", "sin"] {
        let err = build(prefix).expect_err(prefix);
        assert!(err.to_string().contains("`since:`"), "{prefix}: {err}");
    }
    for prefix in ["{app}:", "{:", "lock{:"] {
        assert!(build(prefix).is_ok(), "{prefix}");
    }
}

/// A registry prefix under which a lock key could be the record where a `FencedKey` keeps its
/// highest token (`fenced:{data key}`): the lock's `SET` would overwrite the application's
/// record, and a stale writer's token would pass again. Refused as the counters' and queues'
/// namespaces are (found by an attack on the shared key names).
#[test]
fn a_registry_prefix_that_could_name_a_fenced_keys_record_is_refused() {
    let record = lock_runtime::FencedKey::new("k");
    assert_eq!(record.key(), "k");
    for prefix in ["fenced:", "fenced", "fenced:{"] {
        let err = lock_runtime::Registry::builder()
            .url("redis://127.0.0.1:1/")
            .prefix(prefix)
            .build()
            .expect_err(prefix);
        assert!(err.to_string().contains("`fenced:`"), "{prefix}: {err}");
    }
    assert!(lock_runtime::Registry::builder()
        .url("redis://127.0.0.1:1/")
        .prefix("fencedlock:")
        .build()
        .is_ok());
}
