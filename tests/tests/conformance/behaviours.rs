//! The store contract's behaviours, each written once for every store. Each takes a fresh
//! store and uses its own keys; a store that declares a lack (`Store::lacks`) is held to what
//! it promises instead.

use std::time::{Duration, Instant};

use lock_runtime::{Leader, LockError, LockInfo, LostReason, Mode, Observer, Permits};
use lock_tests::{assert_lost, eventually, most_inside, spawn_hung_body_holding, RENEWED_TTL};

use super::stores::{Lack, Store, LIMIT};

/// A holder's lease long enough that nothing here waits for it to run out.
const LONG: Duration = Duration::from_secs(30);

/// One holder at a time: a second caller is refused with the holder's remaining lease, gets
/// the lock once it is released, and bodies on two registries never overlap.
pub async fn exclusion(s: &Store) {
    let (a, b) = s.pair();
    let held = a
        .lock("job")
        .ttl(LONG)
        .acquire()
        .await
        .expect("a free lock");
    let err = b.lock("job").acquire().await.unwrap_err();
    let LockError::Busy { retry_after, .. } = &err else {
        panic!("{s}: a second caller is refused as busy: {err:?}");
    };
    assert!(retry_after.is_some_and(|left| left <= LONG), "{s}: {err:?}");
    held.release().await.expect("release");
    let next = b
        .lock("job")
        .acquire()
        .await
        .expect("free after the release");
    next.release().await.expect("release");
    let most = most_inside(&[a, b], "counter", None, 4, 5).await;
    assert_eq!(most, 1, "{s}: {most} bodies inside at once");
}

/// Release and renewal touch only the caller's own lock: a lease that ran out is not released
/// from under the next holder, and the keeper of a lease whose key was taken away does not
/// renew the lock now under it.
pub async fn release_and_renewal_are_owner_checked(s: &Store) {
    let (a, b) = s.pair();
    let expired = a
        .lock("job")
        .ttl(Duration::from_millis(300))
        .renew(false)
        .wait(LIMIT)
        .acquire()
        .await
        .expect("a free lock");
    assert_lost(&expired.lost().await, LostReason::NotRenewed);
    // The key itself may outlive the local deadline by the drift margin.
    let next = b.lock("job").ttl(LONG).wait(LIMIT).acquire().await;
    let next = next.expect("free once the lease ran out");
    let err = expired.release().await.unwrap_err();
    assert!(matches!(err, LockError::NotOwner { .. }), "{s}: {err:?}");
    let info = b.inspect("job").await.expect("inspect");
    assert_eq!(info.owner.as_deref(), Some(next.token()), "{s}");
    next.release().await.expect("release");

    let renewed = a.lock("report").ttl(RENEWED_TTL).acquire().await.unwrap();
    assert!(b.force_unlock("report").await.expect("force-unlock"), "{s}");
    let taker = b.lock("report").ttl(LONG).acquire().await.expect("free");
    let err = renewed.lost().await;
    assert!(err.is_lost(), "{s}: {err:?}");
    let info = b.inspect("report").await.expect("inspect");
    assert_eq!(info.owner.as_deref(), Some(taker.token()), "{s}");
    assert!(
        info.remaining.is_some_and(|left| left > LONG - LIMIT / 2),
        "{s}: the lost lease's renewal cut the next holder's lock to its own ttl: {info:?}"
    );
    taker.release().await.expect("release");
}

