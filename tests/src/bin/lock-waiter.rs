//! A separate process that waits for a lock: the "waiter that stalls" of the tests, which stop
//! it (SIGSTOP) while it is queued. Usage: `lock-waiter <redis-url> <key> <ttl-ms> <wait-ms>`;
//! prints `held <token>` once it holds the lock (or `failed <error>`), then holds it until
//! stdin closes.

use std::time::Duration;

use tokio::io::AsyncReadExt;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mut next = |what: &str| args.next().unwrap_or_else(|| panic!("missing {what}"));
    let (url, key) = (next("url"), next("key"));
    let ms = |text: String| Duration::from_millis(text.parse().expect("a number of ms"));
    let (ttl, wait) = (ms(next("ttl ms")), ms(next("wait ms")));
    let registry = lock_runtime::Registry::from_url(&url).expect("registry");
    match registry.lock(key).ttl(ttl).wait(wait).acquire().await {
        Ok(guard) => {
            println!("held {}", guard.token());
            let _ = tokio::io::stdin().read_to_end(&mut Vec::new()).await;
            let _ = guard.release().await;
        }
        Err(error) => println!("failed {error}"),
    }
}
