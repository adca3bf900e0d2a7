//! Client OS processes running `fault-worker workload`, and the faults a test can inflict on
//! them: SIGSTOP/SIGCONT, and kill -9 followed by a fresh replacement.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_tests::records::{LockKind, Record};

use super::support::{now_us, signal};

/// One record a worker printed, tagged with the worker that printed it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Line {
    pub worker: u32,
    pub record: Record,
}

pub struct Worker {
    pub id: u32,
    pub pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    pub killed_at: Option<i64>,
}

/// The workload's client processes.
pub struct Pool {
    args: Vec<String>,
    pub workers: Vec<Worker>,
    /// Filled by [`stop`](Self::stop): workers not killed by the test that exited otherwise
    /// than with status 0.
    pub bad_exits: Vec<String>,
    lines: Arc<Mutex<Vec<Line>>>,
    next_id: u32,
}

impl Pool {
    /// `args` select the backend and the workload (everything but `--id`).
    pub fn new(args: Vec<String>) -> Self {
        Self {
            args,
            workers: Vec::new(),
            bad_exits: Vec::new(),
            lines: Arc::new(Mutex::new(Vec::new())),
            next_id: 1,
        }
    }

    /// Starts one more worker and returns once it is connected and looping.
    pub fn spawn(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        let mut child = Command::new(env!("CARGO_BIN_EXE_fault-worker"))
            .arg("workload")
            .args(&self.args)
            .args(["--id", &id.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start fault-worker");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = self.lines.clone();
        let (ready_tx, ready) = mpsc::channel();
        std::thread::spawn(move || {
            let mut ready_tx = Some(ready_tx);
            for text in BufReader::new(stdout).lines().map_while(Result::ok) {
                // The worker writes nothing else: a line that is no record is a bug on one side.
                let record = Record::parse(&text)
                    .unwrap_or_else(|e| panic!("worker {id} wrote {text:?}, not a record: {e}"));
                if matches!(record, Record::Ready { .. }) {
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(());
                    }
                }
                lines
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Line { worker: id, record });
            }
        });
        ready
            .recv_timeout(Duration::from_secs(30))
            .expect("fault-worker did not get ready in 30 s");
        let pid = child.id();
        self.workers.push(Worker {
            id,
            pid,
            stdin: child.stdin.take(),
            child,
            killed_at: None,
        });
        id
    }

    /// Asks task `task` (`0` or `1` of the register, `l` the leader's) of every live worker to
    /// hold its next critical section for `hold`, and waits until one of them began it (its
    /// `begin` record); the others' requests are withdrawn. Returns whether that happened
    /// within `limit`.
    pub fn long_section(&mut self, task: &str, hold: Duration, limit: Duration) -> bool {
        let seen = self.recorded().len();
        let hold_ms = u64::try_from(hold.as_millis()).expect("a hold of some seconds");
        self.tell_all(&format!("long {hold_ms} {task}"));
        let wanted = format!(".{task}");
        let deadline = std::time::Instant::now() + limit;
        let mut started = false;
        while !started && std::time::Instant::now() < deadline {
            // Only the lines since: the readers wait for this lock to store what the workers
            // print, and a worker whose output is not read blocks on it, runtime and all.
            started = self.recorded()[seen..].iter().any(|l| {
                matches!(&l.record, Record::Begin { w, hold_ms: held, .. }
                    if w.ends_with(&wanted) && *held == hold_ms)
            });
            if !started {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.tell_all(&format!("long 0 {task}"));
        started
    }

    fn tell_all(&mut self, line: &str) {
        for w in self.workers.iter_mut().filter(|w| w.killed_at.is_none()) {
            let stdin = w.stdin.as_mut().expect("worker running");
            writeln!(stdin, "{line}").expect("write to the worker");
            stdin.flush().expect("flush");
        }
    }

    /// The workers running now (not killed).
    pub fn live(&self) -> Vec<u32> {
        self.workers
            .iter()
            .filter(|w| w.killed_at.is_none())
            .map(|w| w.id)
            .collect()
    }

    pub fn by_pid(&self, pid: u32) -> Option<u32> {
        self.workers
            .iter()
            .find(|w| w.pid == pid && w.killed_at.is_none())
            .map(|w| w.id)
    }

    fn worker(&mut self, id: u32) -> &mut Worker {
        self.workers
            .iter_mut()
            .find(|w| w.id == id)
            .expect("known worker")
    }

    pub fn pause(&mut self, id: u32) {
        signal(self.worker(id).pid, "STOP");
    }

    pub fn resume(&mut self, id: u32) {
        signal(self.worker(id).pid, "CONT");
    }

    /// kill -9; returns the time of the kill.
    pub fn kill(&mut self, id: u32) -> i64 {
        let w = self.worker(id);
        let _ = w.child.kill();
        let at = now_us();
        let _ = w.child.wait();
        w.killed_at = Some(at);
        at
    }

    /// Closes every worker's stdin (the stop signal) and waits for them to exit.
    pub fn stop(&mut self) -> Vec<Line> {
        for w in &mut self.workers {
            w.stdin = None;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for w in &mut self.workers {
            if w.killed_at.is_some() {
                continue;
            }
            loop {
                match w.child.try_wait() {
                    Ok(Some(status)) => {
                        if !status.success() {
                            self.bad_exits.push(format!("worker {}: {status}", w.id));
                        }
                        break;
                    }
                    _ if std::time::Instant::now() > deadline => {
                        let _ = w.child.kill();
                        let _ = w.child.wait();
                        panic!(
                            "worker {} did not stop within 30 s of its stdin closing",
                            w.id
                        );
                    }
                    _ => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }
        // Readers see EOF once a process exits; give them a moment to push their last lines.
        let expected = self
            .workers
            .iter()
            .filter(|w| w.killed_at.is_none())
            .count();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let done = self
                .lines()
                .iter()
                .filter(|l| matches!(l.record, Record::Done { .. }))
                .count();
            if done >= expected || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.lines()
    }

    /// Lets the workload run until its workers finished the critical sections `least` asks for
    /// (of every kind, of the register, of each other kind), or for at most `limit`. Progress
    /// is only in the workers' output: polled.
    pub fn wait_for_sections(&self, least: &super::checker::Minimums, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            let ended = self.ended();
            let enough =
                |kind: LockKind, least: usize| ended.get(&kind).copied().unwrap_or(0) >= least;
            if ended.values().sum::<usize>() >= least.sections
                && enough(LockKind::Lock, least.register)
                && [
                    LockKind::Read,
                    LockKind::Write,
                    LockKind::Permit,
                    LockKind::Multi,
                    LockKind::Leader,
                ]
                .into_iter()
                .all(|kind| enough(kind, least.per_kind))
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The critical sections the workers finished so far, by kind.
    pub fn ended(&self) -> HashMap<LockKind, usize> {
        let mut ended: HashMap<LockKind, usize> = HashMap::new();
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        for line in lines.iter() {
            if let Record::End { kind, .. } = line.record {
                *ended.entry(kind).or_default() += 1;
            }
        }
        ended
    }

    pub fn lines(&self) -> Vec<Line> {
        self.recorded().clone()
    }

    /// The lines so far, locked: held briefly, for the readers wait on it (see
    /// [`long_section`](Self::long_section)).
    fn recorded(&self) -> std::sync::MutexGuard<'_, Vec<Line>> {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for w in self.workers.iter_mut().filter(|w| w.killed_at.is_none()) {
            let _ = Command::new("kill")
                .args(["-CONT", &w.pid.to_string()])
                .stderr(Stdio::null())
                .status();
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}