/// Each holder of a key gets a greater fencing token than every holder before it, from any
/// registry and through a hand-over, and `inspect` shows the last one. A store without fencing
/// refuses to pretend.
pub async fn fencing_tokens_rise_with_every_holder(s: &Store) {
    let (a, b) = s.pair();
    if s.lacks(Lack::Fencing).is_some() {
        let err = a.lock("invoice").fencing(true).acquire().await.unwrap_err();
        assert!(
            matches!(err, LockError::InvalidOptions { .. }),
            "{s}: {err:?}"
        );
        let info = a.inspect("invoice").await.expect("inspect");
        assert_eq!(info.owner, None, "{s}: nothing was taken");
        return;
    }
    let mut last = 0;
    for registry in [&a, &b, &a, &b] {
        let guard = registry.lock("invoice").fencing(true).acquire().await;
        let guard = guard.expect("a free lock");
        let fence = guard.fence().expect("fencing was asked for");
        assert!(fence > last, "{s}: {fence} after {last}");
        assert_eq!(
            b.inspect("invoice").await.expect("inspect").fence,
            Some(fence)
        );
        last = fence;
        guard.release().await.expect("release");
    }
    let held = a.lock("invoice").fencing(true).acquire().await.unwrap();
    let waiter = tokio::spawn({
        let request = b.lock("invoice").fencing(true).wait(LIMIT);
        request.acquire()
    });
    s.until_queued(&a, "invoice", 1).await;
    let before = held.fence().expect("fenced");
    held.release().await.expect("release");
    let next = waiter.await.expect("task").expect("handed over");
    assert!(next.fence() > Some(before), "{s}: {next:?} after {before}");
    next.release().await.expect("release");
}

/// Waiters are served in the order they came, one after another, each holding the lock when
/// its turn comes, and `inspect` lists them in that order. A store without a queue serves every
/// waiter, in any order, and lists none.
pub async fn waiters_are_served_first_come_first_served(s: &Store) {
    let holder = s.registry();
    let held = holder.lock("fifo").ttl(LONG).acquire().await.unwrap();
    let (served_tx, mut served) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..4 {
        // One registry each: four processes, as far as the store can tell.
        let (registry, served_tx) = (s.registry(), served_tx.clone());
        tokio::spawn(async move {
            let guard = registry.lock("fifo").wait(LIMIT).acquire().await;
            let guard = guard.unwrap_or_else(|e| panic!("waiter {i} never got its turn: {e}"));
            served_tx
                .send((i, guard.token().to_owned()))
                .expect("the test listens");
            guard.release().await.expect("release");
        });
        s.until_queued(&holder, "fifo", i + 1).await;
    }
    let queue = holder.inspect("fifo").await.expect("inspect").queue;
    held.release().await.expect("release");
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(served.recv().await.expect("every waiter is served"));
    }
    let tokens: Vec<String> = order.iter().map(|(_, token)| token.clone()).collect();
    let mut order: Vec<usize> = order.into_iter().map(|(i, _)| i).collect();
    if s.lacks(Lack::Queue).is_some() {
        order.sort_unstable();
        assert_eq!(queue, [], "{s}: nobody queues");
    } else {
        let listed: Vec<String> = queue.iter().map(|place| place.token.clone()).collect();
        assert_eq!(
            listed, tokens,
            "{s}: inspect lists the queue in the order it is served"
        );
        assert!(
            queue.iter().all(|place| place.remaining > Duration::ZERO),
            "{s}: {queue:?}"
        );
    }
    assert_eq!(order, [0, 1, 2, 3], "{s}: the order waiters were served in");
}

/// A parked waiter sends (next to) nothing until the release, which wakes it at once: long
/// before the holder's lease would have ended.
pub async fn a_waiter_is_woken_by_the_release_without_polling(s: &Store) {
    let (a, b) = s.pair();
    let held = a.lock("queue").ttl(LONG).acquire().await.unwrap();
    let waiter = tokio::spawn(b.lock("queue").wait(LONG).acquire());
    s.until_queued(&a, "queue", 1).await;
    let before = s.commands_for(&a, "queue");
    // Time passing is the point: a polling waiter would show itself.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    match (before, s.commands_for(&a, "queue")) {
        (Some(before), Some(after)) => {
            // At most one retry per server right after subscribing, which may land in the
            // window (an attempt counts its script and the `SET` inside: 2). The holder renews
            // only every 10 s.
            let servers = if s.kind == super::stores::Kind::Redlock {
                3
            } else {
                1
            };
            let sent = after - before;
            assert!(
                sent <= 3 * servers,
                "{s}: {sent} lock commands while parked"
            );
        }
        _ => eprintln!(
            "{s} has no server whose commands could be counted; it wakes waiters in-process"
        ),
    }
    let released = Instant::now();
    held.release().await.expect("release");
    let next = waiter.await.expect("task").expect("woken by the release");
    let woken = released.elapsed();
    assert!(woken < LIMIT / 2, "{s}: woken after {woken:?}");
    next.release().await.expect("release");
}

