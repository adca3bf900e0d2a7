//! Leader election against a real Redis (and memory): `lead`'s terms end and begin again,
//! shutdown hands over, an observer sees a leader cut off from Redis gone once its lease ended,
//! and bad identities are refused.

use std::time::Duration;

use lock_runtime::{LockError, Registry};
use lock_tests::proxy::Proxy;
use lock_tests::{RedisServer, RENEWED_TTL};

use super::support::{on_redis_and_memory, patient_registry, registry};

/// Bounds every wait for an event.
const LIMIT: Duration = Duration::from_secs(20);
/// A lease no test waits out.
const LONG: Duration = Duration::from_secs(60);

/// What a leader's work reports.
#[derive(Debug, PartialEq, Eq)]
enum Work {
    Began(u64),
    /// Dropped mid-term: the term ended under it.
    Stopped(u64),
}

/// Sends `Stopped` when dropped with its term's work.
struct OnDrop(u64, tokio::sync::mpsc::UnboundedSender<Work>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        let _ = self.1.send(Work::Stopped(self.0));
    }
}

async fn next(events: &mut tokio::sync::mpsc::UnboundedReceiver<Work>) -> Work {
    tokio::time::timeout(LIMIT, events.recv())
        .await
        .expect("the leader's work reports within the limit")
        .expect("the leader runs")
}

/// A term whose lease is taken away (an operator's force-unlock) ends: its work is dropped,
/// and after the pause the candidate campaigns again and leads a new term, numbered higher.
/// Shutting the registry down ends the last term and `lead` with `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_term_stops_the_work_and_a_new_term_follows() {
    on_redis_and_memory(|a, b| async move {
        let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let election = a
            .election("scheduler")
            .identity("a")
            .ttl(RENEWED_TTL)
            .pause(Duration::from_millis(10));
        let leading = tokio::spawn(async move {
            election
                .lead(|term| {
                    let events = events_tx.clone();
                    async move {
                        let number = term.number().expect("fenced");
                        let _stopped = OnDrop(number, events.clone());
                        events.send(Work::Began(number)).expect("the test listens");
                        std::future::pending::<Result<(), LockError>>().await
                    }
                })
                .await
        });
        let Work::Began(first) = next(&mut events).await else {
            panic!("the first term begins");
        };
        assert!(b.force_unlock("scheduler").await.expect("force-unlock"));
        assert_eq!(next(&mut events).await, Work::Stopped(first));
        let Work::Began(second) = next(&mut events).await else {
            panic!("a new term begins");
        };
        assert!(second > first, "term {second} after {first}");
        a.shutdown().await;
        assert_eq!(next(&mut events).await, Work::Stopped(second));
        let ended = tokio::time::timeout(LIMIT, leading)
            .await
            .expect("lead ends");
        ended.expect("task").expect("lead ends with Ok at shutdown");
    })
    .await;
}

/// A leader that shuts down hands over at once: the next candidate in line leads long before
/// the lease would have run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hands_the_leadership_to_the_next_candidate_at_once() {
    on_redis_and_memory(|a, b| async move {
        let leader = a.election("cron").identity("a").ttl(LONG);
        let held = leader.campaign().await.expect("elected alone");
        let next = tokio::spawn({
            let candidate = b.election("cron").identity("b").ttl(LONG);
            async move { candidate.campaign().await }
        });
        let observer = b.election("cron");
        super::support::eventually(LIMIT, "b queued", || async {
            b.inspect("cron").await.unwrap().waiters == 1
        })
        .await;
        a.shutdown().await;
        assert!(held.is_lost(), "shutdown ended the term");
        let next = tokio::time::timeout(LIMIT, next)
            .await
            .expect("handed over long before the 60 s lease ends")
            .expect("task")
            .expect("elected");
        assert!(next.term() > held.term());
        let seen = observer.leader().await.unwrap().expect("a leader");
        assert_eq!((seen.identity.as_str(), seen.term), ("b", next.term()));
        next.resign().await.expect("resign");
    })
    .await;
}

