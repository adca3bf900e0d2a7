use std::time::Duration;

use lock_runtime::{LockError, LostReason, Registry};
use lock_tests::cluster::RedisCluster;
use lock_tests::{renewed_on, with_timeouts};

/// Short timeouts, so operations on a dead master fail (and are retried by the library) well
/// within the tests' leases.
fn registry(cluster: &RedisCluster) -> Registry {
    with_timeouts(
        Registry::builder().cluster(cluster.seeds()),
        Duration::from_millis(300),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_spread_over_many_slots_exclude_fence_and_release() {
    let cluster = RedisCluster::start(3, 0);
    let (a, b) = (registry(&cluster), registry(&cluster));
    let mut held = Vec::new();
    for i in 0..150 {
        // Untagged keys land everywhere; tagged ones keep their tag's slot.
        let key = if i % 3 == 0 {
            format!("{{tenant:{i}}}:job")
        } else {
            format!("job:{i}")
        };
        let guard = a.lock(key.clone()).fencing(true).acquire().await.unwrap();
        assert!(guard.fence().is_some(), "{key}: counter in the lock's slot");
        assert!(b.lock(key).acquire().await.unwrap_err().is_busy());
        held.push(guard);
    }
    for guard in held {
        let key = guard.key().to_owned();
        let first_fence = guard.fence();
        guard.release().await.unwrap();
        let again = b.lock(key.clone()).fencing(true).acquire().await.unwrap();
        assert!(again.fence() > first_fence, "{key}");
        again.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_a_sharded_release_notification() {
    let cluster = RedisCluster::start(3, 0);
    let (a, b) = (registry(&cluster), registry(&cluster));
    let held = a
        .lock("deploy:7")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        b.lock("deploy:7")
            .wait(Duration::from_secs(20))
            .acquire()
            .await
    });
    // Wait until the waiter is parked on its shard channel.
    let port = cluster.master_port_of(&cluster.nodes[0], "lock:deploy:7");
    let owner = cluster.nodes.iter().find(|n| n.port() == port).unwrap();
    let mut con = owner.connection();
    loop {
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("SHARDNUMSUB")
            .arg("lock:deploy:7")
            .query(&mut con)
            .unwrap();
        if n == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    held.release().await.unwrap();
    let guard = waiter
        .await
        .unwrap()
        .expect("woken by the release, long before the 30 s lease");
    let info = a.inspect("deploy:7").await.unwrap();
    assert_eq!(info.owner.as_deref(), Some(guard.token()));
    assert!(info.remaining.unwrap() > Duration::from_secs(25));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_loses_only_its_own_locks() {
    let mut cluster = RedisCluster::start(3, 0);
    let reg = registry(&cluster);
    let ttl = Duration::from_secs(3);
    let mut held = Vec::new();
    for i in 0..60 {
        held.push(
            reg.lock(format!("job:{i}"))
                .ttl(ttl)
                .acquire()
                .await
                .unwrap(),
        );
    }
    let victim_port = cluster.nodes[0].port();
    let owners: Vec<u16> = held
        .iter()
        .map(|g| cluster.master_port_of(&cluster.nodes[1], g.redis_key()))
        .collect();
    assert!(
        owners.contains(&victim_port),
        "some locks live on the victim"
    );
    cluster.nodes[0].kill();
    for (guard, owner) in held.iter().zip(&owners) {
        if *owner == victim_port {
            let err = guard.lost().await;
            assert!(
                matches!(
                    err,
                    LockError::Lost {
                        reason: LostReason::Expired,
                        ..
                    }
                ),
                "{err:?}"
            );
        }
    }
    // By now every lock on the dead master has passed its deadline. Every lock on a live
    // master is still held, renewed and untouched: the death cost them nothing. (While renewals
    // went through the cluster client, which can hang in its own recovery after a death, about
    // one run in four under load lost them all to expiry.)
    for (guard, owner) in held.iter().zip(&owners) {
        if *owner != victim_port {
            let node = cluster.nodes.iter().find(|n| n.port() == *owner).unwrap();
            let value: Option<String> = redis::cmd("GET")
                .arg(guard.redis_key())
                .query(&mut node.connection())
                .unwrap();
            assert_eq!(
                (value.as_deref(), guard.lost_reason()),
                (Some(guard.token()), None),
                "{} on a live master",
                guard.key()
            );
        }
    }
}

/// After a failover that lost some locks (the promoted replica never had them, shown here by
/// deleting half of the copied ones on it before anyone else writes), a second holder may take
/// those at once: the first must hear of it from its next renewal (`Gone` or `Stolen`), not
/// from its own deadline running out, and the locks the replica kept stay with the first
/// holder. The ttl outlasts the failover several times, so every lease is still alive when the
/// replica takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_a_second_holder_is_never_silent() {
    let mut cluster = RedisCluster::start(3, 1);
    let (a, b) = (registry(&cluster), registry(&cluster));
    // `cluster-node-timeout` is 1 s: the replica is promoted within a few.
    let ttl = Duration::from_secs(15);
    let mut held = Vec::new();
    for i in 0..30 {
        held.push(
            a.lock(format!("order:{i}"))
                .ttl(ttl)
                .acquire()
                .await
                .unwrap(),
        );
    }
    let any = cluster.nodes.len() - 1;
    let victim_port = cluster.master_port_of(&cluster.nodes[any], held[0].redis_key());
    let victim = cluster
        .nodes
        .iter()
        .position(|n| n.port() == victim_port)
        .unwrap();
    let witness = (0..cluster.nodes.len())
        .rev()
        .find(|i| *i != victim)
        .unwrap();
    let on_victim: Vec<_> = held
        .iter()
        .filter(|g| cluster.master_port_of(&cluster.nodes[witness], g.redis_key()) == victim_port)
        .collect();
    assert!(on_victim.len() >= 2, "two locks on one master");
    // Every lock is on the replica before its master dies (`WAIT` after a write in their slot).
    let (_, copied): ((), i64) = redis::pipe()
        .cmd("SET")
        .arg(format!("{{{}}}:copied", held[0].redis_key()))
        .arg(1)
        .cmd("WAIT")
        .arg(1)
        .arg(10_000)
        .query(&mut cluster.nodes[victim].connection())
        .unwrap();
    assert_eq!(copied, 1, "the replica has every lock");
    cluster.nodes[victim].kill();
    let mut promoted = victim_port;
    lock_tests::eventually(Duration::from_secs(30), "the replica promoted", || {
        promoted = cluster.master_port_of(&cluster.nodes[witness], held[0].redis_key());
        let done = promoted != victim_port;
        async move { done }
    })
    .await;
    let new_master = cluster.nodes.iter().find(|n| n.port() == promoted).unwrap();
    let (lost, kept): (Vec<_>, Vec<_>) =
        on_victim.iter().enumerate().partition(|(i, _)| i % 2 == 0);
    for (_, guard) in &lost {
        let () = redis::cmd("DEL")
            .arg(guard.redis_key())
            .query(&mut new_master.connection())
            .unwrap();
    }
    for (_, guard) in lost {
        // A wait rides out the client's first look at the new slot map.
        let second = b
            .lock(guard.key())
            .ttl(ttl)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{} is free on the new master: {e}", guard.key()));
        // Bounded: a first holder that never hears would hang the test, not fail it.
        let heard = tokio::time::timeout(2 * ttl, guard.lost()).await;
        let err =
            heard.unwrap_or_else(|_| panic!("{} held twice, its first holder silent", guard.key()));
        assert!(err.is_lost(), "{err:?}");
        assert!(
            matches!(
                guard.lost_reason(),
                Some(LostReason::Gone | LostReason::Stolen)
            ),
            "{}: told by a renewal, not by its deadline: {:?}",
            guard.key(),
            guard.lost_reason()
        );
        drop(second);
    }
    for (_, guard) in kept {
        let err = b.lock(guard.key()).acquire().await.unwrap_err();
        assert!(err.is_busy(), "{}: {err:?}", guard.key());
        // Still its first holder's, also after a renewal on the new master.
        let what = format!("{} renewed on the new master", guard.key());
        renewed_on(new_master, guard.redis_key(), ttl, &what).await;
        assert!(
            !guard.is_lost(),
            "{}: {:?}",
            guard.key(),
            guard.lost_reason()
        );
    }
}

/// A registry that meets its cluster while it is still forming retries within `wait` and
/// succeeds once the cluster answers (a client whose slot map is wrong is replaced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_started_before_its_cluster_formed_locks_once_it_has() {
    let unformed = RedisCluster::unformed(3, 0);
    let reg = registry(&unformed);
    let keys: Vec<String> = (0..30).map(|i| format!("job:{i}")).collect();
    // Waiters already trying while the slots are being assigned.
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| {
            let (reg, key) = (reg.clone(), key.clone());
            tokio::spawn(async move {
                reg.lock(key)
                    .fencing(true)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
            })
        })
        .collect();
    let cluster = tokio::task::spawn_blocking(move || unformed.form())
        .await
        .unwrap();
    for task in tasks {
        let guard = task.await.unwrap().expect("locked once the cluster formed");
        guard.release().await.unwrap();
    }
    // And the registry keeps working afterwards.
    let guard = reg.lock("after").acquire().await.unwrap();
    guard.release().await.unwrap();
    drop(cluster);
}

/// Fresh registries against a cluster that `redis-cli --cluster create` has just returned from,
/// before every node agrees on the slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_registries_lock_on_a_cluster_created_a_moment_ago() {
    for _ in 0..3 {
        let cluster = RedisCluster::unformed(3, 0).create();
        for i in 0..5 {
            let reg = registry(&cluster);
            for key in ["a", "b", "c", "{t}:d"] {
                let guard = reg
                    .lock(format!("{key}:{i}"))
                    .fencing(true)
                    .wait(Duration::from_secs(15))
                    .acquire()
                    .await
                    .unwrap_or_else(|e| panic!("registry {i}, key {key}: {e}"));
                guard.release().await.unwrap();
            }
        }
    }
}

