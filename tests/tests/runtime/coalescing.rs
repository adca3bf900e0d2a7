//! Group commit: a process's concurrent acquisitions and releases to one server go out together,
//! one write per round trip.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::LockError;
use lock_tests::RedisServer;

use super::support::{raw, registry};

const TASKS: usize = 64;
const CYCLES: usize = 10;

/// A number `INFO <section>` reports, e.g. `total_reads_processed` (one per batch of commands
/// the server read from a connection at once) or `blocked_clients` (connections `CLIENT PAUSE`
/// holds back).
fn info(con: &mut redis::Connection, section: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query(con)
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"));
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in INFO {section}"))
}

/// Bytes the server has read from its other clients and not yet run: commands that reached it
/// while `CLIENT PAUSE` holds their connection back.
fn unrun_bytes(con: &mut redis::Connection) -> u64 {
    let me: u64 = redis::cmd("CLIENT").arg("ID").query(con).unwrap();
    let clients: String = redis::cmd("CLIENT").arg("LIST").query(con).unwrap();
    clients
        .lines()
        .filter(|client| !client.starts_with(&format!("id={me} ")))
        .filter_map(|client| {
            let field = client.split(' ').find_map(|f| f.strip_prefix("qbuf="))?;
            field.parse::<u64>().ok()
        })
        .sum()
}

/// How many scripts the server ran by their digest.
fn script_calls(con: &mut redis::Connection) -> u64 {
    lock_tests::command_calls(con)
        .get("evalsha")
        .copied()
        .unwrap_or(0)
}

fn client(con: &mut redis::Connection, args: &[&str]) {
    let () = redis::cmd("CLIENT").arg(args).query(con).unwrap();
}

/// Starts `TASKS` operations with `start` while the server holds writes back, in three steps
/// that the group commit tells apart: the first goes out alone, the second in a batch of its
/// own beside it, and the rest, arriving while those two are out, wait in the process. Checks
/// that they do wait (nothing more reaches the server), and, unless other clients are at work
/// (`alone` false), that they go out in one write once the server answers. Returns the
/// operations' outputs.
async fn pile_up<T, F>(
    con: &mut redis::Connection,
    alone: bool,
    mut start: impl FnMut(usize) -> F,
) -> Vec<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let wait = Duration::from_secs(10);
    client(con, &["PAUSE", "30000", "WRITE"]);
    let mut tasks = vec![tokio::spawn(start(0))];
    super::support::eventually(wait, "the first operation held by the pause", || {
        let held = info(con, "clients", "blocked_clients") == 1;
        async move { held }
    })
    .await;
    tasks.push(tokio::spawn(start(1)));
    let mut sent = 0;
    super::support::eventually(wait, "the second operation on the server", || {
        sent = unrun_bytes(con);
        async move { sent > 0 }
    })
    .await;
    // On this single-threaded runtime a spawned task runs, when the test yields, until its
    // operation waits for a reply: queued in the process, or sent.
    let started = Arc::new(AtomicU64::new(2));
    for i in 2..TASKS {
        let (operation, started) = (start(i), started.clone());
        tasks.push(tokio::spawn(async move {
            started.fetch_add(1, Ordering::SeqCst);
            operation.await
        }));
    }
    let all = u64::try_from(TASKS).unwrap();
    super::support::eventually(wait, "every operation started", || {
        let n = started.load(Ordering::SeqCst);
        async move { n == all }
    })
    .await;
    assert_eq!(
        unrun_bytes(con),
        sent,
        "operations that arrived while two writes were out went to the server"
    );
    let before = info(con, "stats", "total_reads_processed");
    client(con, &["UNPAUSE"]);
    let mut outputs = Vec::new();
    for task in tasks {
        outputs.push(task.await.unwrap());
    }
    // Less this connection's `UNPAUSE` and `INFO`.
    let reads = info(con, "stats", "total_reads_processed") - before - 2;
    if !alone {
        return outputs;
    }
    assert_eq!(
        reads,
        1,
        "{} operations queued behind two writes went out in {reads} writes",
        TASKS - 2
    );
    outputs
}

