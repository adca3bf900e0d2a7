use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockError, LostReason, Mode, OnLost};
use lock_tests::{command_counts, has_set_ifeq, RedisServer};
use redis::AsyncCommands;

use super::support::{assert_lost, eventually, raw, registry, spawn_hung_body};

#[tokio::test]
async fn renewal_keeps_a_lock_past_three_ttls() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let ttl = lock_tests::RENEWED_TTL;
    let guard = reg.lock("long").ttl(ttl).acquire().await.unwrap();
    // Time passing is the point of this test: without renewal the key would be gone.
    tokio::time::sleep(ttl * 3).await;
    assert!(!guard.is_lost());
    let mut con = raw(&server.url()).await;
    let value: Option<String> = con.get("lock:long").await.unwrap();
    assert_eq!(value.as_deref(), Some(guard.token()));
    guard.release().await.expect("still ours");
}

/// Where the server has `SET .. IFEQ` (Valkey), an exclusive lock's renewals are that command:
/// the first round renews by the script (which notes how long the lock has been held, with a
/// `SET` of its own) with one `SET .. IFEQ` pipelined as the probe, every later one by
/// `SET .. IFEQ` alone. Elsewhere (Redis 7) that one probe is refused and every renewal is the
/// script. Either way the lock stays held and renewed.
#[tokio::test]
async fn exclusive_locks_renew_with_set_ifeq_where_the_server_has_it_else_with_the_script() {
    let server = RedisServer::start();
    let url = server.url();
    let ifeq = has_set_ifeq(&url).await;
    let reg = registry(&server);
    // Renewed every 500 ms: the counts below are read long before the first renewal.
    let ttl = Duration::from_millis(1500);
    let guard = reg.lock("renewed").ttl(ttl).acquire().await.unwrap();
    let (set_before, set_failed_before) = command_counts(&url, "set").await;
    let (evalsha_before, _) = command_counts(&url, "evalsha").await;
    let (renewing, at_least) = if ifeq {
        // The probe and the first renewal's note, then two renewals by SET alone.
        ("set", set_before + 4)
    } else {
        ("evalsha", evalsha_before + 3)
    };
    eventually(Duration::from_secs(10), "three renewals", || async {
        command_counts(&url, renewing).await.0 >= at_least
    })
    .await;
    let (set, set_failed) = command_counts(&url, "set").await;
    let (evalsha, _) = command_counts(&url, "evalsha").await;
    if ifeq {
        assert_eq!(
            evalsha - evalsha_before,
            1,
            "the first renewal: no later script call renews a plain lock"
        );
        assert_eq!(set_failed, set_failed_before, "every SET IFEQ was taken");
    } else {
        assert_eq!(
            set - set_before,
            2,
            "SET IFEQ is tried once, then never again (the other SET: the first renewal's note)"
        );
        assert_eq!(set_failed - set_failed_before, 1, "and refused");
    }
    assert!(!guard.is_lost());
    let mut con = raw(&url).await;
    let value: Option<String> = con.get("lock:renewed").await.unwrap();
    assert_eq!(value.as_deref(), Some(guard.token()));
    let pttl: i64 = con.pttl("lock:renewed").await.unwrap();
    assert!(pttl > 0 && pttl <= 1500, "{pttl}");
    guard.release().await.expect("still ours");
}

/// A plain lock whose key now holds application data (a sorted set): lost as `Stolen`, the data
/// untouched. With `SET .. IFEQ` the key answers `WRONGTYPE`, and the script decides, as before.
#[tokio::test]
async fn a_plain_lock_whose_key_became_a_foreign_sorted_set_is_stolen_and_the_set_untouched() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let guard = reg
        .lock("became-data")
        .ttl(lock_tests::RENEWED_TTL)
        .acquire()
        .await
        .unwrap();
    let mut con = raw(&server.url()).await;
    let _: () = redis::pipe()
        .atomic()
        .del("lock:became-data")
        .zadd("lock:became-data", "payload", 1)
        .query_async(&mut con)
        .await
        .unwrap();
    let err = guard.lost().await;
    assert_lost(&err, LostReason::Stolen);
    let members: Vec<(String, f64)> = con
        .zrange_withscores("lock:became-data", 0, -1)
        .await
        .unwrap();
    assert_eq!(members, vec![("payload".to_owned(), 1.0)]);
    let pttl: i64 = con.pttl("lock:became-data").await.unwrap();
    assert_eq!(pttl, -1, "no expiry was set on the data");
}

