//! Where no Redis lock can keep exclusion: a holder process that pauses past its lease, a server
//! that restarts without persistence, a server whose clock jumps forward. Each test shows what
//! happens, and what fencing still saves.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lock_runtime::{LockError, LostReason};
use lock_tests::records::{Outcome, Record};
use lock_tests::RedisServer;
use redis::AsyncCommands;

use super::support::{is_stopped, raw, registry, signal, spawn_hung_body};

/// A `fault-worker victim` process: takes the lock once, reads the register, and (with
/// `pause = true`) stops itself with SIGSTOP in the middle of the critical section.
struct Victim {
    child: Child,
    records: mpsc::Receiver<Record>,
}

impl Victim {
    fn start(lock_url: &str, store_url: &str, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fault-worker"))
            .arg("victim")
            .args(["--backend", "single", "--lock-url", lock_url])
            .args(["--store-url", store_url, "--key", "register"])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start fault-worker victim");
        let stdout = child.stdout.take().expect("piped");
        let (tx, records) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let record = Record::parse(&line)
                    .unwrap_or_else(|e| panic!("the victim wrote {line:?}, not a record: {e}"));
                let _ = tx.send(record);
            }
        });
        Self { child, records }
    }

    fn next_record(&self) -> Record {
        self.records
            .recv_timeout(Duration::from_secs(30))
            .expect("the victim said nothing for 30 s")
    }

    /// Every record until the process exits.
    fn finish(mut self) -> Vec<Record> {
        let mut all = Vec::new();
        while let Ok(record) = self.records.recv_timeout(Duration::from_secs(30)) {
            all.push(record);
        }
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "victim failed: {status} after {all:?}");
        all
    }

    /// Waits for the self-inflicted SIGSTOP; returns the fence and value it read.
    fn wait_paused(&self) -> (u64, i64) {
        let record = self.next_record();
        let Record::Pausing { fence, read } = record else {
            panic!("the victim did not pause first: {record:?}");
        };
        let pid = self.child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !is_stopped(pid) {
            assert!(Instant::now() < deadline, "the victim did not stop");
            std::thread::sleep(Duration::from_millis(2));
        }
        (fence, read)
    }
}

/// What the victim returns when its lease ran out in its pause.
const LOST_EXPIRED: Record = Record::Outcome {
    outcome: Outcome::Lost(LostReason::Expired),
};

/// Runs a second holder (another process) through the same critical section, no pause.
fn second_holder(lock_url: &str, store_url: &str, fencing: bool) -> Vec<Record> {
    let fencing = if fencing { "1" } else { "0" };
    Victim::start(
        lock_url,
        store_url,
        &[
            "--fencing",
            fencing,
            "--pause",
            "no",
            "--wait-ms",
            "5000",
            "--ttl-ms",
            "800",
        ],
    )
    .finish()
}

fn store_state(store: &RedisServer) -> (i64, Vec<String>, i64) {
    let mut con = store.connection();
    let register: Option<i64> = redis::cmd("GET")
        .arg("store:register:register")
        .query(&mut con)
        .unwrap();
    let log: Vec<String> = redis::cmd("LRANGE")
        .arg("store:register:log")
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .unwrap();
    let rejected: Option<i64> = redis::cmd("GET")
        .arg("store:register:rejected")
        .query(&mut con)
        .unwrap();
    (register.unwrap_or(0), log, rejected.unwrap_or(0))
}