/// The group commit, step by step: concurrent acquisitions, then concurrent releases, go out
/// one write per round trip. Under load, that is what cuts the server's reads (and the client's
/// writes) to a fraction of the operations; the benchmark measures it.
#[tokio::test]
async fn operations_that_arrive_while_two_writes_are_out_go_in_one_write() {
    let server = RedisServer::start();
    let registry = super::support::patient_registry(&server.url());
    lock_tests::warm_up(&registry).await;
    let mut con = server.connection();
    let guards = pile_up(&mut con, true, |i| {
        registry.lock(format!("piled:{i}")).acquire()
    })
    .await;
    let mut guards: Vec<_> = guards
        .into_iter()
        .map(|guard| Some(guard.expect("a free lock is taken")))
        .collect();
    let scripts = script_calls(&mut con);
    let released = pile_up(&mut con, true, |i| guards[i].take().unwrap().release()).await;
    for outcome in released {
        outcome.expect("a held lock is released");
    }
    // Nobody waited for these locks: on a server without `DELIFEQ`, the releases queued up
    // together are one script call (the one sent alone and the one batched beside it, one
    // each).
    if !lock_tests::has_command(&mut con, "delifeq") {
        assert_eq!(
            script_calls(&mut con) - scripts,
            3,
            "script calls for {TASKS} releases"
        );
    }
}

