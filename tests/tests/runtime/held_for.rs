//! Attacks on `LockInfo::held_for` on Redis: the note beside a lock (`since:{<prefix><key>}`)
//! that its holder's renewals write, and that `inspect` reads only when it names the holder.

use std::time::Duration;

use lock_runtime::{LockGuard, Mode, Registry};
use lock_tests::cluster::RedisCluster;
use lock_tests::{
    command_counts, eventually, has_set_ifeq, renewed_on, warm_up, with_timeouts, RedisServer,
};
use tokio::time::Instant;

use super::support::registry;

/// Renewed every 100 ms: the first renewal (the one that notes) comes quickly.
const TTL: Duration = Duration::from_millis(300);
/// Any wait for a renewal or a hand-over.
const LIMIT: Duration = Duration::from_secs(10);
/// The stores count in whole milliseconds, on two clocks (client and server).
const SLACK: Duration = Duration::from_millis(5);

/// The note of `stored` (a lock's key on the server), as the protocol names it.
fn note_key(stored: &str) -> String {
    let tagged = stored
        .find('{')
        .and_then(|open| stored[open + 1..].find('}'))
        .is_some_and(|len| len > 0);
    if tagged {
        format!("since:{stored}")
    } else {
        format!("since:{{{stored}}}")
    }
}

/// The SHA-1 of `token` in hex, as the server's scripts compute it.
fn sha1(server: &RedisServer, token: &str) -> String {
    redis::cmd("EVAL")
        .arg("return redis.sha1hex(ARGV[1])")
        .arg(0)
        .arg(token)
        .query(&mut server.connection())
        .unwrap()
}

fn raw_get(server: &RedisServer, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut server.connection())
        .unwrap()
}

fn raw_exists(server: &RedisServer, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query(&mut server.connection())
        .unwrap()
}

/// `inspect(key)`: held by `token`, and not for longer than since `since` (when it came to
/// that holder, or earlier).
async fn held_at_most(reg: &Registry, key: &str, token: &str, since: Instant) -> Option<Duration> {
    let info = reg.inspect(key).await.expect("inspect");
    let limit = since.elapsed() + SLACK;
    assert_eq!(info.owner.as_deref(), Some(token), "{key}: {info:?}");
    if let Some(held) = info.held_for {
        assert!(
            held <= limit,
            "{key}: held for {held:?} by a holder that has had it at most {limit:?}: {info:?}"
        );
    }
    info.held_for
}

/// Waits for the first renewal of the holder of `key` (`stored` on the server), then says
/// how long it has held the lock: shown, and no longer than since `since`.
async fn noted(
    server: &RedisServer,
    reg: &Registry,
    key: &str,
    guard: &LockGuard,
    since: Instant,
) -> Duration {
    renewed_on(server, guard.redis_key(), LIMIT, "a renewal").await;
    held_at_most(reg, key, guard.token(), since)
        .await
        .unwrap_or_else(|| panic!("{key}: no time held shown after a renewal"))
}

/// Time passing is the point: a first hold long enough that a count carried over shows.
async fn let_time_pass() {
    tokio::time::sleep(Duration::from_millis(400)).await;
}

#[tokio::test]
async fn a_waiter_handed_the_lock_is_not_credited_with_the_last_holders_time() {
    let server = RedisServer::start();
    let (a, b, c) = (registry(&server), registry(&server), registry(&server));
    let asked = Instant::now();
    let first = a.lock("shift").ttl(TTL).acquire().await.unwrap();
    noted(&server, &a, "shift", &first, asked).await;
    let_time_pass().await;
    let waiting = |n: u32| {
        let a = a.clone();
        async move {
            eventually(LIMIT, "queued", || async {
                a.inspect("shift").await.unwrap().waiters == n
            })
            .await;
        }
    };
    let wait = |r: &Registry| r.lock("shift").ttl(TTL).wait(LIMIT).acquire();
    let second = tokio::spawn(wait(&b));
    waiting(1).await;
    let third = tokio::spawn(wait(&c));
    waiting(2).await;
    let released = Instant::now();
    first.release().await.unwrap();
    let second = second.await.unwrap().unwrap();
    // Handed over with a waiter left behind: the value carries the waited mark.
    held_at_most(&a, "shift", second.token(), released).await;
    noted(&server, &a, "shift", &second, released).await;
    let_time_pass().await;
    let released = Instant::now();
    second.release().await.unwrap();
    let third = third.await.unwrap().unwrap();
    held_at_most(&a, "shift", third.token(), released).await;
    noted(&server, &a, "shift", &third, released).await;
    third.release().await.unwrap();
    assert_eq!(a.inspect("shift").await.unwrap().held_for, None, "free");
}