/// Waits until the victim's write reached the store (the store logs or rejects it).
fn wait_for_store(store: &RedisServer, done: impl Fn(&(i64, Vec<String>, i64)) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(&store_state(store)) {
        assert!(
            Instant::now() < deadline,
            "the store never saw the write: {:?}",
            store_state(store)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_paused_holder_process_writes_after_its_lease_ended_and_only_fencing_rejects_it() {
    let server = RedisServer::start();
    let store = RedisServer::start();
    let victim = Victim::start(
        &server.url(),
        &store.url(),
        &["--fencing", "1", "--ttl-ms", "800"],
    );
    let (fence, read) = victim.wait_paused();
    assert_eq!(read, 0);
    // While the holder is stopped its lease runs out and another process takes the lock.
    let second = second_holder(&server.url(), &store.url(), true);
    assert!(
        second.contains(&Record::Wrote { accepted: true }),
        "{second:?}"
    );
    signal(victim.child.id(), "CONT");
    // The paused holder resumes in the middle of its critical section and sends its write
    // before anything can stop it: fencing is what refuses it.
    wait_for_store(&store, |(_, _, rejected)| *rejected >= 1);
    let lines = victim.finish();
    let (register, log, rejected) = store_state(&store);
    assert_eq!(register, 1, "only the second holder's increment counts");
    assert_eq!(log.len(), 1, "{log:?}");
    let written_with: u64 = log[0]
        .split(':')
        .next()
        .and_then(|f| f.parse().ok())
        .unwrap_or_default();
    assert!(written_with > fence, "the next holder's token: {log:?}");
    assert_eq!(rejected, 1, "the stale write arrived and was refused");
    assert!(
        lines.contains(&Record::Resumed { lost_seen: true }),
        "{lines:?}"
    );
    assert!(lines.contains(&LOST_EXPIRED), "{lines:?}");
}

#[test]
fn without_fencing_a_paused_holders_late_write_overwrites_the_next_holders() {
    let server = RedisServer::start();
    let store = RedisServer::start();
    let victim = Victim::start(
        &server.url(),
        &store.url(),
        &["--fencing", "0", "--ttl-ms", "800"],
    );
    let (_, read) = victim.wait_paused();
    assert_eq!(read, 0);
    let second = second_holder(&server.url(), &store.url(), false);
    assert!(
        second.contains(&Record::Wrote { accepted: true }),
        "{second:?}"
    );
    signal(victim.child.id(), "CONT");
    wait_for_store(&store, |(_, log, _)| log.len() >= 2);
    let lines = victim.finish();
    let (register, log, _) = store_state(&store);
    // Two increments were written, the register counts one: a lost update that the lock,
    // which the paused process no longer held, could not prevent.
    assert_eq!(log, ["plain:1", "plain:1"]);
    assert_eq!(register, 1);
    assert!(lines.contains(&LOST_EXPIRED), "{lines:?}");
}

#[test]
fn a_body_that_outlived_its_lease_in_a_pause_is_reported_lost_not_ok() {
    let server = RedisServer::start();
    let store = RedisServer::start();
    let victim = Victim::start(
        &server.url(),
        &store.url(),
        &[
            "--fencing",
            "1",
            "--ttl-ms",
            "800",
            "--after-pause",
            "return",
        ],
    );
    victim.wait_paused();
    // Longer than the lease: the key expires on the server meanwhile.
    std::thread::sleep(Duration::from_millis(2000));
    let mut con = server.connection();
    let exists: bool = redis::cmd("EXISTS")
        .arg("lock:register")
        .query(&mut con)
        .unwrap();
    assert!(!exists, "the lease ran out during the pause");
    signal(victim.child.id(), "CONT");
    let lines = victim.finish();
    assert!(
        lines.contains(&Record::Resumed { lost_seen: true }),
        "{lines:?}"
    );
    // The body finished after its lease ended: with on_lost = cancel the caller must hear
    // `Lost`, not `Ok`, or it believes the work ran under the lock.
    assert!(lines.contains(&LOST_EXPIRED), "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_lets_a_second_holder_in_whose_fencing_token_is_still_greater(
) {
    let mut server = RedisServer::start();
    let a = registry(&server.url());
    for _ in 0..2 {
        a.lock("k")
            .fencing(true)
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let ttl = Duration::from_millis(1500);
    let first = a.lock("k").fencing(true).ttl(ttl);
    let (fence_tx, fence_rx) = tokio::sync::oneshot::channel();
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let body = tokio::spawn(first.run(async move {
        let current = lock_runtime::current().unwrap();
        fence_tx.send(current.fence().unwrap()).unwrap();
        started_tx.send(()).unwrap();
        std::future::pending::<Result<(), LockError>>().await
    }));
    started.await.unwrap();
    let first_fence = fence_rx.await.unwrap();
    server.restart();
    // The lock and its counter are gone with the data: a second owner gets in at once...
    let b = registry(&server.url());
    let second = b
        .lock("k")
        .fencing(true)
        .acquire()
        .await
        .expect("the lock is free again");
    assert!(
        !body.is_finished(),
        "...while the first still runs its body"
    );
    // ...but its fencing token is still greater: the lost counter was re-created from the
    // server's clock, above every token the old one handed out, so a fenced store refuses the
    // first holder's late writes and accepts the second's.
    assert!(second.fence().unwrap() > first_fence);
    // The first holder learns at its next renewal: its token is gone.
    let err = body.await.unwrap().unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_expiry_on_the_server_lets_a_second_holder_in_until_the_next_renewal() {
    // A forward jump of the server's clock expires keys early; the effect is simulated by
    // shortening the key's expiry behind the holder's back (the clock itself cannot be moved
    // on a shared machine).
    let server = RedisServer::start();
    let a = registry(&server.url());
    let ttl = Duration::from_millis(900);
    let body = spawn_hung_body(a.lock("k").fencing(true).ttl(ttl)).await;
    let first_fence = a.held()[0].fence.unwrap();
    let mut con = raw(&server.url()).await;
    let _: () = con.pexpire("lock:k", 1).await.unwrap();
    let b = registry(&server.url());
    let second = b
        .lock("k")
        .fencing(true)
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    let overlap_started = Instant::now();
    assert!(
        !body.is_finished(),
        "two holders at once: the first has not noticed yet"
    );
    // Fencing still orders them: the counter was not touched.
    assert!(second.fence().unwrap() > first_fence);
    let err = body.await.unwrap().unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    // Found out at the next renewal: at most a third of the ttl (plus one round trip and
    // scheduling, bounded here by 200 ms).
    assert!(
        overlap_started.elapsed() <= ttl / 3 + Duration::from_millis(200),
        "{:?}",
        overlap_started.elapsed()
    );
    second.release().await.unwrap();
}
