use std::time::Duration;

use lock_runtime::Registry;
use lock_tests::RedisServer;

#[tokio::test]
async fn rediss_with_a_private_ca_locks_waits_and_fences() {
    let server = RedisServer::start_tls();
    assert!(server.url().starts_with("rediss://"));
    let registry = || {
        Registry::builder()
            .url(server.url())
            .tls_root_cert(server.ca_pem())
            .build()
            .unwrap()
    };
    let (a, b) = (registry(), registry());
    let held = a.lock("tls-job").fencing(true).acquire().await.unwrap();
    let first_fence = held.fence().expect("fencing was asked for");
    let waiter = tokio::spawn(async move {
        b.lock("tls-job")
            .fencing(true)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
    });
    tokio::task::yield_now().await;
    held.release().await.unwrap();
    let next = waiter
        .await
        .unwrap()
        .expect("notified over the TLS subscriber connection");
    assert!(next.fence() > Some(first_fence));
}

#[tokio::test]
async fn an_untrusted_server_certificate_is_refused_with_the_node_named() {
    let server = RedisServer::start_tls();
    // Without the private CA, the system roots do not vouch for the test server.
    let reg = Registry::builder()
        .url(server.url())
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let err = reg.lock("tls-job").acquire().await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(&format!("127.0.0.1:{}", server.port())),
        "{message}"
    );
    assert!(message.contains("could not connect"), "{message}");
}