/// One renewal round with a plain lock (`SET .. IFEQ` where the server has it) and a read lock
/// (always the script): both stay held past three ttls.
#[tokio::test]
async fn a_plain_lock_and_a_read_lock_renewed_in_one_round_both_stay_held() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let ttl = lock_tests::RENEWED_TTL;
    let plain = reg.lock("plain").ttl(ttl).acquire().await.unwrap();
    let reader = reg
        .lock("shared")
        .mode(Mode::Read)
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    // Time passing is the point of this test: without renewal both keys would be gone.
    tokio::time::sleep(ttl * 3).await;
    assert!(!plain.is_lost() && !reader.is_lost());
    let mut con = raw(&server.url()).await;
    let value: Option<String> = con.get("lock:plain").await.unwrap();
    assert_eq!(value.as_deref(), Some(plain.token()));
    let deadline: Option<f64> = con.zscore("lock:shared", reader.token()).await.unwrap();
    assert!(deadline.is_some(), "the reader's place is still there");
    plain.release().await.expect("still ours");
    reader.release().await.expect("still ours");
}

struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_key_deleted_behind_the_holders_back_cancels_the_body_with_lost() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let dropped = Arc::new(AtomicBool::new(false));
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let flag = DropFlag(dropped.clone());
    let run = reg
        .lock("stolen")
        .ttl(lock_tests::RENEWED_TTL)
        .run(async move {
            let _flag = flag;
            started_tx.send(()).unwrap();
            std::future::pending::<Result<(), LockError>>().await
        });
    let run = tokio::spawn(run);
    started.await.unwrap();
    let mut con = raw(&server.url()).await;
    let _: () = con.del("lock:stolen").await.unwrap();
    let err = run.await.unwrap().unwrap_err();
    assert!(
        // Regression (issue 10, item 11): a key that is simply gone was reported `Stolen`.
        matches!(err, LockError::Lost { reason: LostReason::Gone, ref key } if key == "stolen"),
        "{err:?}"
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the body future was dropped"
    );
}

#[tokio::test]
async fn an_overwritten_key_is_lost_and_the_foreign_lock_is_neither_extended_nor_deleted() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let guard = reg
        .lock("taken")
        .ttl(lock_tests::RENEWED_TTL)
        .acquire()
        .await
        .unwrap();
    let mut con = raw(&server.url()).await;
    let _: () = redis::cmd("SET")
        .arg("lock:taken")
        .arg("someone-else")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut con)
        .await
        .unwrap();
    let err = guard.lost().await;
    assert_lost(&err, LostReason::Stolen);
    // The keeper's failed renewal must not have touched the foreign lock.
    let pttl: i64 = con.pttl("lock:taken").await.unwrap();
    assert!(pttl <= 60_000 && pttl > 50_000, "{pttl}");
    // Nor may the owner's release.
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, LockError::NotOwner { .. }), "{err:?}");
    let value: String = con.get("lock:taken").await.unwrap();
    assert_eq!(value, "someone-else");
}