/// A leader cut off from Redis (as good as crashed, for the others) is followed by no one
/// until its lease ends on the server; an observer, which no notification tells of that, sees
/// "no leader" once it has, and the cut-off leader knows it lost the term before then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_a_leader_cut_off_from_redis_gone_once_its_lease_ended() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let cut_off = patient_registry(&proxy.url());
    let watcher = registry(&server);
    let leadership = cut_off
        .election("scheduler")
        .identity("cut-off")
        .ttl(Duration::from_secs(2))
        .campaign()
        .await
        .expect("elected");
    let mut observer = watcher.election("scheduler").observe();
    let seen = observer.next().await.expect("observe").expect("a leader");
    assert_eq!(seen.identity, "cut-off");
    proxy.blackhole();
    let gone = tokio::time::timeout(LIMIT, observer.next())
        .await
        .expect("the lease ends within the limit")
        .expect("observe");
    assert_eq!(gone, None, "no leader once the lease ended");
    assert!(leadership.is_lost(), "the leader gave the term up before");
    proxy.heal();
}

#[tokio::test]
async fn an_identity_that_observers_could_not_read_is_refused() {
    let registry = Registry::in_memory();
    for (identity, says) in [
        (String::new(), "empty"),
        ("a\nb".to_owned(), "control characters"),
        ("x".repeat(257), "beyond 256"),
    ] {
        let err = registry
            .election("scheduler")
            .identity(identity.clone())
            .campaign()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, LockError::InvalidOptions { key, reason } if key == "scheduler" && reason.contains(says)),
            "{identity:?}: {err}"
        );
    }
    assert_eq!(registry.election("scheduler").leader().await.unwrap(), None);
}

/// One term run by hand: the work is dropped when the term is lost (its key taken away), and
/// the run returns `Lost`; a term whose work returns resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_run_by_hand_is_stopped_when_lost_and_resigns_when_done() {
    on_redis_and_memory(|a, b| async move {
        let election = a.election("compactor").ttl(RENEWED_TTL);
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let term = election.campaign().await.expect("elected");
        let running = tokio::spawn(term.run(async move {
            started_tx.send(()).expect("the test listens");
            std::future::pending::<Result<(), LockError>>().await
        }));
        started.await.expect("the work runs");
        assert!(b.force_unlock("compactor").await.expect("force-unlock"));
        let ended = tokio::time::timeout(LIMIT, running).await.expect("stopped");
        let err = ended.expect("task").unwrap_err();
        assert!(err.is_lost(), "{err:?}");

        let term = election.campaign().await.expect("elected again");
        let number = term.term();
        let seen = term
            .run(async { Ok::<_, LockError>(lock_runtime::current().expect("a term").fence()) })
            .await
            .expect("the work returned");
        assert_eq!(seen, number, "current() is the term");
        assert_eq!(
            b.election("compactor").leader().await.unwrap(),
            None,
            "resigned"
        );
    })
    .await;
}

/// A process that stalls (a GC pause, a stopped VM) between its election and its work past the
/// term's lease must not start the work: the term is over. In memory the leases are kept on the
/// caller's runtime, so blocking its one thread stalls them as a process pause would (a fault
/// run caught it on Redlock: a candidate elected while its process was stopped began its term's
/// work 1.5 s after its key expired). Also true of `LockRequest::run`, which shares the guard.
#[tokio::test]
async fn work_is_not_started_on_a_term_whose_lease_ran_out_before_it() {
    let registry = Registry::in_memory();
    let leadership = registry
        .election("scheduler")
        .ttl(Duration::from_millis(100))
        .campaign()
        .await
        .unwrap();
    // The stall: nothing runs on this runtime, its timers included.
    std::thread::sleep(Duration::from_millis(300));
    let started = std::sync::atomic::AtomicBool::new(false);
    let outcome = leadership
        .run(async {
            started.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok::<(), LockError>(())
        })
        .await;
    assert!(
        !started.load(std::sync::atomic::Ordering::SeqCst),
        "the work began on a term whose lease had run out"
    );
    let err = outcome.unwrap_err();
    assert!(err.is_lost(), "{err}");
}

