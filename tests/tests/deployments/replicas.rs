//! `confirm_replicas`: acquisitions and renewals count only once replicas acknowledged them
//! (Redis `WAIT`), on one server with a replica. The Sentinel cases, a partition and a failover,
//! are in `sentinel.rs`.

use std::time::Duration;

use lock_runtime::{LockError, LostReason, Registry};
use lock_tests::{assert_lost, command_calls, with_timeouts, RedisServer};

fn master_and_replica() -> (RedisServer, RedisServer) {
    let master = RedisServer::start();
    let replica = RedisServer::start_replica_of(&master);
    (master, replica)
}

fn confirming(master: &RedisServer, replicas: u32) -> Registry {
    with_timeouts(
        Registry::builder()
            .url(master.url())
            .confirm_replicas(replicas),
        Duration::from_millis(500),
    )
}

fn value(server: &RedisServer, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut server.connection())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_returns_once_the_replica_holds_the_lock_and_fails_clearly_while_it_cannot()
{
    let (master, replica) = master_and_replica();
    let registry = confirming(&master, 1);
    let guard = registry
        .lock("job:1")
        .ttl(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    // No polling: WAIT answered before the acquisition returned.
    assert_eq!(
        value(&replica, "lock:job:1").as_deref(),
        Some(guard.token())
    );
    assert!(command_calls(&mut master.connection())["wait"] >= 1);
    guard.release().await.unwrap();

    // A replica that does not answer confirms nothing: each attempt within `wait` takes the
    // lock, is not acknowledged, gives it back; the caller is told why and what to do.
    replica.pause();
    let err = registry
        .lock("job:2")
        .ttl(Duration::from_secs(2))
        .wait(Duration::from_millis(400))
        .acquire()
        .await
        .unwrap_err();
    replica.resume();
    let message = err.to_string();
    for part in [
        "job:2",
        &format!("127.0.0.1:{}", master.port()),
        "0 of the 1 replicas asked for acknowledged it",
        "it was released",
        "INFO replication",
        "confirm_replicas",
    ] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
    assert!(matches!(err, LockError::Backend { .. }));
    assert_eq!(value(&master, "lock:job:2"), None, "nothing left behind");
    assert!(registry.held().is_empty());

    // Asking for more replicas than the master has is the same failure, named by its count.
    let err = confirming(&master, 2)
        .lock("job:3")
        .ttl(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("1 of the 2 replicas asked for acknowledged it"),
        "{err}"
    );
    assert_eq!(value(&master, "lock:job:3"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_the_replica_does_not_acknowledge_lose_the_lease_at_its_deadline_and_delete_nothing(
) {
    let (master, replica) = master_and_replica();
    let registry = confirming(&master, 1);
    // The acquisition's own acknowledgement has ttl/5: beside a CPU hog the replica can miss
    // it, and the acquisition is then retried within `wait` (what this test is about is the
    // renewals after it).
    let guard = registry
        .lock("job")
        .ttl(Duration::from_secs(1))
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    replica.pause();
    let lost = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the lease is lost once no renewal is confirmed");
    assert_lost(&lost, LostReason::Expired);
    // The master renewed every time (unconfirmed renewals are retried, never turned into a
    // delete): the key is still ours there, with an expiry.
    assert_eq!(value(&master, "lock:job").as_deref(), Some(guard.token()));
    let pttl: i64 = redis::cmd("PTTL")
        .arg("lock:job")
        .query(&mut master.connection())
        .unwrap();
    assert!(pttl > 0, "{pttl}");
    replica.resume();
    drop(guard);
}

#[test]
fn confirm_replicas_is_refused_where_it_cannot_hold_with_the_reason() {
    let refused = |builder: lock_runtime::RegistryBuilder| {
        builder.confirm_replicas(1).build().unwrap_err().to_string()
    };
    let cluster = refused(Registry::builder().cluster(["redis://127.0.0.1:7000"]));
    assert!(cluster.contains("min-replicas-to-write"), "{cluster}");
    let redlock = refused(Registry::builder().redlock([
        "redis://127.0.0.1:7001",
        "redis://127.0.0.1:7002",
        "redis://127.0.0.1:7003",
    ]));
    assert!(redlock.contains("independent masters"), "{redlock}");
    let memory = refused(Registry::builder().memory(lock_runtime::MemoryStore::new()));
    assert!(memory.contains("no replicas"), "{memory}");
    for message in [cluster, redlock, memory] {
        assert!(message.contains("confirm_replicas(1)"), "{message}");
    }
    // Zero is off, everywhere.
    Registry::builder()
        .cluster(["redis://127.0.0.1:7000"])
        .confirm_replicas(0)
        .build()
        .unwrap();
}

/// Every fencing token, of a lock, a multi-key lock and an election's terms, is above every
/// token handed out before, also after a failover to a replica that missed the last ones: the
/// replica is cut off (through a proxy that delivers nothing more), more tokens are taken on
/// the master, the master dies and the replica is promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_to_a_replica_that_missed_the_last_tokens_the_next_ones_are_still_greater()
{
    let mut master = RedisServer::start();
    let link = lock_tests::proxy::Proxy::start(master.port());
    let replica = RedisServer::start_replica_at(link.port());
    let on_master = lock_tests::fast_registry(&master.url());
    let (mut tokens, mut terms) = (Vec::new(), Vec::new());
    let take = async |registry: &Registry, tokens: &mut Vec<u64>, terms: &mut Vec<u64>| {
        for _ in 0..3 {
            let guard = registry
                .lock("invoice:7")
                .fencing(true)
                .acquire()
                .await
                .unwrap();
            tokens.push(guard.fence().expect("fenced"));
            guard.release().await.unwrap();
        }
        let both = registry
            .lock_all(["invoice:7", "invoice:8"])
            .fencing(true)
            .acquire()
            .await
            .unwrap();
        tokens.push(both.fence().expect("fenced"));
        both.release().await.unwrap();
        let term = registry
            .election("scheduler")
            .identity("a")
            .campaign()
            .await
            .unwrap();
        terms.push(term.term().expect("numbered"));
        term.resign().await.unwrap();
    };
    take(&on_master, &mut tokens, &mut terms).await;
    // `WAIT` waits for this connection's own writes: one after the first tokens covers them.
    let (_, acknowledged): ((), i64) = redis::pipe()
        .cmd("SET")
        .arg("replicated")
        .arg("up to here")
        .cmd("WAIT")
        .arg(1)
        .arg(10_000)
        .query(&mut master.connection())
        .unwrap();
    assert_eq!(acknowledged, 1, "the replica holds the first tokens");
    link.blackhole();
    take(&on_master, &mut tokens, &mut terms).await;
    master.kill();
    drop(link);
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica.connection())
        .unwrap();
    let missed: Option<u64> = redis::cmd("GET")
        .arg("fence:{lock:invoice:7}")
        .query(&mut replica.connection())
        .unwrap();
    assert!(
        missed < tokens.iter().max().copied(),
        "the promoted replica missed the last tokens: {missed:?} of {tokens:?}"
    );

    let on_replica = lock_tests::fast_registry(&replica.url());
    let (mut after, mut terms_after) = (Vec::new(), Vec::new());
    take(&on_replica, &mut after, &mut terms_after).await;
    let (last, last_term) = (tokens.iter().max().unwrap(), terms.iter().max().unwrap());
    for token in &after {
        assert!(token > last, "token {token} after {tokens:?}");
    }
    for term in &terms_after {
        assert!(term > last_term, "term {term} after {terms:?}");
    }
}