#[tokio::test]
async fn on_lost_continue_lets_the_body_finish_and_reports() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let server_url = server.url();
    let out = reg
        .lock("continue")
        .ttl(lock_tests::RENEWED_TTL)
        .on_lost(OnLost::Continue)
        .run(async move {
            let current = lock_runtime::current().unwrap();
            let mut con = raw(&server_url).await;
            let _: () = con.del("lock:continue").await.unwrap();
            let err = current.lost().await;
            assert!(current.is_lost());
            Ok::<_, LockError>(format!("finished after: {err}"))
        })
        .await
        .expect("continue returns the body's result");
    assert!(
        out.starts_with("finished after: lost the lock `continue`"),
        "{out}"
    );
}

#[tokio::test]
async fn renew_off_ends_the_lease_at_its_ttl_and_cancels_the_body_first() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let request = reg
        .lock("short")
        .ttl(Duration::from_millis(200))
        .renew(false);
    let err = spawn_hung_body(request).await.await.unwrap().unwrap_err();
    assert_lost(&err, LostReason::NotRenewed);
}

#[tokio::test]
async fn max_hold_stops_renewal_so_a_hung_body_loses_the_lock() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let request = reg
        .lock("hung")
        .ttl(lock_tests::RENEWED_TTL)
        .max_hold(lock_tests::RENEWED_TTL * 3 / 2);
    let err = spawn_hung_body(request).await.await.unwrap().unwrap_err();
    assert_lost(&err, LostReason::MaxHold);
}

#[tokio::test]
async fn min_hold_keeps_the_key_after_success_and_releases_at_once_after_an_error() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let mut con = raw(&server.url()).await;
    reg.lock("daily")
        .min_hold(Duration::from_secs(3600))
        .run(async { Ok::<_, LockError>(()) })
        .await
        .unwrap();
    let pttl: i64 = con.pttl("lock:daily").await.unwrap();
    assert!(
        pttl > 3_500_000,
        "kept for the rest of the hour, got {pttl} ms"
    );
    assert!(reg.lock("daily").acquire().await.unwrap_err().is_busy());
    assert!(
        reg.held().is_empty(),
        "kept on the server, but no longer held or renewed"
    );

    let failed: Result<(), LockError> = reg
        .lock("retry-me")
        .min_hold(Duration::from_secs(3600))
        .run(async {
            Err(LockError::NotOwner {
                key: "stand-in for the job's own error".into(),
            })
        })
        .await;
    assert!(failed.is_err());
    let exists: bool = con.exists("lock:retry-me").await.unwrap();
    assert!(
        !exists,
        "a failed run releases at once so another replica can retry"
    );
}

#[tokio::test]
async fn dropping_an_in_flight_guarded_future_releases_the_lock() {
    let server = RedisServer::start();
    let (a, b) = (registry(&server), registry(&server));
    let task = spawn_hung_body(a.lock("dropped")).await;
    task.abort();
    // The release publishes, so this waiter wakes on it rather than on the 30 s ttl.
    let guard = b
        .lock("dropped")
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("released by the dropped future");
    let info = b.inspect("dropped").await.unwrap();
    assert_eq!(info.owner.as_deref(), Some(guard.token()));
    assert!(
        info.remaining.unwrap() > Duration::from_secs(25),
        "not freed by expiry"
    );
    // The waiter is woken by the release script's publish, before the releasing process has
    // read the script's reply, so the bookkeeping is awaited rather than asserted at once.
    eventually(
        Duration::from_secs(5),
        "the dropped lease is forgotten once the server confirmed",
        || std::future::ready(a.held().is_empty()),
    )
    .await;
}

#[tokio::test]
async fn a_holder_process_killed_without_releasing_frees_the_lock_within_its_ttl() {
    let server = RedisServer::start();
    let bin = env!("CARGO_BIN_EXE_lock-holder");
    let mut holder = lock_tests::start_holder(bin, &server.url(), "vanishing", 1000, None);
    holder.kill().unwrap();
    holder.wait().unwrap();

    let reg = registry(&server);
    let err = reg.lock("vanishing").acquire().await.unwrap_err();
    let LockError::Busy {
        retry_after: Some(left),
        ..
    } = err
    else {
        panic!("the dead holder's lock is still there at first: {err:?}");
    };
    assert!(
        left <= Duration::from_millis(1000),
        "bounded by the ttl: {left:?}"
    );
    // Waiting the ttl plus a margin is enough: nobody renews a dead holder's lock.
    let _held = reg
        .lock("vanishing")
        .wait(Duration::from_millis(1000) + Duration::from_secs(2))
        .acquire()
        .await
        .expect("free within the ttl");
}