/// A lease taken away (an operator's force-unlock) is lost at the holder's next renewal: the
/// body is stopped with `Lost`, and a guard reports it.
pub async fn a_lease_taken_away_is_lost_and_reported(s: &Store) {
    let (a, b) = s.pair();
    let (current, body) = spawn_hung_body_holding(a.lock("job").ttl(RENEWED_TTL)).await;
    assert!(b.force_unlock("job").await.expect("force-unlock"), "{s}");
    let err = body.await.expect("task").unwrap_err();
    assert_lost(&err, LostReason::Gone);
    assert!(current.is_lost(), "{s}: the body's handle shows it");
    let guard = a.lock("report").ttl(RENEWED_TTL).acquire().await.unwrap();
    assert!(b.force_unlock("report").await.expect("force-unlock"), "{s}");
    assert_lost(&guard.lost().await, LostReason::Gone);
    assert_eq!(guard.lost_reason(), Some(LostReason::Gone), "{s}");
}

/// A semaphore: its permits held at once from two registries, never more bodies inside than
/// permits, and a taker refused with the soonest permit's lease; a waiter woken by a release,
/// the count shown by `inspect`, and the key gone with the last release.
pub async fn permits_are_held_up_to_their_number(s: &Store) {
    let (a, b) = s.pair();
    let mut held = Vec::new();
    for registry in [&a, &b, &a] {
        let permit = registry.lock("pool").permits(3).ttl(LONG).acquire().await;
        held.push(permit.expect("a free permit"));
    }
    let info = b.inspect("pool").await.expect("inspect");
    assert_eq!(info.permits, Some(Permits { held: 3, total: 3 }), "{s}");
    assert_eq!(info.owner, None, "{s}: a semaphore has no single owner");
    // Each holder with its lease, the longest first.
    let mut shown: Vec<&str> = info.holders.iter().map(|p| p.token.as_str()).collect();
    let mut tokens: Vec<&str> = held.iter().map(lock_runtime::LockGuard::token).collect();
    shown.sort_unstable();
    tokens.sort_unstable();
    assert_eq!(shown, tokens, "{s}: {info:?}");
    assert!(
        info.holders
            .windows(2)
            .all(|pair| pair[0].remaining >= pair[1].remaining)
            && info
                .holders
                .iter()
                .all(|p| p.remaining <= LONG && p.remaining > LONG - LIMIT),
        "{s}: {info:?}"
    );
    let err = b.lock("pool").permits(3).acquire().await.unwrap_err();
    let LockError::Busy { retry_after, .. } = err else {
        panic!("{s}: a fourth taker is refused: {err:?}");
    };
    assert!(retry_after.is_some_and(|left| left <= LONG), "{s}");
    let waiter = tokio::spawn(b.lock("pool").permits(3).wait(LIMIT).acquire());
    s.until_waiting(&a, "pool", 1).await;
    held.pop().expect("three").release().await.expect("release");
    let fourth = waiter.await.expect("task").expect("woken by the release");
    let info = a.inspect("pool").await.expect("inspect");
    assert_eq!(info.permits, Some(Permits { held: 3, total: 3 }), "{s}");
    for permit in held.into_iter().chain([fourth]) {
        permit.release().await.expect("release");
    }
    let info = a.inspect("pool").await.expect("inspect");
    assert_eq!(info.permits, None, "{s}: the last release deletes the key");
    let most = most_inside(&[a, b], "gpus", Some(2), 6, 5).await;
    assert!(most <= 2, "{s}: {most} holders at once with 2 permits");
}

