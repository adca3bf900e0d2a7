use std::time::Duration;

use lock_runtime::{LockError, LostReason, Registry};
use lock_tests::{RedisServer, SilentServer};
use redis::AsyncCommands;

use super::support::{assert_lost, raw, registry, spawn_hung_body};

#[tokio::test]
async fn an_unreachable_redis_fails_within_the_connect_timeout_instead_of_hanging() {
    let silent = SilentServer::start();
    let reg = Registry::builder()
        .url(silent.url())
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    // The outer timeout only turns a hang into a failure; the assertion is on the error.
    let outcome = tokio::time::timeout(Duration::from_secs(30), reg.lock("k").acquire()).await;
    let err = outcome.expect("acquire must not hang").unwrap_err();
    match &err {
        LockError::Backend { node, command, .. } => {
            assert_eq!(
                node,
                &silent.url()["redis://".len()..silent.url().len() - 1]
            );
            assert_eq!(*command, "acquire");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("could not connect") && message.contains("`k`"),
        "{message}"
    );
}

#[tokio::test]
async fn a_closed_port_names_the_node_and_what_to_check() {
    let port = lock_tests::free_port();
    let reg = Registry::from_url(&format!("redis://127.0.0.1:{port}/")).unwrap();
    let err = reg.lock("k").acquire().await.unwrap_err();
    let message = err.to_string();
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    assert!(
        message.contains("check that the server is reachable"),
        "{message}"
    );
}

#[tokio::test]
async fn passwords_never_reach_errors_or_debug_output() {
    let port = lock_tests::free_port();
    let reg = Registry::from_url(&format!("redis://app:s3cret-pw@127.0.0.1:{port}/")).unwrap();
    assert!(!format!("{reg:?}").contains("s3cret-pw"));
    let err = reg.lock("k").acquire().await.unwrap_err();
    assert!(!err.to_string().contains("s3cret-pw"), "{err}");
    assert!(!format!("{err:?}").contains("s3cret-pw"), "{err:?}");
    let bad = Registry::from_url("redis://app:s3cret-pw@[not-a-host").unwrap_err();
    assert!(!bad.to_string().contains("s3cret-pw"), "{bad}");
}

#[tokio::test]
async fn a_key_holding_another_type_is_a_clear_error_and_stays_untouched() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let mut con = raw(&server.url()).await;
    let _: () = con.rpush("lock:jobs", "payload").await.unwrap();
    let err = reg
        .lock("jobs")
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
    assert!(
        err.to_string().contains("holds a list, not a lock"),
        "{err}"
    );
    let items: Vec<String> = con.lrange("lock:jobs", 0, -1).await.unwrap();
    assert_eq!(items, ["payload"]);
}

#[tokio::test]
async fn invalid_keys_and_options_are_refused_before_any_command() {
    let reg = Registry::in_memory();
    let err = reg.lock("").acquire().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
    let err = reg
        .lock("k")
        .ttl(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("below the minimum of 10 ms"),
        "{err}"
    );
    let err = reg
        .lock("k")
        .ttl(Duration::from_secs(10))
        .max_hold(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("`max_hold`"), "{err}");
}