/// Regression (issue 10, item 6): a release future dropped while its command was in flight left
/// the lease marked "releasing" forever: never retried, listed by `held()` forever.
#[tokio::test]
async fn a_release_cancelled_in_flight_is_finished_in_the_background() {
    let server = RedisServer::start();
    let proxy = lock_tests::proxy::Proxy::start(server.port());
    let reg = super::support::patient_registry(&proxy.url());
    lock_tests::warm_up(&reg).await;
    let guard = reg
        .lock("k")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    proxy.set_latency(Duration::from_millis(50));
    let cancelled = tokio::time::timeout(Duration::from_millis(10), guard.release()).await;
    assert!(
        cancelled.is_err(),
        "cancelled while the release was in flight"
    );
    proxy.set_latency(Duration::ZERO);
    eventually(
        Duration::from_secs(10),
        "no longer listed as held",
        || async { reg.held().is_empty() },
    )
    .await;
    let mut con = raw(&server.url()).await;
    let left: Option<String> = con.get("lock:k").await.unwrap();
    assert_eq!(
        left, None,
        "released on the server, long before its 60 s ttl"
    );
}

/// A lock whose acquisition reply arrives after its lease could still be trusted is never handed
/// to the caller: neither `acquire` nor `run` returns with it (the body never starts), and the
/// error says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_reply_outlasts_its_lease_is_never_returned_held() {
    let server = RedisServer::start();
    let proxy = lock_tests::proxy::Proxy::start(server.port());
    let reg = super::support::patient_registry(&proxy.url());
    lock_tests::warm_up(&reg).await;
    let ttl = Duration::from_millis(100);
    // A round trip of 160 ms: every reply comes after the 100 ms lease began.
    proxy.set_latency(Duration::from_millis(80));
    let outcome = reg.lock("late").ttl(ttl).acquire().await;
    match outcome {
        Ok(guard) => panic!(
            "a guard whose lease ran out before it was returned (lost: {:?})",
            guard.lost_reason()
        ),
        Err(err) => assert!(err.to_string().contains("ttl"), "{err}"),
    }
    let ran = Arc::new(AtomicBool::new(false));
    let body = {
        let ran = ran.clone();
        async move {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, LockError>(())
        }
    };
    let err = reg.lock("late-run").ttl(ttl).run(body).await.unwrap_err();
    assert!(!ran.load(Ordering::SeqCst), "the body ran: {err}");
}

/// Regression: a shutdown whose caller stopped waiting left its leases listed (and unreleased)
/// for good: the releases it had started are now the keeper's to finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_dropped_midway_leaves_its_releases_to_the_keeper() {
    let server = RedisServer::start();
    let proxy = lock_tests::proxy::Proxy::start(server.port());
    let reg = super::support::patient_registry(&proxy.url());
    let guard = reg.lock("k").acquire().await.unwrap();
    proxy.blackhole();
    let gave_up = tokio::time::timeout(Duration::from_millis(300), reg.shutdown()).await;
    assert!(gave_up.is_err(), "the releases hang in the black hole");
    proxy.heal();
    let con = raw(&server.url()).await;
    eventually(
        Duration::from_secs(10),
        "the lock released and forgotten",
        || {
            let (reg, mut con) = (reg.clone(), con.clone());
            async move {
                let on_server: Option<String> = con.get("lock:k").await.unwrap();
                reg.held().is_empty() && on_server.is_none()
            }
        },
    )
    .await;
    drop(guard);
}