/// Two locks held in one slot while it migrates for two ttls, one of them `MIGRATE`d midway, and
/// a third taken during the migration: each is renewed, excludes, and is released wherever its
/// key is; a fenced acquisition whose keys cannot be on one node yet waits out the migration
/// and continues the counter; afterwards everything is done on the new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_through_a_slot_migration_is_renewed_acquired_and_released_on_the_new_owner() {
    let cluster = RedisCluster::start(3, 0);
    let (a, b) = (registry(&cluster), registry(&cluster));
    let ttl = Duration::from_millis(1500);
    // One slot, through the `{m}` hash tag.
    let stays = a
        .lock("{m}:stays")
        .ttl(ttl)
        .fencing(true)
        .acquire()
        .await
        .unwrap();
    let moves = a
        .lock("{m}:moves")
        .ttl(ttl)
        .fencing(true)
        .acquire()
        .await
        .unwrap();
    let migration = cluster.migrate_slot_of(stays.redis_key());

    // A lock on the source still excludes (its script runs there).
    assert!(b.lock("{m}:stays").acquire().await.unwrap_err().is_busy());
    // A new key goes where the slot is going, and excludes from there.
    let fresh = b.lock("{m}:fresh").ttl(ttl).acquire().await.unwrap();
    assert_eq!(migration.on_source(fresh.redis_key()), None);
    assert_eq!(
        migration.on_target(fresh.redis_key()).as_deref(),
        Some(fresh.token())
    );
    assert!(a.lock("{m}:fresh").acquire().await.unwrap_err().is_busy());

    // One held lock moves with its counter; the other stays on the source.
    let moves_fence = format!("fence:{}", moves.redis_key());
    migration.move_keys(&[moves.redis_key(), &moves_fence]);
    assert!(b
        .lock("{m}:moves")
        .fencing(true)
        .acquire()
        .await
        .unwrap_err()
        .is_busy());
    // The migration lasts two ttls: a lease not renewed on its key's node would expire in it.
    tokio::time::sleep(2 * ttl).await;
    assert_eq!(
        migration.on_source(stays.redis_key()).as_deref(),
        Some(stays.token())
    );
    assert_eq!(
        migration.on_target(moves.redis_key()).as_deref(),
        Some(moves.token())
    );
    assert_eq!(
        (
            stays.lost_reason(),
            moves.lost_reason(),
            fresh.lost_reason()
        ),
        (None, None, None)
    );

    // Releasing the moved lock deletes it on the target at once.
    let (moves_key, old_fence) = (moves.redis_key().to_owned(), moves.fence().unwrap());
    moves.release().await.unwrap();
    assert_eq!(migration.on_target(&moves_key), None);
    // A fenced acquisition names the lock and its counter, which Redis serves on one node only
    // when both are there; it retries within `wait` until the migration is over.
    let again = tokio::spawn({
        let b = b.clone();
        async move {
            b.lock("{m}:moves")
                .ttl(ttl)
                .fencing(true)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        }
    });

    let target = migration.target().port();
    migration.finish();
    let target = cluster.nodes.iter().find(|n| n.port() == target).unwrap();
    let again = again
        .await
        .unwrap()
        .expect("acquired once the migration ended");
    assert!(again.fence().unwrap() > old_fence, "the counter went on");
    // The lock that stayed behind until the end is renewed on its new owner...
    renewed_on(
        target,
        stays.redis_key(),
        2 * ttl,
        "a renewal on the new owner",
    )
    .await;
    assert_eq!(stays.lost_reason(), None);
    // ...and every lock is released there.
    for guard in [stays, fresh, again] {
        let key = guard.redis_key().to_owned();
        guard.release().await.unwrap();
        assert_eq!(target.pttl(&key), -2, "{key} left behind");
    }
    let after = a.lock("{m}:stays").acquire().await.unwrap();
    after.release().await.unwrap();
}