#[tokio::test]
async fn a_missing_default_registry_says_which_variables_to_set() {
    let err = lock_runtime::named("nobody-installed-this").unwrap_err();
    assert!(
        err.to_string()
            .contains("install_as(\"nobody-installed-this\")"),
        "{err}"
    );
    let err = LockError::NotConfigured { registry: None };
    assert!(err.to_string().contains("LOCK_REDIS_URL"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_loses_the_lease_and_cancels_the_body_before_the_key_expires() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let ttl = Duration::from_millis(600);
    let task = spawn_hung_body(reg.lock("paused").ttl(ttl)).await;
    server.pause();
    let err = task.await.unwrap().unwrap_err();
    // Read the key's remaining lease the moment the server answers again.
    server.resume();
    let mut con = raw(&server.url()).await;
    let pttl: i64 = con.pttl("lock:paused").await.unwrap();
    assert_lost(&err, LostReason::Expired);
    // -2: already gone (the release after cancellation may have reached it, or it expired
    // while we reconnected); otherwise it must not have expired before the body was stopped.
    assert!(pttl == -2 || pttl > 0, "{pttl}");
}

/// Calls of the lock scripts the server at `url` has run.
fn script_calls(url: &str) -> u64 {
    lock_tests::command_calls(&mut lock_tests::connection(url))
        .get("evalsha")
        .copied()
        .unwrap_or(0)
}

/// Starts `request` in a task and returns once its first attempt reached the server (a script
/// call beyond `before`).
async fn first_attempt_sent(
    url: &str,
    before: u64,
    request: lock_runtime::LockRequest,
) -> tokio::task::JoinHandle<Result<lock_runtime::LockGuard, LockError>> {
    let caller = tokio::spawn(request.wait(Duration::from_secs(10)).acquire());
    lock_tests::eventually(
        Duration::from_secs(10),
        "the caller's first attempt",
        || {
            let url = url.to_owned();
            async move { script_calls(&url) > before }
        },
    )
    .await;
    caller
}

/// A caller's `wait` is for a busy lock; an answer that no wait can change comes back at once,
/// after one attempt: here the script's calls are counted while the condition would change if
/// the caller kept trying (the semaphore drains, the data goes away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_that_waiting_cannot_change_are_returned_after_one_attempt() {
    let server = RedisServer::start();
    let url = server.url();
    let (holder, caller) = (registry(&server), registry(&server));
    let mut con = raw(&url).await;

    // Another size of semaphore: the set drains meanwhile, which a retry would take as free.
    let held = holder.lock("pool").permits(3).acquire().await.unwrap();
    let before = script_calls(&url);
    let other_size = first_attempt_sent(&url, before, caller.lock("pool").permits(2)).await;
    held.release().await.unwrap();
    let err = other_size.await.unwrap().unwrap_err();
    assert!(matches!(err, LockError::InvalidOptions { .. }), "{err:?}");
    // One attempt by the caller and one release by the holder.
    assert_eq!(script_calls(&url) - before, 2, "{err}");

    // Application data under the key: a retry after it is deleted would take the lock.
    let _: () = con.rpush("lock:data", "job").await.unwrap();
    let before = script_calls(&url);
    let data = first_attempt_sent(&url, before, caller.lock("data")).await;
    let _: () = con.del("lock:data").await.unwrap();
    let err = data.await.unwrap().unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
    assert_eq!(script_calls(&url) - before, 1, "{err}");
}

/// An ACL that refuses the lock's commands does not change within a `wait`: the refusal comes
/// back after one attempt, naming the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_refusal_is_returned_after_one_attempt() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER", "nolock", "on", ">pw", "~*", "&*", "+@all", "-evalsha", "-set",
        ])
        .query(&mut admin)
        .unwrap();
    let url = format!("redis://nolock:pw@127.0.0.1:{}/", server.port());
    let refused = lock_tests::with_timeouts(Registry::builder().url(url), Duration::from_secs(1));
    let _: () = redis::cmd("ACL")
        .arg(&["LOG", "RESET"])
        .query(&mut admin)
        .unwrap();
    let err = refused
        .lock("k")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no permissions"), "{err}");
    // Each refusal is counted in the ACL log.
    let log: Vec<redis::Value> = redis::cmd("ACL").arg("LOG").query(&mut admin).unwrap();
    let refusals: i64 = log
        .iter()
        .map(|entry| {
            let fields: std::collections::HashMap<String, redis::Value> =
                redis::from_redis_value_ref(entry).unwrap();
            redis::from_redis_value_ref::<i64>(&fields["count"]).unwrap()
        })
        .sum();
    assert_eq!(refusals, 1, "one attempt, refused once: {err}");
}