/// Readers share a key and a writer holds it alone: a writer waits for the readers, readers
/// wait for the writer, and the readers waiting for it all enter at its release.
pub async fn readers_share_and_a_writer_holds_alone(s: &Store) {
    let (a, b) = s.pair();
    let read = |registry: &lock_runtime::Registry| registry.lock("catalog").mode(Mode::Read);
    let readers = [
        read(&a).acquire().await.expect("a reader"),
        read(&b).acquire().await.expect("a second reader beside it"),
    ];
    assert_eq!(b.inspect("catalog").await.unwrap().readers, Some(2), "{s}");
    let err = a.lock("catalog").acquire().await.unwrap_err();
    assert!(
        err.is_busy(),
        "{s}: a writer waits for the readers: {err:?}"
    );
    for reader in readers {
        reader.release().await.expect("release");
    }
    let writer = a.lock("catalog").ttl(LONG).acquire().await;
    let writer = writer.expect("the writer, once the readers are gone");
    let err = read(&b).acquire().await.unwrap_err();
    assert!(err.is_busy(), "{s}: a reader waits for the writer: {err:?}");
    let waiting = tokio::spawn(read(&b).wait(LIMIT).acquire());
    s.until_waiting(&a, "catalog", 1).await;
    let others: Vec<_> = (0..2)
        .map(|_| tokio::spawn(read(&b).wait(LIMIT).acquire()))
        .collect();
    writer.release().await.expect("release");
    let mut readers = vec![waiting.await.expect("task").expect("woken")];
    for reader in others {
        readers.push(
            reader
                .await
                .expect("task")
                .expect("every waiting reader gets in"),
        );
    }
    assert_eq!(a.inspect("catalog").await.unwrap().readers, Some(3), "{s}");
    for reader in readers {
        reader.release().await.expect("release");
    }
}

/// A lock over two keys is taken all or none: not while one is held elsewhere (the other left
/// free), then both at once and each refused to others, its waiter woken by the release of
/// the key it found taken, and both free after its release. The keys share a hash tag, as a
/// cluster asks.
pub async fn several_keys_are_taken_all_or_none(s: &Store) {
    let (a, b) = s.pair();
    let (first, second) = ("{accounts}:1", "{accounts}:2");
    let held = b.lock(second).ttl(LONG).acquire().await.expect("one key");
    let err = a.lock_all([first, second]).acquire().await.unwrap_err();
    assert!(err.is_busy(), "{s}: all or none: {err:?}");
    let info = a.inspect(first).await.expect("inspect");
    assert_eq!(info.owner, None, "{s}: the free key was not taken alone");
    let waiter = tokio::spawn(a.lock_all([second, first]).ttl(LONG).wait(LIMIT).acquire());
    s.until_waiting(&b, second, 1).await;
    held.release().await.expect("release");
    let both = waiter.await.expect("task").expect("woken by the release");
    for key in [first, second] {
        let info = b.inspect(key).await.expect("inspect");
        assert_eq!(info.owner.as_deref(), Some(both.token()), "{s}: {key}");
        assert!(
            b.lock(key).acquire().await.unwrap_err().is_busy(),
            "{s}: {key}"
        );
    }
    both.release().await.expect("release");
    for key in [first, second] {
        let info = b.inspect(key).await.expect("inspect");
        assert_eq!(info.owner, None, "{s}: {key} released");
    }
}

/// `inspect` shows nothing for a free key, then the holder's token, its remaining lease, its
/// fencing token and the callers queued for it.
pub async fn inspect_shows_owner_lease_fence_and_queue(s: &Store) {
    let (a, b) = s.pair();
    assert_eq!(a.inspect("job").await.unwrap(), LockInfo::default(), "{s}");
    let fencing = s.lacks(Lack::Fencing).is_none();
    let held = a.lock("job").ttl(LONG).fencing(fencing).acquire().await;
    let held = held.expect("a free lock");
    let info = b.inspect("job").await.expect("inspect");
    assert_eq!(info.owner.as_deref(), Some(held.token()), "{s}");
    assert!(
        info.remaining
            .is_some_and(|left| left <= LONG && left > LONG - LIMIT / 2),
        "{s}: {info:?}"
    );
    assert_eq!(info.fence, held.fence(), "{s}");
    assert_eq!(info.waiters, 0, "{s}");
    let waiter = tokio::spawn(b.lock("job").fencing(fencing).wait(LIMIT).acquire());
    // Counted by `inspect` where the store queues (checked there).
    s.until_queued(&a, "job", 1).await;
    held.release().await.expect("release");
    let next = waiter.await.expect("task").expect("handed over");
    let fence = next.fence();
    next.release().await.expect("release");
    let info = a.inspect("job").await.expect("inspect");
    let mut expected = LockInfo::default();
    expected.fence = fence;
    assert_eq!(info, expected, "{s}: free again, with the last token");
}

