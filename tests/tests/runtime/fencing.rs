//! Fencing counters: bounded by an expiry, and still strictly increasing per key when a counter
//! disappears (expired, deleted, or lost with the server's data). A failover that rolls a counter
//! back is `deployments::replicas`.

use std::time::Duration;

use lock_tests::RedisServer;
use redis::AsyncCommands;

use super::support::{raw, registry};

const DAY_MS: i64 = 24 * 3600 * 1000;

#[tokio::test]
async fn a_fenced_acquisition_leaves_its_counters_with_an_expiry_of_a_day_beyond_the_lease() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let mut con = raw(&server.url()).await;
    let ttl = Duration::from_secs(90);
    let kept = DAY_MS + 90_000;
    // Refreshed by every fenced acquisition, so only an unused counter goes away.
    let mut counter_of = async |key: &str, token: Option<u64>| {
        let counter: Option<u64> = con.get(key).await.unwrap();
        assert_eq!(counter, token, "{key} holds the last token");
        let pttl: i64 = con.pttl(key).await.unwrap();
        assert!(pttl > kept - 60_000 && pttl <= kept, "{key}: {pttl}");
    };
    for _ in 0..2 {
        let guard = reg
            .lock("invoice:7")
            .fencing(true)
            .ttl(ttl)
            .acquire()
            .await
            .unwrap();
        counter_of("fence:{lock:invoice:7}", guard.fence()).await;
        guard.release().await.unwrap();
        let both = reg
            .lock_all(["invoice:7", "invoice:9"])
            .fencing(true)
            .ttl(ttl)
            .acquire()
            .await
            .unwrap();
        counter_of("fence:{lock:invoice:7}", both.fence()).await;
        counter_of("fence:{lock:invoice:9}", both.fence()).await;
        both.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_counter_deleted_behind_the_librarys_back_still_yields_a_greater_token() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let mut con = raw(&server.url()).await;
    let mut last = 0;
    for round in 0..3 {
        for _ in 0..5 {
            let guard = reg.lock("invoice:8").fencing(true).acquire().await.unwrap();
            let fence = guard.fence().expect("fencing was asked for");
            assert!(fence > last, "round {round}: {fence} after {last}");
            last = fence;
            guard.release().await.unwrap();
        }
        // As if the counter had expired, or been lost with the server's data.
        let deleted: u32 = con.del("fence:{lock:invoice:8}").await.unwrap();
        assert_eq!(
            deleted, 1,
            "round {round}: the counter was where it is documented"
        );
    }
    let guard = reg.lock("invoice:8").fencing(true).acquire().await.unwrap();
    assert!(guard.fence().unwrap() > last);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_holder_that_outlives_its_counter_still_sees_the_next_holder_with_a_greater_token() {
    let server = RedisServer::start();
    let (a, b) = (registry(&server), registry(&server));
    let mut con = raw(&server.url()).await;
    let first = a
        .lock("invoice:9")
        .fencing(true)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    // The counter expires while the lock is renewed (a hold longer than the counter's expiry),
    // then the lock is taken away from a holder that still believes in its token.
    let expiring: bool = con.pexpire("fence:{lock:invoice:9}", 1).await.unwrap();
    assert!(expiring, "the counter was where it is documented");
    lock_tests::eventually(Duration::from_secs(10), "the counter expired", || {
        let mut con = con.clone();
        async move {
            !con.exists::<_, bool>("fence:{lock:invoice:9}")
                .await
                .unwrap()
        }
    })
    .await;
    assert!(b.force_unlock("invoice:9").await.unwrap());
    let second = b.lock("invoice:9").fencing(true).acquire().await.unwrap();
    assert!(
        second.fence().unwrap() > first.fence().unwrap(),
        "a fenced store must refuse the stale holder's writes"
    );
    second.release().await.unwrap();
}

/// `FencedKey`: a holder whose lock passed to another while it was paused has its late write
/// refused, atomically, and the data keeps the next holder's write.
#[tokio::test]
async fn a_fenced_key_refuses_the_late_write_of_a_holder_whose_lock_passed_on() {
    use lock_runtime::{FencedKey, FencedWrite};

    let server = RedisServer::start();
    let reg = registry(&server);
    let mut con = raw(&server.url()).await;
    let balance = FencedKey::new("balance:7");
    // The first holder's lease runs out (not renewed: as if its process were paused).
    let first = reg
        .lock("account:7")
        .fencing(true)
        .renew(false)
        .ttl(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap();
    let old = first.fence().unwrap();
    let _ = first.lost().await;
    let second = reg
        .lock("account:7")
        .fencing(true)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let new = second.fence().unwrap();
    assert!(new > old);
    let written = balance
        .write::<()>(&mut con, new, "SET", 100)
        .await
        .unwrap();
    assert_eq!(written, FencedWrite::Written(()));
    // Its own token again: accepted (one holder writing twice).
    let now = balance
        .write::<i64>(&mut con, new, "INCRBY", 5)
        .await
        .unwrap();
    assert_eq!(now, FencedWrite::Written(105));
    // The first holder wakes and writes: refused, nothing changed.
    let late = balance.write::<()>(&mut con, old, "SET", 0).await.unwrap();
    assert_eq!(late, FencedWrite::Refused { highest: new });
    let value: i64 = con.get("balance:7").await.unwrap();
    assert_eq!(value, 105);
    assert_eq!(balance.highest(&mut con).await.unwrap(), Some(new));
    second.release().await.unwrap();

    // A command that fails changes neither the data nor the record: a later token is not
    // recorded by a write that did not happen.
    let err = balance
        .write::<()>(&mut con, new + 1, "HSET", ("field", 1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    assert_eq!(balance.highest(&mut con).await.unwrap(), Some(new));
    // A nil reply is a reply: GET of a missing key through the fence.
    let missing = FencedKey::new("nothing:here");
    let read = missing
        .write::<Option<String>>(&mut con, 1, "GET", Vec::<String>::new())
        .await
        .unwrap();
    assert_eq!(read, FencedWrite::Written(None));
}

/// A token a day ahead of the one the server's clock gives `key` now (its holder released).
async fn a_day_ahead(reg: &lock_runtime::Registry, key: &str) -> u64 {
    let guard = reg.lock(key).fencing(true).acquire().await.unwrap();
    let ahead = guard.fence().unwrap() + 86_400_000_000;
    guard.release().await.unwrap();
    ahead
}

/// A counter ahead of the server's clock (written while a server with a clock ahead of this one
/// was the master, say) still yields a greater token: a token is the greater of the counter's
/// value plus one and the clock.
#[tokio::test]
async fn a_counter_ahead_of_the_servers_clock_still_yields_a_greater_token() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let mut con = raw(&server.url()).await;
    let ahead = a_day_ahead(&reg, "invoice:10").await;
    let _: () = con.set("fence:{lock:invoice:10}", ahead).await.unwrap();
    let next = reg
        .lock("invoice:10")
        .fencing(true)
        .acquire()
        .await
        .unwrap();
    assert!(
        next.fence().unwrap() > ahead,
        "{:?} after {ahead}",
        next.fence()
    );
    next.release().await.unwrap();
}

/// A lock over several keys takes the greatest of its counters' next tokens, so it is above every
/// token handed out on any of its keys, also where one counter is ahead of the server's clock.
#[tokio::test]
async fn a_multi_key_lock_takes_a_token_above_every_one_of_its_counters() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let mut con = raw(&server.url()).await;
    let ahead = a_day_ahead(&reg, "invoice:11").await;
    let _: () = con.set("fence:{lock:invoice:12}", ahead).await.unwrap();
    for keys in [["invoice:11", "invoice:12"], ["invoice:12", "invoice:11"]] {
        let both = reg.lock_all(keys).fencing(true).acquire().await.unwrap();
        let fence = both.fence().unwrap();
        assert!(fence > ahead, "{keys:?}: {fence} after {ahead}");
        both.release().await.unwrap();
        let _: () = con.set("fence:{lock:invoice:12}", ahead).await.unwrap();
    }
}

/// `FencedKey` compares tokens as numbers: a token with fewer digits is lower, whatever its
/// first digit.
#[tokio::test]
async fn a_fenced_key_compares_tokens_as_numbers() {
    use lock_runtime::{FencedKey, FencedWrite};

    let server = RedisServer::start();
    let mut con = raw(&server.url()).await;
    let balance = FencedKey::new("balance:10");
    let written = balance.write::<()>(&mut con, 10, "SET", 100).await.unwrap();
    assert_eq!(written, FencedWrite::Written(()));
    let late = balance.write::<()>(&mut con, 9, "SET", 0).await.unwrap();
    assert_eq!(late, FencedWrite::Refused { highest: 10 });
    let value: i64 = con.get("balance:10").await.unwrap();
    assert_eq!(value, 100);
}

/// The record's script compares tokens as Lua numbers, exact below 2^53: a larger token (the
/// library's own stay below it until the year 2255; an application's own `u64` need not) is
/// refused before anything is sent, with an error that says why, and nothing is written.
#[tokio::test]
async fn a_fenced_key_refuses_a_token_its_script_cannot_compare_exactly() {
    use lock_runtime::{FencedKey, FencedWrite};

    let server = RedisServer::start();
    let mut con = raw(&server.url()).await;
    let balance = FencedKey::new("balance:11");
    let highest_exact = (1u64 << 53) - 1;
    let written = balance.write::<()>(&mut con, highest_exact, "SET", 1).await;
    assert_eq!(written.unwrap(), FencedWrite::Written(()));
    for too_large in [1u64 << 53, (1 << 53) + 1, u64::MAX] {
        let err = balance
            .write::<()>(&mut con, too_large, "SET", 2)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("2^53") && err.to_string().contains("balance:11"),
            "{err}"
        );
    }
    let value: i64 = con.get("balance:11").await.unwrap();
    assert_eq!(value, 1, "nothing was written");
    assert_eq!(
        balance.highest(&mut con).await.unwrap(),
        Some(highest_exact)
    );
}