/// The keeper renews a batch within its shortest lease's ttl/3: a long lease due beside short
/// ones gets a batch (and a budget) of its own, so a round trip the short ones cannot afford
/// does not cost the long one its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_lease_is_renewed_apart_from_short_ones_that_cannot_be() {
    let server = RedisServer::start();
    let proxy = lock_tests::proxy::Proxy::start(server.port());
    let reg = super::support::patient_registry(&proxy.url());
    lock_tests::warm_up(&reg).await;
    let long = reg
        .lock("long")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    // A round trip of 200 ms: more than a 300 ms lease's budget (100 ms), well within the long
    // one's (1 s).
    proxy.set_latency(Duration::from_millis(100));
    // Short leases, one after another in four tasks, each kept until it is lost: there is
    // always one due for renewal beside the long one.
    let churn: Vec<_> = (0..4)
        .map(|task| {
            let reg = reg.clone();
            tokio::spawn(async move {
                for i in 0.. {
                    let key = format!("short:{task}:{i}");
                    if let Ok(short) = reg
                        .lock(key)
                        .ttl(Duration::from_millis(300))
                        .acquire()
                        .await
                    {
                        let _ = short.lost().await;
                    }
                }
            })
        })
        .collect();
    // Past the long lease's first deadline had no renewal been confirmed.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for task in churn {
        task.abort();
    }
    assert_eq!(
        long.lost_reason(),
        None,
        "the long lease was renewed all along"
    );
    proxy.heal();
    long.release().await.unwrap();
}

/// A renewal unanswered for a third of the ttl puts the lease at risk while it still holds, on
/// the guard and in `current()`; the renewal's late answer makes it safe again, and nothing was
/// lost. Renewed every second, at risk a second after a renewal went unanswered, lost a second
/// after that: the server is resumed as soon as the risk is seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_unanswered_for_a_third_of_the_ttl_puts_the_lease_at_risk_until_it_is_answered() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let ttl = Duration::from_secs(3);
    let outcome = reg
        .lock("jeopardy")
        .ttl(ttl)
        .run(async {
            let current = lock_runtime::current().expect("inside the body");
            assert!(!current.is_at_risk());
            server.pause();
            tokio::time::timeout(ttl, current.at_risk())
                .await
                .expect("at risk within the ttl");
            let at_risk = (current.is_at_risk(), current.is_lost());
            server.resume();
            tokio::time::timeout(ttl, current.out_of_risk())
                .await
                .expect("out of risk within the ttl");
            Ok::<_, LockError>((at_risk, current.is_at_risk(), current.is_lost()))
        })
        .await;
    assert_eq!(
        outcome.expect("the body ran to its end, the lease held"),
        ((true, false), false, false),
        "(at risk, lost) while paused; at risk and lost after"
    );
    let guard = reg.lock("jeopardy").ttl(ttl).acquire().await.unwrap();
    assert!(!guard.is_at_risk());
    guard
        .release()
        .await
        .expect("free again after the body's release");
}

/// Until another registry holds `key` (it waits for the first holder's key to run out on the
/// server).
async fn taken_by_another(other: &lock_runtime::Registry, key: &str) -> lock_runtime::LockGuard {
    other
        .lock(key)
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("the key runs out on the server")
}

/// A server; a registry that reaches it through a proxy adding `latency` to every reply, warmed
/// up first; and another registry on the server directly.
async fn behind_a_slow_link(
    latency: Duration,
) -> (
    RedisServer,
    lock_tests::proxy::Proxy,
    lock_runtime::Registry,
    lock_runtime::Registry,
) {
    let server = RedisServer::start();
    let proxy = lock_tests::proxy::Proxy::start(server.port());
    let slow = super::support::patient_registry(&proxy.url());
    lock_tests::warm_up(&slow).await;
    let other = registry(&server);
    proxy.set_latency(latency);
    (server, proxy, slow, other)
}

