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