/// A user whose ACL lacks the publish command releases a lock nobody waited for (no
/// notification is due), and is refused by the release script before it changes a lock someone
/// waits for: the error says so, and the lock is as it was (held, until its ttl), never
/// deleted with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_its_notification_leaves_the_lock_as_it_was() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER", "nopub", "on", ">pw", "~*", "&*", "+@all", "-publish",
        ])
        .query(&mut admin)
        .unwrap();
    let url = format!("redis://nopub:pw@127.0.0.1:{}/", server.port());
    let reg = lock_tests::with_timeouts(Registry::builder().url(url), Duration::from_secs(1));
    reg.lock("k")
        .acquire()
        .await
        .unwrap()
        .release_now()
        .await
        .unwrap();
    let guard = reg.lock("k").acquire().await.unwrap();
    let token = guard.token().to_owned();
    // Someone waits (refused at once: its busy attempt marked the lock all the same).
    let waiter = registry(&server)
        .lock("k")
        .wait(Duration::from_millis(100))
        .acquire()
        .await;
    assert!(waiter.unwrap_err().is_busy());
    let err = guard.release_now().await.unwrap_err();
    // Redis 7 names the refusal, not the command, inside a script; Valkey names both.
    let message = err.to_string();
    assert!(
        message.contains("can't run this command") || message.contains("'publish'"),
        "{err}"
    );
    assert!(!err.is_transient(), "an ACL refusal does not pass: {err}");
    let mut con = raw(&server.url()).await;
    let on_server: Option<String> = con.get("lock:k").await.unwrap();
    assert_eq!(on_server, Some(format!("{token}+w")), "untouched");
}

/// A release that would hand the lock over (a fenced waiter queues behind the holder of the lock
/// itself, or of the last permit of a semaphore) and whose notification the ACL refuses changes
/// nothing: not the lock or the semaphore, not the fencing counter (no token is taken for a
/// handoff that did not happen), not the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_would_hand_over_and_is_refused_its_notification_changes_nothing() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER", "nopub", "on", ">pw", "~*", "&*", "+@all", "-publish",
        ])
        .query(&mut admin)
        .unwrap();
    let url = format!("redis://nopub:pw@127.0.0.1:{}/", server.port());
    let nopub = lock_tests::with_timeouts(Registry::builder().url(url), Duration::from_secs(1));
    let waiters = registry(&server);
    let mut con = raw(&server.url()).await;
    for (key, permits) in [("k", None), ("pool", Some(1))] {
        let request = nopub.lock(key).ttl(Duration::from_secs(60)).renew(false);
        let held = match permits {
            Some(n) => request.permits(n),
            None => request,
        }
        .acquire()
        .await
        .unwrap();
        let waiter = tokio::spawn({
            let waiters = waiters.clone();
            async move {
                waiters
                    .lock(key)
                    .fencing(true)
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await
            }
        });
        let queued = format!("queued:{{lock:{key}}}");
        super::support::eventually(Duration::from_secs(20), "the waiter queued", || {
            let (mut con, queued) = (con.clone(), queued.clone());
            async move { con.hlen::<_, u32>(&queued).await.unwrap() == 1 }
        })
        .await;
        let names = [
            format!("lock:{key}"),
            format!("fence:{{lock:{key}}}"),
            format!("queue:{{lock:{key}}}"),
            queued,
        ];
        // The waiter's own entry in the queue's hash (its deadline, the number of its last
        // attempt) moves whenever it tries again, as it may until it is told of the lock:
        // of that hash, who is in it is compared.
        let snapshot = async |con: &mut redis::aio::MultiplexedConnection| {
            let mut all = Vec::new();
            for name in &names {
                let read = if name.starts_with("queued:") {
                    "HKEYS"
                } else {
                    "DUMP"
                };
                let (kind, dump): (String, redis::Value) = redis::pipe()
                    .cmd("TYPE")
                    .arg(name)
                    .cmd(read)
                    .arg(name)
                    .query_async(con)
                    .await
                    .unwrap();
                all.push((name.clone(), kind, dump));
            }
            all
        };
        let before = snapshot(&mut con).await;
        let err = held.release_now().await.unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("can't run this command") || message.contains("'publish'"),
            "{key}: {err}"
        );
        assert_eq!(snapshot(&mut con).await, before, "{key}: untouched");
        waiter.abort();
    }
}
