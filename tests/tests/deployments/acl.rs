use std::time::Duration;

use lock_runtime::Registry;
use lock_tests::{renewed_on, RedisServer, RENEWED_TTL};

/// The keys and channels of a lock user under the default prefix: the locks, their fencing
/// counters and waiters' queues (tagged and untagged names), and their notifications; then
/// the notes of how long a lock has been held (see [`HELD_NOTES`]).
const KEYS_AND_CHANNELS: [&str; 10] = [
    "~lock:*",
    "~fence:lock:*",
    "~fence:{lock:*",
    "~queue:lock:*",
    "~queue:{lock:*",
    "~queued:lock:*",
    "~queued:{lock:*",
    "&lock:*",
    "~since:lock:*",
    "~since:{lock:*",
];

/// The patterns of the notes of how long a lock has been held, the last of
/// [`KEYS_AND_CHANNELS`]: an ACL written before they existed lacks them.
const HELD_NOTES: usize = 2;

/// An ACL written before the notes of how long a lock has been held (without its `since:`
/// patterns) still locks and renews: the notes are neither written nor read, `inspect` shows
/// no time held, and the server logs no denial. With the patterns, the time held is shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_without_the_held_notes_renews_without_them_and_logs_no_denial() {
    let limit = Duration::from_secs(20);
    let server = RedisServer::start();
    let mut admin = server.connection();
    let setuser = |admin: &mut redis::Connection, patterns: &[&str]| {
        let mut cmd = redis::cmd("ACL");
        cmd.arg(&["SETUSER", "locker", "reset", "on", ">s3cret-pw"][..])
            .arg(patterns)
            .arg("+@all");
        let _: () = cmd.query(admin).expect("ACL SETUSER");
    };
    let before_notes = &KEYS_AND_CHANNELS[..KEYS_AND_CHANNELS.len() - HELD_NOTES];
    setuser(&mut admin, before_notes);
    let url = format!("redis://locker:s3cret-pw@127.0.0.1:{}/", server.port());
    let registry = Registry::from_url(&url).unwrap();

    let held = registry
        .lock("job")
        .ttl(RENEWED_TTL)
        .acquire()
        .await
        .unwrap();
    // The first renewal is the one that notes the time held.
    renewed_on(&server, "lock:job", limit, "the first renewal").await;
    let info = registry.inspect("job").await.unwrap();
    assert_eq!(info.owner.as_deref(), Some(held.token()), "{info:?}");
    assert_eq!(info.held_for, None, "no note without the patterns");
    let noted: bool = redis::cmd("EXISTS")
        .arg("since:{lock:job}")
        .query(&mut admin)
        .unwrap();
    assert!(!noted);
    held.release()
        .await
        .expect("renewed and released as always");
    let log: Vec<redis::Value> = redis::cmd("ACL").arg("LOG").query(&mut admin).unwrap();
    assert!(log.is_empty(), "no denial logged: {log:?}");

    setuser(&mut admin, &KEYS_AND_CHANNELS);
    // A key with a hash tag keeps it: the note shares its cluster slot.
    for (key, note) in [
        ("job", "since:{lock:job}"),
        ("{batch}:1", "since:lock:{batch}:1"),
    ] {
        let held = registry.lock(key).ttl(RENEWED_TTL).acquire().await.unwrap();
        let stored = registry.redis_key(key);
        renewed_on(&server, &stored, limit, "the first renewal").await;
        let info = registry.inspect(key).await.unwrap();
        assert!(info.held_for.is_some(), "{key}: {info:?}");
        let noted: bool = redis::cmd("EXISTS").arg(note).query(&mut admin).unwrap();
        assert!(noted, "{key}: the note lives where the protocol names it");
        held.release().await.unwrap();
    }
}

#[tokio::test]
async fn an_acl_user_limited_to_the_lock_keys_can_lock_wait_and_fence() {
    // One argument per ACL rule: redis-server quotes an argument that holds spaces.
    let user = [
        "--user",
        "default",
        "off",
        "--user",
        "locker",
        "on",
        ">s3cret-pw",
    ];
    let args: Vec<&str> = user
        .into_iter()
        .chain(KEYS_AND_CHANNELS)
        .chain(["+@all"])
        .collect();
    let server = RedisServer::start_with(&args);
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

/// The lock user's ACL in a Redis Cluster, as GUARANTEES.md's Security section gives it: the single
/// server's commands with the sharded notifications (`spublish`, `ssubscribe`, `sunsubscribe`)
/// in place of the plain ones, plus the slot map (`cluster|slots`: the cluster client and the
/// lease keeper read it), `asking` (commands that follow a migrating slot's keys) and `ping`
/// (the cluster client checks its connections with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_lock_user_needs_the_sharded_and_cluster_commands_documented() {
    let cluster = lock_tests::cluster::RedisCluster::start(3, 0);
    let user = ["SETUSER", "locker", "reset", "on", ">s3cret-pw"];
    let commands = [
        "-@all",
        "+set",
        "+evalsha",
        "+script|load",
        "+get",
        "+del",
        "+pexpire",
        "+pttl",
        "+type",
        "+time",
        "+exists",
        "+zadd",
        "+zrange",
        "+zrem",
        "+zscore",
        "+zrangebyscore",
        "+zremrangebyscore",
        "+zcard",
        "+zcount",
        "+hset",
        "+hget",
        "+hdel",
        "+spublish",
        "+ssubscribe",
        "+sunsubscribe",
        "+cluster|slots",
        "+asking",
        "+ping",
    ];
    // Valkey 9: the release of a lock nobody waited for, as GUARANTEES.md says.
    let delifeq = lock_tests::has_command(&mut cluster.nodes[0].connection(), "DELIFEQ");
    let rules: Vec<&str> = user
        .into_iter()
        .chain(KEYS_AND_CHANNELS)
        .chain(commands)
        .chain(delifeq.then_some("+delifeq"))
        .collect();
    for node in &cluster.nodes {
        let mut con = node.connection();
        let _: () = redis::cmd("ACL").arg(&rules).query(&mut con).unwrap();
        let _: () = redis::cmd("ACL")
            .arg("LOG")
            .arg("RESET")
            .query(&mut con)
            .unwrap();
    }
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://locker:s3cret-pw@127.0.0.1:{}/", n.port()))
        .collect();
    let registry = || {
        lock_tests::with_timeouts(
            Registry::builder().cluster(seeds.clone()),
            Duration::from_secs(1),
        )
    };
    let (a, b) = (registry(), registry());
    // A short lease: renewed before the release.
    let held = a
        .lock("job")
        .ttl(lock_tests::RENEWED_TTL)
        .fencing(true)
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        b.lock("job")
            .fencing(true)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
    });
    tokio::time::sleep(lock_tests::RENEWED_TTL * 2).await;
    assert_eq!(held.lost_reason(), None, "renewed all along");
    let first = held.fence().unwrap();
    held.release().await.unwrap();
    let next = waiter.await.unwrap().expect("handed over, notified");
    assert!(next.fence().unwrap() > first);
    next.release().await.unwrap();
    for node in &cluster.nodes {
        let log: Vec<redis::Value> = redis::cmd("ACL")
            .arg("LOG")
            .query(&mut node.connection())
            .unwrap();
        // `CLIENT SETINFO` (Redis 7.2+, Valkey) is refused harmlessly, as GUARANTEES.md says.
        let refused: Vec<&redis::Value> = log
            .iter()
            .filter(|entry| !format!("{entry:?}").contains("client|setinfo"))
            .collect();
        assert!(refused.is_empty(), "no command refused: {refused:?}");
    }
}