/// Releases in one batch, half of them of locks another process waits for: those are handed
/// over (their waiters' `wait` is shorter than the holders' ttl), the others deleted.
#[tokio::test]
async fn a_batch_of_releases_hands_over_the_locks_that_were_waited_for() {
    let server = RedisServer::start();
    let (holder, other) = (
        super::support::patient_registry(&server.url()),
        super::support::patient_registry(&server.url()),
    );
    lock_tests::warm_up(&holder).await;
    let mut con = server.connection();
    let key = |i: usize| format!("mixed:{i}");
    let mut guards = Vec::new();
    for i in 0..TASKS {
        let guard = holder
            .lock(key(i))
            .ttl(Duration::from_secs(60))
            .acquire()
            .await
            .unwrap();
        guards.push(Some(guard));
    }
    let scripts = script_calls(&mut con);
    let waiters: Vec<_> = (0..TASKS)
        .step_by(2)
        .map(|i| {
            let request = other.lock(key(i)).wait(Duration::from_secs(20));
            tokio::spawn(request.acquire())
        })
        .collect();
    // Each waiter tries (and marks the lock), subscribes and tries again before it parks: the
    // acquire script once each time.
    let parked = u64::try_from(TASKS).unwrap();
    super::support::eventually(Duration::from_secs(20), "every waiter parked", || {
        let done = script_calls(&mut con) - scripts >= parked;
        async move { done }
    })
    .await;
    for i in (0..TASKS).step_by(2) {
        let value: Option<String> = redis::cmd("GET")
            .arg(format!("lock:{}", key(i)))
            .query(&mut con)
            .unwrap();
        assert!(
            value.is_some_and(|v| v.ends_with("+w")),
            "{} marked",
            key(i)
        );
    }
    let released = pile_up(&mut con, false, |i| guards[i].take().unwrap().release()).await;
    for outcome in released {
        outcome.expect("a held lock is released");
    }
    for waiter in waiters {
        let guard = waiter
            .await
            .unwrap()
            .expect("a waited-for lock is handed over");
        guard.release().await.unwrap();
    }
    for i in (1..TASKS).step_by(2) {
        let value: Option<String> = redis::cmd("GET")
            .arg(format!("lock:{}", key(i)))
            .query(&mut con)
            .unwrap();
        assert_eq!(value, None, "{} released", key(i));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_taken_and_released_in_batches_still_exclude_each_other() {
    let server = RedisServer::start();
    // Two processes, as far as Redis can tell, their tasks on the same eight keys.
    let registries = [registry(&server), registry(&server)];
    let counters: Arc<Vec<AtomicU64>> = Arc::new((0..8).map(|_| AtomicU64::new(0)).collect());
    let inside: Arc<Vec<AtomicU64>> = Arc::new((0..8).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let registry = registries[task % 2].clone();
        let (counters, inside) = (counters.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let slot = task % 8;
            for _ in 0..CYCLES {
                let (counters, inside) = (counters.clone(), inside.clone());
                registry
                    .lock(format!("shared:{slot}"))
                    .wait(Duration::from_secs(60))
                    .run(async move {
                        assert_eq!(
                            inside[slot].fetch_add(1, Ordering::SeqCst),
                            0,
                            "two holders of shared:{slot} at once"
                        );
                        // A read-modify-write that another holder would spoil.
                        let seen = counters[slot].load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        counters[slot].store(seen + 1, Ordering::SeqCst);
                        inside[slot].fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, LockError>(())
                    })
                    .await
                    .expect("every cycle gets its lock");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let total: u64 = counters.iter().map(|c| c.load(Ordering::SeqCst)).sum();
    assert_eq!(total, u64::try_from(TASKS * CYCLES).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_that_fails_inside_a_batch_fails_alone() {
    let server = RedisServer::start();
    let mut con = raw(&server.url()).await;
    // A queue key of the wrong type makes this lock's acquire script fail.
    redis::cmd("SET")
        .arg("queue:{lock:broken}")
        .arg("not a queue")
        .exec_async(&mut con)
        .await
        .unwrap();
    // Its error names it, and the locks sent beside it are unharmed.
    let registry = registry(&server);
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let registry = registry.clone();
            tokio::spawn(async move {
                let key = if i == 0 {
                    "broken".to_owned()
                } else {
                    format!("fine:{i}")
                };
                registry.lock(&key).fencing(true).acquire().await.map(|g| {
                    drop(g);
                    key
                })
            })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        match (i, task.await.unwrap()) {
            (0, Err(e)) => assert!(e.to_string().contains("broken"), "{e}"),
            (0, Ok(_)) => panic!("a lock whose queue is broken cannot be taken"),
            (_, outcome) => {
                outcome.expect("a lock beside a broken one is taken");
            }
        }
    }
}

/// Acquisitions cancelled while their commands were on their way (one sent, the others queued
/// behind it) must not leave their locks taken until the ttl runs out.
#[tokio::test]
async fn acquisitions_cancelled_in_flight_or_in_a_batch_leave_their_locks_free() {
    const KEYS: usize = 8;
    let server = RedisServer::start();
    let registry = super::support::patient_registry(&server.url());
    lock_tests::warm_up(&registry).await;
    let mut con = server.connection();
    // Holds every write until `CLIENT UNPAUSE`: the first acquisition's `SET` waits on the
    // server, the others queue up behind it in this process.
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(30_000)
        .arg("WRITE")
        .query(&mut con)
        .unwrap();
    let acquiring: Vec<_> = (0..KEYS)
        .map(|i| {
            let request = registry
                .lock(format!("cancelled:{i}"))
                .ttl(Duration::from_secs(60));
            tokio::spawn(request.acquire())
        })
        .collect();
    // On this single-threaded runtime, every spawned acquisition runs until it waits.
    tokio::task::yield_now().await;
    super::support::eventually(Duration::from_secs(10), "a SET held by the pause", || {
        let held = info(&mut con, "clients", "blocked_clients") == 1;
        async move { held }
    })
    .await;
    for task in acquiring {
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    }
    let () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut server.connection())
        .unwrap();
    let other = super::support::patient_registry(&server.url());
    for i in 0..KEYS {
        other
            .lock(format!("cancelled:{i}"))
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("a cancelled acquisition still holds its 60 s lock: {e}"))
            .release()
            .await
            .unwrap();
    }
}

/// The release that lets go of a cancelled acquisition reaches the server after that
/// acquisition, also when the acquisition's batch had to be sent again: the server lost its
/// scripts (a restart, `SCRIPT FLUSH`), so the batch's sender loads them and resends what did
/// not run. A release sent meanwhile, beside it, would run first, find nothing, and leave the
/// acquisition's lock to a caller long gone until its ttl runs out.
#[tokio::test]
async fn a_let_go_release_waits_for_its_acquisition_sent_again() {
    const SCRIPT_LOAD: &[u8] = b"$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n";
    let server = RedisServer::start();
    let proxy = lock_tests::proxy::Proxy::start(server.port());
    let registry = super::support::patient_registry(&proxy.url());
    lock_tests::warm_up(&registry).await;
    let mut con = server.connection();
    let () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    proxy.hold_requests_from(SCRIPT_LOAD);
    // The first acquisition goes out alone and waits on the paused server; a candidate's (a
    // script: terms are fenced) goes in a batch of its own beside it. A candidate's release is
    // one script call: no cheap first try whose refusal sends the script again, later.
    client(&mut con, &["PAUSE", "30000", "WRITE"]);
    let ttl = Duration::from_secs(60);
    let first = tokio::spawn(registry.lock("first").ttl(ttl).acquire());
    let wait = Duration::from_secs(10);
    super::support::eventually(wait, "the first acquisition held by the pause", || {
        let held = info(&mut con, "clients", "blocked_clients") == 1;
        async move { held }
    })
    .await;
    let fenced = tokio::spawn(registry.election("fenced").ttl(ttl).campaign());
    super::support::eventually(wait, "the candidate's acquisition on the server", || {
        let sent = unrun_bytes(&mut con) > 0;
        async move { sent }
    })
    .await;
    client(&mut con, &["UNPAUSE"]);
    let first = first.await.unwrap().expect("a free lock is taken");
    // The server answered `NOSCRIPT`: the batch's sender loads the scripts, held here.
    tokio::time::timeout(wait, proxy.held_at_least(SCRIPT_LOAD, 1))
        .await
        .expect("the scripts loaded again after NOSCRIPT");
    fenced.abort();
    assert!(fenced.await.unwrap_err().is_cancelled());
    // A release sent now would be held behind the load, and run before the resent acquisition.
    // A correct build sends nothing until the acquisition's reply is in: the bound costs it a
    // second.
    let release_sent =
        tokio::time::timeout(Duration::from_secs(1), proxy.held_at_least(b"EVALSHA", 1))
            .await
            .is_ok();
    proxy.release_requests();
    // The resent acquisition took the lock (its fencing counter shows it) ...
    super::support::eventually(wait, "the resent acquisition ran", || {
        let ran = exists(&mut con, "fence:{lock:fenced}");
        async move { ran }
    })
    .await;
    // ... and is let go of, well before its ttl.
    let what = format!(
        "the cancelled acquisition's lock let go of (its release sent early: {release_sent})"
    );
    super::support::eventually(wait, &what, || {
        let free = !exists(&mut con, "lock:fenced");
        async move { free }
    })
    .await;
    drop(first);
}

fn exists(con: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<u64>(con).unwrap() == 1
}

/// An acquisition ran on the server, but its reply never came back, and its caller was
/// cancelled: its let-go release is the only thing that frees the lock before its ttl. If that
/// release fails (here the connection is reset while it is on its way, as a restart or a flaky
/// link would), it is tried again, as a dropped guard's is, until the lock would have run out.
#[tokio::test]
async fn a_let_go_release_that_fails_once_is_tried_again() {
    const KEY: &str = "letgo-reset";
    let server = RedisServer::start();
    let proxy = lock_tests::proxy::Proxy::start(server.port());
    let registry = super::support::patient_registry(&proxy.url());
    lock_tests::warm_up(&registry).await;
    let mut con = server.connection();
    let wait = Duration::from_secs(10);
    // The acquisition reaches the server and runs; its reply is lost.
    proxy.drop_replies();
    let acquiring = tokio::spawn(registry.lock(KEY).ttl(Duration::from_secs(60)).acquire());
    super::support::eventually(wait, "the acquisition ran on the server", || {
        let ran = exists(&mut con, &format!("lock:{KEY}"));
        async move { ran }
    })
    .await;
    // Its caller gives up: the let-go release is written, and held in the proxy ...
    proxy.hold_requests_from(KEY.as_bytes());
    acquiring.abort();
    assert!(acquiring.await.unwrap_err().is_cancelled());
    tokio::time::timeout(wait, proxy.held_at_least(KEY.as_bytes(), 1))
        .await
        .expect("the let-go release was written");
    // ... until the connection is reset under it: it fails once.
    proxy.reset_all();
    super::support::eventually(wait, "the connection reset", || {
        let reset = proxy.stats().resets() >= 1;
        async move { reset }
    })
    .await;
    proxy.release_requests();
    proxy.heal();
    // The server is back within milliseconds; the lock should be let go of well before its
    // 60 s ttl.
    super::support::eventually(wait, "the cancelled acquisition's lock let go of", || {
        let free = !exists(&mut con, &format!("lock:{KEY}"));
        async move { free }
    })
    .await;
}