#[tokio::test]
async fn a_lock_released_then_taken_by_another_counts_from_its_taking() {
    let server = RedisServer::start();
    let (a, b) = (registry(&server), registry(&server));
    let asked = Instant::now();
    let first = a.lock("job").ttl(TTL).acquire().await.unwrap();
    noted(&server, &a, "job", &first, asked).await;
    let_time_pass().await;
    first.release().await.unwrap();
    // The note may linger; a free lock shows no time held.
    let free = b.inspect("job").await.unwrap();
    assert_eq!(
        (free.owner.as_deref(), free.held_for),
        (None, None),
        "{free:?}"
    );
    let taken = Instant::now();
    let second = b.lock("job").ttl(TTL).acquire().await.unwrap();
    held_at_most(&b, "job", second.token(), taken).await;
    noted(&server, &b, "job", &second, taken).await;
    second.release().await.unwrap();
}

/// A lock taken from its holder (its key deleted, as an expiry would; or forced open by an
/// operator) and taken by another: the lost holder's renewals find the other's token and
/// write nothing, and the new holder's time counts from its taking.
#[tokio::test]
async fn a_lock_taken_away_and_retaken_counts_from_the_retaking() {
    let server = RedisServer::start();
    let (a, b) = (registry(&server), registry(&server));
    for (key, forced) in [("lost", false), ("forced", true)] {
        let asked = Instant::now();
        let first = a.lock(key).ttl(TTL).acquire().await.unwrap();
        noted(&server, &a, key, &first, asked).await;
        let_time_pass().await;
        if forced {
            assert!(b.force_unlock(key).await.unwrap());
        } else {
            let _: () = redis::cmd("DEL")
                .arg(first.redis_key())
                .query(&mut server.connection())
                .unwrap();
        }
        assert_eq!(b.inspect(key).await.unwrap().held_for, None, "{key}: free");
        let taken = Instant::now();
        let second = b.lock(key).ttl(TTL).acquire().await.unwrap();
        held_at_most(&b, key, second.token(), taken).await;
        first.lost().await;
        noted(&server, &b, key, &second, taken).await;
        let note = raw_get(&server, &note_key(second.redis_key())).expect("noted");
        assert!(
            note.starts_with(&format!("{} ", sha1(&server, second.token()))),
            "{key}: the note names the new holder: {note}"
        );
        second.release().await.unwrap();
    }
}

/// A renewal that finds the lock taken (someone else's value under the key before the holder's
/// first renewal) writes no note at all.
#[tokio::test]
async fn a_renewal_that_finds_the_lock_taken_writes_no_note() {
    let server = RedisServer::start();
    let reg = registry(&server);
    // Renewed after a second: the value is replaced well before.
    let guard = reg
        .lock("stolen")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("lock:stolen")
        .arg("somebody-else")
        .arg("KEEPTTL")
        .query(&mut server.connection())
        .unwrap();
    guard.lost().await;
    assert!(!raw_exists(&server, "since:{lock:stolen}"));
    let info = reg.inspect("stolen").await.unwrap();
    assert_eq!(info.owner.as_deref(), Some("somebody-else"));
    assert_eq!(info.held_for, None);
}

#[tokio::test]
async fn an_elections_next_term_counts_from_its_start() {
    let server = RedisServer::start();
    let (a, b) = (registry(&server), registry(&server));
    let asked = Instant::now();
    let first = a
        .election("leader")
        .ttl(TTL)
        .identity("one")
        .campaign()
        .await
        .unwrap();
    renewed_on(&server, "lock:leader", LIMIT, "the first term's renewal").await;
    let info = a.inspect("leader").await.unwrap();
    let held = info.held_for.expect("noted");
    assert!(held <= asked.elapsed() + SLACK, "{info:?}");
    let_time_pass().await;
    let next = tokio::spawn(b.election("leader").ttl(TTL).identity("two").campaign());
    eventually(LIMIT, "the second candidate in line", || async {
        a.inspect("leader").await.unwrap().waiters == 1
    })
    .await;
    let resigned = Instant::now();
    first.resign().await.unwrap();
    let second = next.await.unwrap().unwrap();
    let owner = b.inspect("leader").await.unwrap().owner.expect("led");
    assert!(owner.starts_with("two@"), "{owner}");
    held_at_most(&b, "leader", &owner, resigned).await;
    renewed_on(&server, "lock:leader", LIMIT, "the next term's renewal").await;
    let held = held_at_most(&b, "leader", &owner, resigned).await;
    assert!(held.is_some(), "the next term is noted");
    second.resign().await.unwrap();
}

