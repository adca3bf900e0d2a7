//! Review of the group commit's "a release never overtakes its token's acquisition": holes in
//! the path that lets go of a cancelled acquisition.

use std::time::Duration;

use lock_tests::proxy::Proxy;
use lock_tests::RedisServer;

fn exists(con: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<u64>(con).unwrap() == 1
}

/// An acquisition ran on the server, but its reply never came back, and its caller was
/// cancelled: its let-go release is the only thing that frees the lock before its ttl. That
/// release is sent once: if it fails (here the connection is reset while it is on its way, as
/// a restart or a flaky link would), nothing tries again, and the lock of a caller long gone
/// stays taken for the whole ttl. A dropped guard's release, by contrast, is retried by the
/// keeper until it lands (`release_dropped`).
#[tokio::test]
async fn a_let_go_release_that_fails_once_is_tried_again() {
    const KEY: &str = "letgo-reset";
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let registry = super::support::patient_registry(&proxy.url());
    lock_tests::warm_up(&registry).await;
    let mut con = server.connection();
    let wait = Duration::from_secs(10);
    // The acquisition reaches the server and runs; its reply is lost.
    proxy.drop_replies();
    let acquiring = tokio::spawn(registry.lock(KEY).ttl(Duration::from_secs(60)).acquire());
    super::support::eventually(wait, "the acquisition ran on the server", || {
        let ran = exists(&mut con, &format!("lock:{KEY}"));
        async move { ran }
    })
    .await;
    // Its caller gives up: the let-go release is written, and held in the proxy ...
    proxy.hold_requests_from(KEY.as_bytes());
    acquiring.abort();
    assert!(acquiring.await.unwrap_err().is_cancelled());
    tokio::time::timeout(wait, proxy.held_at_least(KEY.as_bytes(), 1))
        .await
        .expect("the let-go release was written");
    // ... until the connection is reset under it: it fails once.
    proxy.reset_all();
    super::support::eventually(wait, "the connection reset", || {
        let reset = proxy.stats().resets() >= 1;
        async move { reset }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.release_requests();
    proxy.heal();
    // The server is back within milliseconds; the lock should be let go of well before its
    // 60 s ttl.
    super::support::eventually(wait, "the cancelled acquisition's lock let go of", || {
        let free = !exists(&mut con, &format!("lock:{KEY}"));
        async move { free }
    })
    .await;
}