/// An observer that last saw no leader looks again within the election's ttl even when no
/// notification comes: a leader whose announcement was lost (here: a candidate's token written
/// straight into the key, announced by no one) is seen, not hidden for its whole term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_that_saw_no_leader_finds_one_whose_announcement_was_lost() {
    let server = RedisServer::start();
    let watcher = registry(&server);
    let mut observer = watcher
        .election("announce")
        .ttl(Duration::from_millis(500))
        .observe();
    assert_eq!(observer.next().await.unwrap(), None, "nobody leads yet");
    let next = tokio::spawn(async move { observer.next().await });
    // Time for the observer to look and find nobody again; had it not yet looked, it would
    // find the leader below at once, and the test would prove nothing rather than fail.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut con = lock_tests::raw(&server.url()).await;
    let token = format!("silent@elsewhere:4242:{}", "ab".repeat(16));
    let _: () = redis::cmd("SET")
        .arg(watcher.redis_key("announce"))
        .arg(&token)
        .arg("PX")
        .arg(LONG.as_millis().to_string())
        .query_async(&mut con)
        .await
        .unwrap();
    let seen = tokio::time::timeout(LIMIT, next)
        .await
        .expect("seen within the election's ttl of its arrival, not after its whole term")
        .unwrap()
        .unwrap()
        .expect("a leader");
    assert_eq!(seen.identity, "silent");
}

/// `Leader::term` is the term the leader was elected with, also in a term longer than its
/// counter's own expiry (a day after the last fenced acquisition, once): the counter is kept
/// while the term is renewed. Here it is expired by hand, as a day would; once the term's next
/// renewal has run, an observer sees the leader's own term, and the counter is kept for a day
/// more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_term_is_reported_after_its_counter_would_have_expired() {
    let server = RedisServer::start();
    let (a, b) = (registry(&server), registry(&server));
    let leadership = a
        .election("scheduler")
        .identity("a")
        .ttl(RENEWED_TTL)
        .campaign()
        .await
        .expect("elected");
    let counter = "fence:{lock:scheduler}";
    let mut con = super::support::raw(&server.url()).await;
    let expiring: bool = redis::AsyncCommands::pexpire(&mut con, counter, 1)
        .await
        .unwrap();
    assert!(expiring, "the counter was where it is documented");
    super::support::eventually(LIMIT, "the counter expired", || {
        let mut con = con.clone();
        async move {
            !redis::AsyncCommands::exists::<_, bool>(&mut con, counter)
                .await
                .unwrap()
        }
    })
    .await;
    lock_tests::renewed_on(&server, "lock:scheduler", LIMIT, "the term is renewed").await;
    let seen = b
        .election("scheduler")
        .leader()
        .await
        .unwrap()
        .expect("a leads");
    assert_eq!(
        (seen.identity.as_str(), seen.term),
        ("a", leadership.term()),
        "the leader's own term"
    );
    let kept = server.pttl(counter);
    assert!(
        kept > 24 * 3600 * 1000,
        "kept a day beyond the lease: {kept}"
    );
    leadership.resign().await.unwrap();
}

/// The same in memory, on Tokio's paused clock: a leader in one term for more than a day is
/// reported with its own term all along.
#[tokio::test(start_paused = true)]
async fn in_memory_a_leader_in_one_term_for_more_than_a_day_is_reported_with_its_own_term() {
    let store = lock_runtime::MemoryStore::new();
    let memory = || Registry::builder().memory(store.clone()).build().unwrap();
    let (a, b) = (memory(), memory());
    let leadership = a
        .election("scheduler")
        .identity("a")
        .ttl(Duration::from_secs(600))
        .campaign()
        .await
        .expect("elected");
    let observer = b.election("scheduler");
    for hours in [1, 23, 2, 24] {
        tokio::time::sleep(Duration::from_secs(hours * 3600)).await;
        assert!(!leadership.is_lost(), "renewed all along");
        let seen = observer.leader().await.unwrap().expect("a leads");
        assert_eq!(seen.term, leadership.term(), "after {hours} more hours");
    }
    leadership.resign().await.unwrap();
}