/// What a foreign writer may leave at the note's key: never fails a renewal, never loses the
/// lock, never fails `inspect`.
#[tokio::test]
async fn a_foreign_value_at_the_note_never_fails_a_renewal_nor_inspect() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let mut con = server.connection();
    // Values no script wrote: left alone, whatever their type, and the lock goes without.
    let cases: [(&str, &[&str]); 5] = [
        ("garbage", &["SET", "since:{lock:garbage}", "not a note"]),
        ("empty", &["SET", "since:{lock:empty}", ""]),
        (
            "number",
            &["SET", "since:{lock:number}", "99999999999999999999"],
        ),
        ("hash", &["HSET", "since:{lock:hash}", "f", "v"]),
        ("list", &["RPUSH", "since:{lock:list}", "x"]),
    ];
    for (key, command) in cases {
        let _: redis::Value = redis::cmd(command[0])
            .arg(&command[1..])
            .query(&mut con)
            .unwrap();
        let dump = |con: &mut redis::Connection| -> Vec<u8> {
            redis::cmd("DUMP").arg(command[1]).query(con).unwrap()
        };
        let before = dump(&mut con);
        let asked = Instant::now();
        let guard = reg.lock(key).ttl(TTL).acquire().await.unwrap();
        renewed_on(&server, guard.redis_key(), LIMIT, key).await;
        renewed_on(&server, guard.redis_key(), LIMIT, key).await;
        assert!(!guard.is_lost(), "{key}");
        let held = held_at_most(&reg, key, guard.token(), asked).await;
        assert_eq!(held, None, "{key}");
        assert_eq!(dump(&mut con), before, "{key}: left as it was");
        guard.release().await.expect(key);
    }
}

/// Notes naming the holder (anyone who reads its token from `inspect` can write one) whose
/// time is no moment a renewal writes (not digits, negative, out of range, not finite): they
/// say nothing, `inspect` still answers, and the lock stays held. Before the scripts read only
/// digits, `nan`, `-inf`, `-1e400` and `-99999999999999999999` showed a lock held for 2^63 ms
/// (what was out of a 64-bit integer's range, read as a `u64`), first in `lockctl list
/// --oldest`, and the holder's renewals kept the note alive as their own.
#[tokio::test]
async fn a_note_naming_the_holder_without_a_moment_says_nothing() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let mut wrong = Vec::new();
    for (i, moment) in [
        "nonsense",
        "99999999999999999999",
        "-99999999999999999999",
        "1e400",
        "-1e400",
        "inf",
        "-inf",
        "nan",
        "0x7fffffffffffffff",
        "",
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("forged:{i}");
        let guard = reg.lock(&key).ttl(TTL).acquire().await.unwrap();
        let note = format!("{} {moment}", sha1(&server, guard.token()));
        let _: () = redis::cmd("SET")
            .arg(note_key(guard.redis_key()))
            .arg(&note)
            .query(&mut server.connection())
            .unwrap();
        renewed_on(&server, guard.redis_key(), LIMIT, &key).await;
        renewed_on(&server, guard.redis_key(), LIMIT, &key).await;
        assert!(!guard.is_lost(), "{moment:?}");
        match reg.inspect(&key).await {
            Ok(info) if info.held_for.is_none() => {}
            shown => wrong.push(format!("{moment:?}: {shown:?}")),
        }
        guard.release().await.unwrap();
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Keys with braces: a hash tag keeps its note in its slot, a stray or empty brace is wrapped
/// whole; either way each lock has its own note.
#[tokio::test]
async fn keys_with_braces_note_their_own_time_held() {
    let server = RedisServer::start();
    let reg = registry(&server);
    for key in ["a{}b", "{t}x", "}{", "{", "}", "{{x}}", "a{b}c{d}"] {
        let asked = Instant::now();
        let guard = reg.lock(key).ttl(TTL).acquire().await.unwrap();
        noted(&server, &reg, key, &guard, asked).await;
        let note = raw_get(&server, &note_key(guard.redis_key()));
        assert!(
            note.is_some_and(|n| n.starts_with(&sha1(&server, guard.token()))),
            "{key}: its note at {}",
            note_key(guard.redis_key())
        );
        guard.release().await.unwrap();
        assert_eq!(reg.inspect(key).await.unwrap().held_for, None, "{key}");
    }
}

#[tokio::test]
async fn readers_and_permit_holders_show_no_time_held_and_leave_no_note() {
    let server = RedisServer::start();
    let (a, b) = (registry(&server), registry(&server));
    let read = |r: &Registry| r.lock("doc").ttl(TTL).mode(Mode::Read).acquire();
    let (r1, r2) = (read(&a).await.unwrap(), read(&b).await.unwrap());
    renewed_on(&server, "lock:doc", LIMIT, "readers' renewal").await;
    renewed_on(&server, "lock:doc", LIMIT, "readers' renewal").await;
    let info = a.inspect("doc").await.unwrap();
    assert_eq!((info.readers, info.held_for), (Some(2), None), "{info:?}");
    assert!(!raw_exists(&server, "since:{lock:doc}"));
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    // The write side is exclusive: noted.
    let asked = Instant::now();
    let w = a
        .lock("doc")
        .ttl(TTL)
        .mode(Mode::Write)
        .acquire()
        .await
        .unwrap();
    noted(&server, &a, "doc", &w, asked).await;
    w.release().await.unwrap();

    let permit = |r: &Registry| r.lock("pool").ttl(TTL).permits(3).acquire();
    let (p1, p2) = (permit(&a).await.unwrap(), permit(&b).await.unwrap());
    renewed_on(&server, "lock:pool", LIMIT, "permits' renewal").await;
    renewed_on(&server, "lock:pool", LIMIT, "permits' renewal").await;
    let info = a.inspect("pool").await.unwrap();
    assert_eq!(info.held_for, None, "{info:?}");
    assert_eq!(info.permits.map(|p| p.held), Some(2), "{info:?}");
    assert!(!raw_exists(&server, "since:{lock:pool}"));
    assert!(!p1.is_lost() && !p2.is_lost());
    p1.release().await.unwrap();
    p2.release().await.unwrap();
}

#[tokio::test]
async fn every_key_of_a_multi_key_lock_shows_its_time_held() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let asked = Instant::now();
    let guard = reg
        .lock_all(["acct:1", "acct:2"])
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    renewed_on(&server, "lock:acct:2", LIMIT, "the renewal").await;
    for key in ["acct:1", "acct:2"] {
        let held = held_at_most(&reg, key, guard.token(), asked).await;
        assert!(held.is_some(), "{key}");
    }
    guard.release().await.unwrap();
    for key in ["acct:1", "acct:2"] {
        assert_eq!(reg.inspect(key).await.unwrap().held_for, None, "{key}");
    }
}