/// An untagged lock (its counter tagged with the lock's whole name) moved to the target while
/// held: renewed and contended there through the source's `ASK`, released there, taken again
/// there before the migration ends, and its counter continued on the new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_migrated_while_held_is_renewed_released_and_taken_again_on_its_target() {
    let cluster = RedisCluster::start(3, 0);
    let (a, b) = (registry(&cluster), registry(&cluster));
    let ttl = Duration::from_millis(1500);
    let held = a
        .lock("deploy:7")
        .ttl(ttl)
        .fencing(true)
        .acquire()
        .await
        .unwrap();
    let first_fence = held.fence().unwrap();
    let migration = cluster.migrate_slot_of(held.redis_key());
    migration.move_keys(&[held.redis_key(), &format!("fence:{{{}}}", held.redis_key())]);
    assert_eq!(migration.on_source(held.redis_key()), None);
    assert!(b
        .lock("deploy:7")
        .fencing(true)
        .acquire()
        .await
        .unwrap_err()
        .is_busy());
    // The migration lasts two ttls: the lease lives only if renewed on the target.
    tokio::time::sleep(2 * ttl).await;
    assert_eq!(
        migration.on_target(held.redis_key()).as_deref(),
        Some(held.token())
    );
    assert_eq!(held.lost_reason(), None);
    let key = held.redis_key().to_owned();
    held.release().await.unwrap();
    assert_eq!(migration.on_target(&key), None);

    // Without fencing the lock is one key, which the target serves during the migration. Its
    // lease must outlive a loaded machine's slow renewals once the migration ends: it is only
    // watched for one renewal there.
    let second_ttl = 2 * ttl;
    let second = b.lock("deploy:7").ttl(second_ttl).acquire().await.unwrap();
    assert_eq!(migration.on_target(&key).as_deref(), Some(second.token()));
    assert!(a.lock("deploy:7").acquire().await.unwrap_err().is_busy());

    let target = migration.target().port();
    migration.finish();
    let target = cluster.nodes.iter().find(|n| n.port() == target).unwrap();
    let renewed = renewed_on(target, &key, 2 * second_ttl, "a renewal on the new owner");
    tokio::select! {
        () = renewed => {}
        lost = second.lost() => panic!("lost once the migration ended: {lost}"),
    }
    assert_eq!(second.lost_reason(), None);
    second.release().await.unwrap();
    assert_eq!(target.pttl(&key), -2, "left behind");
    let third = a.lock("deploy:7").fencing(true).acquire().await.unwrap();
    assert!(third.fence().unwrap() > first_fence, "the counter went on");
    third.release().await.unwrap();
}