/// `inspect` shows how long the owner has held the lock (on Redis from the owner's first
/// renewal on, which notes it beside the lock), counting on while it holds it; the next holder's
/// count starts when the lock comes to it.
pub async fn inspect_shows_how_long_the_owner_has_held_the_lock(s: &Store) {
    // The stores count in whole milliseconds, twice (when it was taken, and now).
    const ROUNDING: Duration = Duration::from_millis(3);
    let (a, b) = s.pair();
    let asked = Instant::now();
    let held = a
        .lock("shift")
        .ttl(RENEWED_TTL)
        .acquire()
        .await
        .expect("free");
    let first = held_for(s, &b, "shift", held.token()).await;
    assert!(
        first.value <= first.after - asked + ROUNDING,
        "{s}: held {:?}, taken at most {:?} ago",
        first.value,
        first.after - asked
    );
    // Time passes between the two looks, and the count goes on with it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = held_for(s, &b, "shift", held.token()).await;
    assert!(
        second.value + ROUNDING >= first.value + (second.before - first.after),
        "{s}: {first:?}, then {second:?}"
    );
    let waiter = tokio::spawn(b.lock("shift").ttl(RENEWED_TTL).wait(LIMIT).acquire());
    s.until_waiting(&a, "shift", 1).await;
    let released = Instant::now();
    held.release().await.expect("release");
    let next = waiter.await.expect("task").expect("the next holder");
    // Not the first holder's count, which is longer than anything since the release.
    let then = held_for(s, &a, "shift", next.token()).await;
    assert!(
        then.value <= then.after - released + ROUNDING,
        "{s}: the next holder held it {:?}, released {:?} ago (the first held it {:?})",
        then.value,
        then.after - released,
        released - asked
    );
    next.release().await.expect("release");
    assert_eq!(
        a.inspect("shift").await.unwrap().held_for,
        None,
        "{s}: free"
    );
}

/// What one look at how long a lock has been held saw, and when the look began and ended.
#[derive(Debug)]
struct HeldFor {
    value: Duration,
    before: Instant,
    after: Instant,
}