#[tokio::test]
async fn a_reentrant_acquisition_keeps_the_outer_holds_count() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let inner = reg.clone();
    let asked = Instant::now();
    let acquired = reg
        .lock("nest")
        .ttl(TTL)
        .run(async {
            let acquired = Instant::now();
            let outer = lock_runtime::current().unwrap();
            renewed_on(&server, "lock:nest", LIMIT, "the outer renewal").await;
            let_time_pass().await;
            let again = inner.lock("nest").ttl(TTL).acquire().await?;
            assert!(again.is_reentrant());
            let before = Instant::now();
            let held = held_at_most(&inner, "nest", outer.token(), asked)
                .await
                .expect("held");
            assert!(
                held + SLACK >= before - acquired,
                "{held:?}, held since {:?}",
                before - acquired
            );
            again.release().await?;
            renewed_on(&server, "lock:nest", LIMIT, "the outer renewal").await;
            let still = held_at_most(&inner, "nest", outer.token(), asked).await;
            assert!(still >= Some(held), "{still:?} after {held:?}");
            Ok::<_, lock_runtime::LockError>(acquired)
        })
        .await
        .unwrap();
    assert!(acquired >= asked);
    assert_eq!(reg.inspect("nest").await.unwrap().held_for, None, "free");
}

/// A note gone (deleted, evicted) comes back at a later noting renewal (every 32nd), with the
/// time since the lock was taken, not since the last renewal. On Valkey the renewals between
/// are `SET .. IFEQ`, and the noting one still goes through the script.
#[tokio::test]
async fn a_lost_note_comes_back_with_the_whole_time_held() {
    let server = RedisServer::start();
    let reg = registry(&server);
    // Renewed every 50 ms: 32 renewals take under 2 s, and a loaded machine keeps the lease.
    let ttl = Duration::from_millis(150);
    let ifeq = has_set_ifeq(&server.url()).await;
    let asked = Instant::now();
    let guard = reg.lock("kept").ttl(ttl).acquire().await.unwrap();
    let acquired = Instant::now();
    noted(&server, &reg, "kept", &guard, asked).await;
    let pttl = server.pttl("since:{lock:kept}");
    assert!(pttl > 0 && pttl <= 64 * 150, "{pttl}");
    let _: () = redis::cmd("DEL")
        .arg("since:{lock:kept}")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(reg.inspect("kept").await.unwrap().held_for, None);
    let (sets, _) = command_counts(&server.url(), "set").await;
    eventually(LIMIT, "noted again", || async {
        reg.inspect("kept").await.unwrap().held_for.is_some()
    })
    .await;
    let before = Instant::now();
    let held = held_at_most(&reg, "kept", guard.token(), asked)
        .await
        .expect("noted");
    assert!(
        held + SLACK >= before - acquired,
        "{held:?}, held since {:?}",
        before - acquired
    );
    if ifeq {
        // The renewals in between were `SET .. IFEQ`: the noting one still went by the script.
        let (after, _) = command_counts(&server.url(), "set").await;
        assert!(after >= sets + 20, "{sets} then {after} SETs");
    }
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
}