/// A semaphore's set lives in its key's slot like a lock, with the waiters' queue beside it,
/// also when the key names a hash tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_keeps_its_permits_on_the_master_of_its_slot() {
    let cluster = RedisCluster::start(3, 0);
    let (a, b) = (registry(&cluster), registry(&cluster));
    // An untagged key is in the conformance suite.
    lock_tests::semaphore_round(&a, &b, "{tenant:7}:pool").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_lock_keeps_its_readers_on_the_master_of_its_slot() {
    let cluster = RedisCluster::start(3, 0);
    let (a, b) = (registry(&cluster), registry(&cluster));
    lock_tests::read_write_round(&a, &b, "{tenant:7}:catalog").await;
}

/// Several keys go to one node in one script, so they must share a slot: a common hash tag.
/// Once they do, they are taken together (`conformance::several_keys_are_taken_all_or_none`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_in_different_slots_are_refused_with_a_hash_tag_to_use() {
    let cluster = RedisCluster::start(3, 0);
    let a = registry(&cluster);
    let err = a
        .lock_all(["account:1", "account:2"])
        .acquire()
        .await
        .unwrap_err();
    let LockError::InvalidKey { reason, .. } = &err else {
        panic!("keys in different slots are refused: {err:?}");
    };
    assert!(
        reason.contains("hash tag") && reason.contains("{accounts}"),
        "{reason}"
    );
}
