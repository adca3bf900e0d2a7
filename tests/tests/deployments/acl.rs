use std::time::Duration;

use lock_runtime::Registry;
use lock_tests::RedisServer;

#[tokio::test]
async fn an_acl_user_limited_to_the_lock_keys_can_lock_wait_and_fence() {
    // One argument per ACL rule: redis-server quotes an argument that holds spaces.
    let server = RedisServer::start_with(&[
        "--user",
        "default",
        "off",
        "--user",
        "locker",
        "on",
        ">s3cret-pw",
        "~lock:*",
        "~fence:lock:*",
        "~fence:{lock:*",
        "~queue:lock:*",
        "~queue:{lock:*",
        "~queued:lock:*",
        "~queued:{lock:*",
        "&lock:*",
        "+@all",
    ]);
    let url = format!("redis://locker:s3cret-pw@127.0.0.1:{}/", server.port());
    let (a, b) = (
        Registry::from_url(&url).unwrap(),
        Registry::from_url(&url).unwrap(),
    );
    let held = a.lock("job").fencing(true).acquire().await.unwrap();
    assert!(
        held.fence().is_some(),
        "the ACL lets the script keep the counter"
    );
    let waiter =
        tokio::spawn(async move { b.lock("job").wait(Duration::from_secs(10)).acquire().await });
    tokio::task::yield_now().await;
    held.release().await.unwrap();
    let _next = waiter
        .await
        .unwrap()
        .expect("the ACL user may subscribe and publish on lock channels");
    assert!(!format!("{a:?}").contains("s3cret-pw"));

    let wrong = format!("redis://locker:wrong@127.0.0.1:{}/", server.port());
    let err = Registry::from_url(&wrong)
        .unwrap()
        .lock("job")
        .acquire()
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("wrong@"), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("127.0.0.1:{}", server.port())),
        "{err}"
    );
}