/// Readiness follows the role: a standby is live and not ready, the leader is both, and only
/// the candidate that holds the term (by its identity) leads, on every handle of the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_leader_follows_the_term_held_here_and_a_standby_is_live() {
    on_redis_and_memory(|a, _| async move {
        let (one, two) = (
            a.election("scheduler").identity("one").ttl(LONG),
            a.election("scheduler").identity("two").ttl(LONG),
        );
        assert!(!one.is_leader() && one.is_live() && one.term().is_none());
        let leadership = one.campaign().await.expect("elected");
        let queued = tokio::spawn(two.campaign());
        assert!(one.is_leader() && one.is_live());
        assert_eq!(
            one.term().and_then(|t| t.number()),
            leadership.term(),
            "the term held here"
        );
        assert!(
            a.election("scheduler").identity("one").is_leader(),
            "another handle of the same election and identity sees it too"
        );
        assert!(
            !two.is_leader() && two.is_live(),
            "a candidate in line is a standby"
        );
        leadership.resign().await.expect("resign");
        assert!(
            !one.is_leader(),
            "resigned: at once, not once the next is elected"
        );
        let second = tokio::time::timeout(LIMIT, queued)
            .await
            .expect("handed over")
            .expect("task")
            .expect("elected");
        assert!(two.is_leader() && !one.is_leader());
        second.resign().await.expect("resign");
        assert!(!two.is_leader() && two.is_live());
    })
    .await;
}

/// A leader whose store stops answering is at risk, and not live, until the term is decided;
/// then (lost, here) it is a live standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_is_not_live_while_its_term_is_at_risk() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let reg = patient_registry(&proxy.url());
    let election = reg
        .election("scheduler")
        .identity("a")
        .ttl(Duration::from_secs(3));
    let leadership = election.campaign().await.expect("elected");
    let term = leadership.of_term();
    proxy.blackhole();
    tokio::time::timeout(LIMIT, term.at_risk())
        .await
        .expect("at risk within the limit");
    if !term.is_lost() {
        assert!(!election.is_live(), "at risk: not live");
    }
    tokio::time::timeout(LIMIT, term.lost())
        .await
        .expect("lost within the limit");
    assert!(
        election.is_live() && !election.is_leader(),
        "a standby again"
    );
    proxy.heal();
    drop(leadership);
}

/// Work that blocks its thread cannot be dropped when its term is lost: the process is not
/// live until it returns, and live again after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_whose_work_outlives_it_is_not_live_until_the_work_ends() {
    let server = RedisServer::start();
    let (a, b) = (registry(&server), registry(&server));
    let election = a.election("scheduler").identity("a").ttl(RENEWED_TTL);
    let leadership = election.campaign().await.expect("elected");
    let term = leadership.of_term();
    let (began_tx, began) = tokio::sync::oneshot::channel();
    let unblock = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let blocked = unblock.clone();
    let work = tokio::spawn(leadership.run(async move {
        let _ = began_tx.send(());
        // Blocks its thread (a synchronous call that hangs): no await where it could be dropped.
        while !blocked.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok::<_, LockError>(())
    }));
    began.await.expect("the work began");
    assert!(b.force_unlock("scheduler").await.expect("force-unlock"));
    tokio::time::timeout(LIMIT, term.lost())
        .await
        .expect("lost within the limit");
    assert!(!election.is_leader());
    assert!(
        !election.is_live(),
        "the term is over and its work still runs"
    );
    unblock.store(true, std::sync::atomic::Ordering::SeqCst);
    let outcome = tokio::time::timeout(LIMIT, work)
        .await
        .expect("the work ends")
        .expect("task");
    assert!(outcome.is_err(), "the term was lost under it: {outcome:?}");
    assert!(election.is_live(), "its work is gone");
}

/// In memory, on Tokio's paused clock, a term lasts as long as the paused clock says (leases
/// there expire when the test advances time, and only then), also while the runtime is blocked
/// for longer than the ttl in real time.
#[tokio::test(start_paused = true)]
async fn in_memory_a_term_on_the_paused_clock_is_not_ended_by_the_real_one() {
    let registry = Registry::in_memory();
    let election = registry
        .election("scheduler")
        .identity("a")
        .ttl(Duration::from_millis(200));
    let leadership = election.campaign().await.expect("elected");
    // A synchronous call blocks the runtime for five ttls of real time; not a moment passes
    // on its paused clock.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !leadership.is_lost(),
        "no time passed on the paused clock, yet the term ended"
    );
    assert!(election.is_leader());
    leadership.resign().await.expect("still ours");
}
