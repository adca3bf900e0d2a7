//! The fault proxy itself, and one network fault at a time against one lock.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::LostReason;
use lock_tests::proxy::Proxy;
use lock_tests::{subscribers, RedisServer};
use redis::AsyncCommands;

use super::model;
use super::monitor::{Event, Monitor};
use super::support::{assert_lost, eventually, now_us, raw, registry};

/// A raw RESP client on the proxy, to see exactly what the proxy delivers.
fn resp_client(proxy: &Proxy) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", proxy.port())).expect("connect to the proxy");
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    stream
}

/// Reads whatever arrives within the read timeout.
fn read_some(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = [0u8; 256];
    let n = stream.read(&mut buf)?;
    Ok(buf[..n].to_vec())
}

#[test]
fn the_proxy_delays_black_holes_drops_replies_and_resets_on_command() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut direct = server.connection();

    // Latency: a round trip takes at least two one-way delays.
    proxy.set_latency(Duration::from_millis(150));
    let mut c = resp_client(&proxy);
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let sent = Instant::now();
    c.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_some(&mut c).unwrap(), b"+PONG\r\n");
    assert!(
        sent.elapsed() >= Duration::from_millis(300),
        "{:?}",
        sent.elapsed()
    );
    proxy.heal();

    // Black hole: nothing arrives, in either direction; after healing it all does, in order.
    let mut c = resp_client(&proxy);
    proxy.blackhole();
    c.write_all(b"SET held-back 1\r\nGET held-back\r\n")
        .unwrap();
    assert!(read_some(&mut c).is_err(), "no reply through a black hole");
    let arrived: Option<String> = redis::cmd("GET")
        .arg("held-back")
        .query(&mut direct)
        .unwrap();
    assert_eq!(arrived, None, "the request did not reach the server either");
    proxy.heal();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    while got.len() < b"+OK\r\n$1\r\n1\r\n".len() {
        got.extend(read_some(&mut c).unwrap());
    }
    assert_eq!(got, b"+OK\r\n$1\r\n1\r\n");

    // Dropped replies: the command runs, its reply never comes, and healing resets the
    // connection rather than ever delivering a later reply in its place.
    let mut c = resp_client(&proxy);
    proxy.drop_replies();
    c.write_all(b"SET ran-anyway 1\r\n").unwrap();
    assert!(read_some(&mut c).is_err(), "the reply was dropped");
    let ran: Option<String> = redis::cmd("GET")
        .arg("ran-anyway")
        .query(&mut direct)
        .unwrap();
    assert_eq!(ran.as_deref(), Some("1"), "the command ran on the server");
    assert!(proxy.stats().replies_dropped() >= 1);
    let resets = proxy.stats().resets();
    proxy.heal();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let after = c.write_all(b"PING\r\n").and_then(|()| read_some(&mut c));
    assert!(
        !matches!(&after, Ok(b) if !b.is_empty()),
        "a connection that lost a reply is reset, never resynchronised: {after:?}"
    );
    assert_eq!(proxy.stats().resets(), resets + 1);

    // Reset: every open connection is cut at once; new ones work.
    let mut a = resp_client(&proxy);
    let mut b = resp_client(&proxy);
    a.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_some(&mut a).unwrap(), b"+PONG\r\n");
    proxy.reset_all();
    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for c in [&mut a, &mut b] {
        let r = c.write_all(b"PING\r\n").and_then(|()| read_some(c));
        assert!(!matches!(&r, Ok(b) if !b.is_empty()), "{r:?}");
    }
    let mut fresh = resp_client(&proxy);
    fresh.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_some(&mut fresh).unwrap(), b"+PONG\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_shorter_than_a_third_of_the_ttl_is_ridden_out_by_renewal_retries() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let reg = registry(&proxy.url());
    let ttl = Duration::from_millis(1200);
    let guard = reg.lock("k").ttl(ttl).acquire().await.unwrap();
    // Across a renewal time (ttl/3 after acquiring).
    tokio::time::sleep(ttl / 4).await;
    proxy.blackhole();
    tokio::time::sleep(ttl / 4).await;
    proxy.heal();
    tokio::time::sleep(ttl * 2).await;
    assert!(
        !guard.is_lost(),
        "a short partition must not cost the lease"
    );
    let mut con = raw(&server.url()).await;
    let owner: Option<String> = con.get("lock:k").await.unwrap();
    assert_eq!(owner.as_deref(), Some(guard.token()));
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_pause_shorter_than_a_third_of_the_ttl_is_ridden_out_by_renewal_retries() {
    let server = RedisServer::start();
    let reg = registry(&server.url());
    let ttl = Duration::from_millis(1200);
    let guard = reg.lock("k").ttl(ttl).acquire().await.unwrap();
    // SIGSTOP across the first renewal (ttl/3 after acquiring).
    tokio::time::sleep(ttl / 4).await;
    server.pause();
    tokio::time::sleep(ttl / 4).await;
    server.resume();
    tokio::time::sleep(ttl * 2).await;
    assert!(
        !guard.is_lost(),
        "a short server pause must not cost the lease"
    );
    let mut con = raw(&server.url()).await;
    let owner: Option<String> = con.get("lock:k").await.unwrap();
    assert_eq!(owner.as_deref(), Some(guard.token()));
    guard.release().await.unwrap();
}