/// A fenced lock renews through the script (which keeps its counter) and is noted like any.
#[tokio::test]
async fn a_fenced_lock_is_noted_and_keeps_its_fence() {
    let server = RedisServer::start();
    let reg = registry(&server);
    let asked = Instant::now();
    let guard = reg
        .lock("fenced")
        .ttl(TTL)
        .fencing(true)
        .acquire()
        .await
        .unwrap();
    noted(&server, &reg, "fenced", &guard, asked).await;
    let info = reg.inspect("fenced").await.unwrap();
    assert_eq!(info.fence, guard.fence(), "{info:?}");
    guard.release().await.unwrap();
}

/// Until an inspection of `key` shows how long it has been held.
async fn noted_on_redlock(registry: &Registry, key: &str) {
    eventually(LIMIT, &format!("{key} noted"), || async {
        registry
            .inspect(key)
            .await
            .is_ok_and(|i| i.held_for.is_some())
    })
    .await;
}

#[tokio::test]
async fn redlock_notes_on_the_nodes_up_and_not_for_the_next_holder() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let reg = |nodes: &[RedisServer]| {
        with_timeouts(
            Registry::builder().redlock(nodes.iter().map(RedisServer::url)),
            Duration::from_millis(300),
        )
    };
    let (a, b) = (reg(&nodes), reg(&nodes));
    // Connected first, and a ttl long enough for a loaded machine: an attempt's budget on each
    // node is a tenth of it (30 ms at 300 ms was outlasted under the whole suite).
    warm_up(&a).await;
    warm_up(&b).await;
    let ttl = Duration::from_secs(3);
    let asked = Instant::now();
    let first = a.lock("job").ttl(ttl).acquire().await.unwrap();
    // Each node answers for itself: an inspection counts those that answer in time.
    noted_on_redlock(&a, "job").await;
    let held = held_at_most(&a, "job", first.token(), asked).await;
    assert!(held.is_some(), "noted");
    let_time_pass().await;
    first.release().await.unwrap();
    let taken = Instant::now();
    let second = b.lock("job").ttl(ttl).acquire().await.unwrap();
    held_at_most(&b, "job", second.token(), taken).await;
    second.release().await.unwrap();

    // One node down: the others note it.
    let mut nodes = nodes;
    nodes[2].kill();
    let asked = Instant::now();
    let guard = a.lock("down").ttl(ttl).acquire().await.unwrap();
    noted_on_redlock(&a, "down").await;
    let held = held_at_most(&a, "down", guard.token(), asked).await;
    assert!(held.is_some(), "noted on the nodes up");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn cluster_notes_beside_tagged_and_untagged_keys() {
    let cluster = RedisCluster::start(3, 0);
    let reg = with_timeouts(
        Registry::builder().cluster(cluster.seeds()),
        Duration::from_secs(2),
    );
    for key in ["job", "{tenant}:job", "a{}b"] {
        let asked = Instant::now();
        let guard = match reg.lock(key).ttl(TTL).acquire().await {
            Ok(guard) => guard,
            // A stray or empty brace is refused in a cluster.
            Err(e) if key == "a{}b" => {
                assert!(e.to_string().contains("brace"), "{e}");
                continue;
            }
            Err(e) => panic!("{key}: {e}"),
        };
        eventually(LIMIT, "noted", || async {
            reg.inspect(key).await.unwrap().held_for.is_some()
        })
        .await;
        held_at_most(&reg, key, guard.token(), asked).await;
        guard.release().await.unwrap();
        assert_eq!(reg.inspect(key).await.unwrap().held_for, None, "{key}");
    }
}