/// A lease runs from the sending of the attempt that took the lock, not from its reply: the
/// server started the key's expiry in between. So a holder whose reply came slowly sees its lease
/// over before anyone else can take the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_replys_lease_is_over_before_another_can_take_the_key() {
    // Each reply comes 150 ms after the server ran the command: far more than a 1 s lease's
    // drift, far less than the lease.
    let (_server, _proxy, slow, other) = behind_a_slow_link(Duration::from_millis(150)).await;
    let first = slow
        .lock("slow-reply")
        .ttl(Duration::from_secs(1))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let second = taken_by_another(&other, "slow-reply").await;
    assert!(
        first.is_lost(),
        "another registry holds the key while the first holder's lease still holds"
    );
    second.release().await.unwrap();
}

/// A renewal extends the lease from its sending, not from its reply: a holder whose last
/// renewal's reply came slowly sees its lease over before anyone else can take the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_renewals_lease_is_over_before_another_can_take_the_key() {
    let (server, proxy, slow, other) = behind_a_slow_link(Duration::from_millis(150)).await;
    let first = slow
        .lock("slow-renewal")
        .ttl(Duration::from_millis(1500))
        .acquire()
        .await
        .unwrap();
    // A renewal reached the server; its reply is on its way back. The renewals after it never
    // reach the server.
    lock_tests::renewed_on(
        &server,
        "lock:slow-renewal",
        Duration::from_secs(10),
        "a renewal",
    )
    .await;
    proxy.hold_requests_from(b"lock:slow-renewal");
    let second = taken_by_another(&other, "slow-renewal").await;
    assert!(
        first.is_lost(),
        "another registry holds the key while the first holder's renewed lease still holds"
    );
    second.release().await.unwrap();
    proxy.release_requests();
}

/// Under `OnLost::Cancel`, a body whose lease runs out is dropped before the key can expire on
/// the server: by the time another registry holds the key, the body is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_body_is_dropped_before_another_can_take_the_key() {
    let server = RedisServer::start();
    let (reg, other) = (registry(&server), registry(&server));
    let dropped = Arc::new(AtomicBool::new(false));
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let flag = DropFlag(dropped.clone());
    let run = reg
        .lock("cancelled")
        .ttl(Duration::from_secs(1))
        .renew(false)
        .run(async move {
            let _flag = flag;
            started_tx.send(()).unwrap();
            std::future::pending::<Result<(), LockError>>().await
        });
    let run = tokio::spawn(run);
    started.await.unwrap();
    let second = taken_by_another(&other, "cancelled").await;
    assert!(
        dropped.load(Ordering::SeqCst),
        "another registry holds the key while the first body still runs"
    );
    assert_lost(&run.await.unwrap().unwrap_err(), LostReason::NotRenewed);
    second.release().await.unwrap();
}

/// The drift kept off every lease (ttl/100 + 2 ms) covers a server whose clock runs faster than
/// the client's: a key that expires 0.8 % early (as on such a server) still outlasts the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_over_before_a_fast_clocked_server_expires_its_key() {
    let server = RedisServer::start();
    let (reg, other) = (registry(&server), registry(&server));
    let mut con = raw(&server.url()).await;
    let first = reg
        .lock("fast-clock")
        .ttl(Duration::from_secs(5))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    // 40 ms off a 5 s expiry, in one step on the server.
    let shortened: i64 = redis::Script::new(
        "return redis.call('PEXPIRE', KEYS[1], redis.call('PTTL', KEYS[1]) - tonumber(ARGV[1]))",
    )
    .key("lock:fast-clock")
    .arg(40)
    .invoke_async(&mut con)
    .await
    .unwrap();
    assert_eq!(shortened, 1, "the key was where it is documented");
    let second = taken_by_another(&other, "fast-clock").await;
    assert!(
        first.is_lost(),
        "another registry holds the key while the first holder's lease still holds"
    );
    second.release().await.unwrap();
}