/// Spawns `request.run(..)` with a body that never finishes and stamps (wall clock, µs) the
/// moment it is dropped; returns once the body runs, with its token.
async fn spawn_stamped_body(
    request: lock_runtime::LockRequest,
) -> (
    tokio::task::JoinHandle<Result<(), lock_runtime::LockError>>,
    Arc<Mutex<Option<i64>>>,
    String,
) {
    struct Stamp(Arc<Mutex<Option<i64>>>);
    impl Drop for Stamp {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(now_us());
        }
    }
    let stopped = Arc::new(Mutex::new(None));
    let stamp = Stamp(stopped.clone());
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(request.run(async move {
        let _stamp = stamp;
        let token = lock_runtime::current().unwrap().token().to_owned();
        started_tx.send(token).unwrap();
        std::future::pending().await
    }));
    let token = started.await.expect("the body started");
    (task, stopped, token)
}

/// How long before the server-side expiry of `token`'s lock the body stopped, from the
/// server's own history.
fn margin(monitor: &Monitor, token: &str, stopped_us: i64) -> i64 {
    monitor.sync();
    let history = model::rebuild(
        &[monitor.events()],
        "lock:",
        lock_tests::fixture_has_set_ifeq(),
    );
    assert!(history.violations.is_empty(), "{:?}", history.violations);
    let tenure = history
        .tenures
        .iter()
        .find(|t| t.token == token)
        .expect("the lock's tenure");
    tenure.expires_at(stopped_us) - stopped_us
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_longer_than_the_ttl_cancels_the_body_before_the_key_expires() {
    let server = RedisServer::start();
    let monitor = Monitor::start(server.port());
    let proxy = Proxy::start(server.port());
    let reg = registry(&proxy.url());
    let ttl = Duration::from_millis(800);
    let (body, stopped, token) = spawn_stamped_body(reg.lock("k").ttl(ttl)).await;
    proxy.blackhole();
    let err = body.await.unwrap().unwrap_err();
    assert_lost(&err, LostReason::Expired);
    let stopped = stopped.lock().unwrap().expect("the body was dropped");
    let margin = margin(&monitor, &token, stopped);
    assert!(
        margin > 0,
        "the body stopped {} µs after the key expired",
        -margin
    );
    proxy.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_renewal_replies_lose_the_lease_although_redis_extended_the_key() {
    let server = RedisServer::start();
    let monitor = Monitor::start(server.port());
    let proxy = Proxy::start(server.port());
    let reg = registry(&proxy.url());
    let ttl = Duration::from_millis(900);
    let (body, stopped, token) = spawn_stamped_body(reg.lock("k").ttl(ttl)).await;
    let dropping_from = now_us();
    proxy.drop_replies();
    let err = body.await.unwrap().unwrap_err();
    assert_lost(&err, LostReason::Expired);
    let stopped = stopped.lock().unwrap().expect("the body was dropped");
    // Renewals did run (only their replies were lost): a conservative loss, long before the
    // key would have expired.
    monitor.sync();
    let renewals_ran = monitor
        .events()
        .iter()
        .filter(|e| {
            matches!(e, Event::Command(c) if c.lua && c.name() == "PEXPIRE" && c.at_us > dropping_from)
        })
        .count();
    assert!(renewals_ran >= 1, "no renewal reached Redis");
    assert!(margin(&monitor, &token, stopped) > 0);
    proxy.heal();
    // The cancelled body's owner-checked release reached Redis (requests still got through).
    let con = raw(&server.url()).await;
    eventually(ttl * 2, "the released key is gone", || {
        let mut con = con.clone();
        async move { !con.exists::<_, bool>("lock:k").await.unwrap() }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_trip_beyond_a_third_of_the_ttl_loses_leases_that_redis_still_holds() {
    // A limit: the keeper waits at most ttl/3 for a renewal, so when every round trip takes
    // longer, no renewal is ever confirmed and the lease is lost, although each one ran.
    let server = RedisServer::start();
    let monitor = Monitor::start(server.port());
    let proxy = Proxy::start(server.port());
    let reg = registry(&proxy.url());
    // Connected (and scripts loaded) before the latency: the handshake alone takes round trips.
    lock_tests::warm_up(&reg).await;
    let ttl = Duration::from_millis(900);
    proxy.set_latency(ttl / 5); // round trip 2/5 ttl > ttl/3, but < the 500 ms command timeout
    let (body, stopped, token) = spawn_stamped_body(reg.lock("k").ttl(ttl)).await;
    let err = body.await.unwrap().unwrap_err();
    assert_lost(&err, LostReason::Expired);
    let stopped = stopped.lock().unwrap().expect("the body was dropped");
    let margin = margin(&monitor, &token, stopped);
    // Redis kept extending the key: it would have lived on well past the cancellation.
    assert!(
        margin > i64::try_from((ttl / 3).as_micros()).unwrap(),
        "{margin} µs"
    );
    proxy.heal();
}

/// Connections reset under a holder, again and again: each time it reconnects and its next
/// renewal reaches Redis (the key's own expiry goes up), the key keeps its token throughout,
/// and the release on a fresh connection removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_of_every_connection_mid_hold_does_not_cost_the_lease() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let reg = registry(&proxy.url());
    let ttl = Duration::from_millis(900);
    let guard = reg.lock("k").ttl(ttl).acquire().await.unwrap();
    let mut con = server.connection();
    for round in 0..3 {
        let resets = proxy.stats().resets();
        proxy.reset_all();
        lock_tests::renewed_on(&server, "lock:k", 3 * ttl, "renewed after the reset").await;
        assert!(
            proxy.stats().resets() > resets,
            "round {round}: nothing was reset"
        );
        let value: Option<String> = redis::cmd("GET").arg("lock:k").query(&mut con).unwrap();
        assert_eq!(value.as_deref(), Some(guard.token()), "round {round}");
        assert!(!guard.is_lost(), "round {round}: {:?}", guard.lost_reason());
    }
    guard
        .release()
        .await
        .expect("released on a fresh connection");
    let value: Option<String> = redis::cmd("GET").arg("lock:k").query(&mut con).unwrap();
    assert_eq!(value, None, "the release reached Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_still_wakes_on_release_after_its_subscription_was_reset() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let (holder, waiter) = (registry(&server.url()), registry(&proxy.url()));
    let held = holder
        .lock("k")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        waiter
            .lock("k")
            .wait(Duration::from_secs(20))
            .acquire()
            .await
            .map(|g| g.token().to_owned())
    });
    // Let the waiter subscribe, then cut its connections (the subscriber's included).
    let subscribed = |url: String| async move { subscribers(&url, "lock:k").await > 0 };
    eventually(Duration::from_secs(5), "the waiter subscribed", || {
        subscribed(server.url())
    })
    .await;
    let accepted = proxy.stats().accepted();
    proxy.reset_all();
    eventually(Duration::from_secs(5), "the waiter resubscribed", || {
        let reconnected = proxy.stats().accepted() > accepted;
        let check = subscribed(server.url());
        async move { reconnected && check.await }
    })
    .await;
    held.release().await.unwrap();
    // The lease is 30 s and the wait 20 s: only the notification on the re-established
    // subscription can hand the lock over in time.
    let token = waiting.await.unwrap().expect("the waiter got the lock");
    assert!(!token.is_empty());
}