/// The first look at `key` that shows how long `token` has held it (on Redis, once a renewal
/// noted it).
async fn held_for(s: &Store, registry: &lock_runtime::Registry, key: &str, token: &str) -> HeldFor {
    let start = Instant::now();
    loop {
        let before = Instant::now();
        let info = registry.inspect(key).await.expect("inspect");
        let after = Instant::now();
        assert_eq!(info.owner.as_deref(), Some(token), "{s}: {info:?}");
        if let Some(value) = info.held_for {
            return HeldFor {
                value,
                before,
                after,
            };
        }
        assert!(
            start.elapsed() < LIMIT,
            "{s}: no time held shown for {key} within {LIMIT:?}: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An operator's force-unlock frees any holder's lock (a semaphore's too) and says whether
/// there was one; the owner-checked one frees it only from the owner it names.
pub async fn force_unlock_frees_any_holders_lock(s: &Store) {
    let (a, b) = s.pair();
    assert!(!b.force_unlock("job").await.unwrap(), "{s}: nothing there");
    let held = a
        .lock("job")
        .ttl(LONG)
        .acquire()
        .await
        .expect("a free lock");
    let unlocked = b.force_unlock_owned_by("job", "someone-else").await;
    assert!(!unlocked.expect("force-unlock"), "{s}: not that owner's");
    let info = b.inspect("job").await.expect("inspect");
    assert_eq!(info.owner.as_deref(), Some(held.token()), "{s}: still held");
    let unlocked = b.force_unlock_owned_by("job", held.token()).await;
    assert!(unlocked.expect("force-unlock"), "{s}: the owner it names");
    let next = b.lock("job").acquire().await.expect("free at once");
    assert!(b.force_unlock("job").await.unwrap(), "{s}: any holder's");
    assert_eq!(b.inspect("job").await.unwrap().owner, None, "{s}");
    let permit = a.lock("pool").permits(2).ttl(LONG).acquire().await.unwrap();
    assert!(b.force_unlock("pool").await.unwrap(), "{s}: a semaphore");
    assert_eq!(b.inspect("pool").await.unwrap().permits, None, "{s}");
    for lost in [held, next, permit] {
        let err = lost.release().await.unwrap_err();
        assert!(matches!(err, LockError::NotOwner { .. }), "{s}: {err:?}");
    }
}

/// An election: one leader at a time, each term numbered above the last (where the store
/// fences), the next candidate leading as soon as the leader resigns, and an observer on
/// another registry told of each change by the store's notifications, long before any lease
/// would end. Its key is the election's alone: a lock request there is refused, as is a
/// campaign on a lock's key.
pub async fn an_election_has_one_leader_at_a_time(s: &Store) {
    let (a, b) = s.pair();
    let watcher = s.registry();
    let mut observer = watcher.election("leader").observe();
    assert_eq!(
        next_seen(s, &mut observer).await,
        None,
        "{s}: nobody leads yet"
    );
    let first = a.election("leader").identity("a:1").ttl(LONG);
    let first = first.campaign().await.expect("elected alone");
    assert_eq!(first.identity(), "a:1");
    let seen = next_seen(s, &mut observer).await.expect("a leader");
    assert_eq!(
        (seen.identity.as_str(), seen.term),
        ("a:1", first.term()),
        "{s}"
    );
    let second = tokio::spawn(b.election("leader").identity("b:2").ttl(LONG).campaign());
    s.until_queued(&a, "leader", 1).await;
    let refused = b.lock("leader").wait(LIMIT).acquire().await.unwrap_err();
    assert!(
        matches!(&refused, LockError::InvalidOptions { reason, .. } if reason.contains("a:1")),
        "{s}: a lock request on an election's key: {refused:?}"
    );
    let first_term = first.term();
    first.resign().await.expect("resign");
    let second = second.await.expect("task").expect("handed over");
    match (first_term, second.term()) {
        (Some(old), Some(new)) => assert!(new > old, "{s}: term {new} after {old}"),
        _ => assert!(s.lacks(Lack::Fencing).is_some(), "{s}: terms are numbered"),
    }
    let seen = next_seen(s, &mut observer).await.expect("the next leader");
    assert_eq!(
        (seen.identity.as_str(), seen.term),
        ("b:2", second.term()),
        "{s}"
    );
    // A parked observer (it looked, and waits) hears of the resign: a leader's release is
    // always published, even the bare delete that wakes nobody for a lock.
    let before = s.commands_for(&watcher, "leader");
    let parked = tokio::spawn(async move {
        let seen = tokio::time::timeout(LIMIT, observer.next()).await;
        seen.map(|seen| seen.expect("observe"))
    });
    match before {
        Some(before) => {
            eventually(LIMIT, "the observer looked at the key", || async {
                s.commands_for(&watcher, "leader") > Some(before)
            })
            .await;
        }
        None => s.until_waiting(&watcher, "leader", 1).await,
    }
    second.resign().await.expect("resign");
    let seen = parked.await.expect("task");
    assert!(
        matches!(seen, Ok(None)),
        "{s}: nobody leads once the last resigned, heard within {LIMIT:?}: {seen:?}"
    );

    let held = a
        .lock("job")
        .ttl(LONG)
        .acquire()
        .await
        .expect("a free lock");
    let campaign = b.election("job").campaign().await.unwrap_err();
    assert!(
        matches!(&campaign, LockError::InvalidOptions { reason, .. } if reason.contains("held as a lock")),
        "{s}: a campaign on a lock's key: {campaign:?}"
    );
    let look = watcher.election("job").leader().await.unwrap_err();
    assert!(
        matches!(look, LockError::InvalidOptions { .. }),
        "{s}: {look:?}"
    );
    held.release().await.expect("release");
}

/// What the observer sees next, which must come within `LIMIT`: woken by a notification, not
/// by the end of a `LONG` lease.
async fn next_seen(s: &Store, observer: &mut Observer) -> Option<Leader> {
    tokio::time::timeout(LIMIT, observer.next())
        .await
        .unwrap_or_else(|_| panic!("{s}: the observer heard nothing within {LIMIT:?}"))
        .expect("observe")
}

/// A leader steps down on purpose. Handing over by name: a name not in line is refused with
/// nothing changed; the leader's work is told, finishes within its grace, and the named
/// candidate leads next, ahead of one that queued before it. Stepping down with work that does
/// not finish: the work is dropped when the grace runs out, and the next in line leads at once,
/// long before any lease would end. Where candidates do not queue (Redlock, a replica-confirmed
/// store), a hand-over is refused and a step-down lets the candidates race for the term.
pub async fn a_leader_steps_down_and_hands_over_to_a_named_candidate(s: &Store) {
    let (a, b) = s.pair();
    let c = s.registry();
    let leader = a.election("rota").identity("a").ttl(LONG);
    let work = tokio::spawn(leader.campaign().await.expect("elected alone").run(async {
        let term = lock_runtime::current().expect("leading");
        term.stepping_down().await;
        Ok::<_, LockError>("finished")
    }));
    let first = leader.term().expect("a leads").number();
    let second = tokio::spawn(b.election("rota").identity("b").ttl(LONG).campaign());
    s.until_queued(&a, "rota", 1).await;
    let third = tokio::spawn(c.election("rota").identity("c").ttl(LONG).campaign());
    s.until_queued(&a, "rota", 2).await;

    if s.lacks(Lack::Queue).is_some() {
        let refused = leader.hand_over("c", LIMIT).await.unwrap_err();
        assert!(
            matches!(&refused, LockError::InvalidOptions { reason, .. } if reason.contains("step down")),
            "{s}: {refused:?}"
        );
        assert!(
            leader.is_leader(),
            "{s}: the refused hand-over changed nothing"
        );
        let ended = leader.step_down(LIMIT).await.expect("step down");
        assert_eq!(ended.map(|e| e.finished), Some(true), "{s}");
        assert_eq!(work.await.expect("task").expect("work"), "finished");
        // One of the two wins the race, within the limit; the other follows its resignation.
        let (mut second, mut third) = (second, third);
        let (won, other) = tokio::select! {
            won = &mut second => (won, third),
            won = &mut third => (won, second),
        };
        let won = won.expect("task").expect("elected");
        won.resign().await.expect("resign");
        let next = tokio::time::timeout(LIMIT, other)
            .await
            .expect("elected in time");
        next.expect("task")
            .expect("elected")
            .resign()
            .await
            .expect("resign");
        return;
    }

    assert_eq!(leader.in_line().await.expect("the line"), ["b", "c"], "{s}");
    let refused = leader.hand_over("d", LONG).await.unwrap_err();
    assert!(
        matches!(&refused, LockError::NotInLine { candidate, .. } if candidate == "d"),
        "{s}: {refused:?}"
    );
    let term = leader.term().expect("still leading");
    assert!(
        !term.is_stepping_down(),
        "{s}: a refused hand-over asks nothing"
    );

    let ended = leader
        .hand_over("c", LIMIT)
        .await
        .expect("hand over")
        .expect("a led");
    assert!(ended.finished && ended.to_successor, "{s}: {ended:?}");
    assert_eq!(ended.term, first);
    assert_eq!(work.await.expect("task").expect("work"), "finished");
    let third = tokio::time::timeout(LIMIT, third)
        .await
        .unwrap_or_else(|_| panic!("{s}: the named candidate leads within {LIMIT:?}"))
        .expect("task")
        .expect("elected");
    let seen = leader.leader().await.expect("look").expect("a leader");
    assert_eq!(
        (seen.identity.as_str(), seen.term),
        ("c", third.term()),
        "{s}"
    );
    match (first, third.term()) {
        (Some(old), Some(new)) => assert!(new > old, "{s}: term {new} after {old}"),
        _ => assert!(s.lacks(Lack::Fencing).is_some(), "{s}: terms are numbered"),
    }
    assert!(!second.is_finished(), "{s}: b waits on, passed over");
    assert_eq!(leader.in_line().await.expect("the line"), ["b"], "{s}");

    // Work that ignores the request is dropped when the grace runs out; b leads next.
    let stuck = tokio::spawn(third.run(std::future::pending::<Result<(), LockError>>()));
    let ended = c
        .election("rota")
        .identity("c")
        .step_down(Duration::from_millis(300))
        .await
        .expect("step down")
        .expect("c led");
    assert!(!ended.finished && !ended.to_successor, "{s}: {ended:?}");
    let dropped = stuck.await.expect("task").unwrap_err();
    assert!(
        matches!(
            dropped,
            LockError::Lost {
                reason: LostReason::Released,
                ..
            }
        ),
        "{s}: {dropped:?}"
    );
    let second = tokio::time::timeout(LIMIT, second)
        .await
        .unwrap_or_else(|_| panic!("{s}: the next in line leads within {LIMIT:?}"))
        .expect("task")
        .expect("elected");
    assert_eq!(
        leader.leader().await.expect("look").map(|l| l.identity),
        Some("b".to_owned()),
        "{s}"
    );
    assert_eq!(
        leader.step_down(LIMIT).await.expect("step down"),
        None,
        "{s}: a no longer leads"
    );
    second.resign().await.expect("resign");
}

/// A candidate standing aside is not elected until it rejoins. Where candidates queue it keeps
/// its place, shown standing aside, every handoff passes it over, and a term left free stays
/// free; elsewhere it stops campaigning meanwhile. Once it rejoins, it is elected.
pub async fn a_candidate_standing_aside_is_passed_over_until_it_rejoins(s: &Store) {
    let (a, b) = s.pair();
    let c = s.registry();
    let first = a.election("shift").identity("a").ttl(LONG);
    let leader = first.campaign().await.expect("elected alone");
    // Its place is kept by an attempt every second.
    let draining = b
        .election("shift")
        .identity("b")
        .ttl(Duration::from_secs(3));
    let second = tokio::spawn(draining.campaign());
    s.until_queued(&a, "shift", 1).await;
    let third = tokio::spawn(c.election("shift").identity("c").ttl(LONG).campaign());
    s.until_queued(&a, "shift", 2).await;

    draining.stand_aside();
    assert!(draining.is_standing_aside(), "{s}");
    let queues = s.lacks(Lack::Queue).is_none();
    if queues {
        eventually(LIMIT, "b stands aside in its place", || async {
            draining.standing_aside().await.expect("the line") == ["b"]
        })
        .await;
        assert_eq!(draining.in_line().await.expect("the line"), ["c"], "{s}");
        let queue = a.inspect("shift").await.expect("inspect").queue;
        let places: Vec<_> = queue.iter().map(|p| p.aside).collect();
        assert_eq!(places, [true, false], "{s}: b keeps its place ahead of c");
    }
    leader.resign().await.expect("resign");
    let third = tokio::time::timeout(LIMIT, third)
        .await
        .unwrap_or_else(|_| panic!("{s}: c is elected within {LIMIT:?}, b passed over"))
        .expect("task")
        .expect("elected");
    assert!(
        !second.is_finished(),
        "{s}: b is not elected standing aside"
    );

    // A term left free while b stands aside stays free: b's attempts after it leave it. One
    // that renews b's place (3 s, renewed every second) is seen after the release: the place
    // first seen past a renewal's due time, then renewed.
    third.resign().await.expect("resign");
    if queues {
        let kept = || async {
            let info = a.inspect("shift").await.expect("inspect");
            info.queue.first().map(|p| p.remaining)
        };
        let due = Duration::from_millis(2500);
        eventually(LIMIT, "b's place ages", || async {
            kept().await.is_some_and(|left| left <= due)
        })
        .await;
        eventually(LIMIT, "b keeps its place after the release", || async {
            kept().await.is_some_and(|left| left > due)
        })
        .await;
    }
    assert_eq!(
        first.leader().await.expect("look"),
        None,
        "{s}: nobody leads"
    );
    assert!(
        !second.is_finished(),
        "{s}: b is not elected standing aside"
    );

    draining.rejoin();
    assert!(!draining.is_standing_aside(), "{s}");
    let second = tokio::time::timeout(LIMIT, second)
        .await
        .unwrap_or_else(|_| panic!("{s}: b is elected within {LIMIT:?} once it rejoins"))
        .expect("task")
        .expect("elected");
    assert_eq!(second.identity(), "b", "{s}");
    second.resign().await.expect("resign");
}
