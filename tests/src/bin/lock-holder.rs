//! A separate process that takes a lock and holds it until killed: the "holder that vanishes"
//! of the tests. Usage: `lock-holder <redis-url> <key> <ttl-ms> [permits]`; prints
//! `held <token>` once held (one permit of a semaphore when `permits` is given).

use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (url, key, ttl) = (
        args.next().expect("url"),
        args.next().expect("key"),
        args.next()
            .expect("ttl ms")
            .parse()
            .expect("ttl ms is a number"),
    );
    let registry = lock_runtime::Registry::from_url(&url).expect("registry");
    let mut request = registry.lock(key);
    if let Some(permits) = args.next() {
        request = request.permits(permits.parse().expect("permits is a number"));
    }
    let guard = request
        .ttl(Duration::from_millis(ttl))
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquire");
    println!("held {}", guard.token());
    std::future::pending::<()>().await;
}
