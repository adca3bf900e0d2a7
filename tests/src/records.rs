//! What `fault-worker` tells the fault suite, one JSON object a line: the worker writes
//! [`Record::line`]s on its stdout, and the tests (the checker, the worker pool, the limits
//! tests, a replay of a kept run) read them back with [`Record::parse`]. One type on both sides,
//! so a field cannot be renamed or dropped on one side only, and nothing is parsed by hand.
//!
//! ```text
//! {"record":"begin","w":"3.0","seq":7,"token":"host:123:9f..","fence":41,"called":..,"start":..,"kind":"lock","keys":["lock:register"],"hold_ms":12}
//! {"record":"end","w":"3.0","seq":7,..,"outcome":"ok","lost_seen":false,"read":"accepted","write":"accepted",..}
//! ```
//!
//! Times (`called`, `start`, `end`, `at`) are `CLOCK_REALTIME` microseconds: comparable across
//! the processes of one machine, and with the servers' `MONITOR` timestamps.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use lock_runtime::{LockError, LostReason};
use serde::{Deserialize, Serialize};

/// One line of `fault-worker`'s output. `w` names who wrote it: a workload task
/// (`<worker>.<task>`: `.0` and `.1` for the register's two tasks, `.r`, `.w`, `.p`, `.m` for the
/// other lock kinds) in the records of a critical section, the worker (`<worker>`) in the others.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum Record {
    /// The workload is connected and about to loop: the test waits for it before injecting
    /// anything, and maps lock tokens (`host:pid:random`) back to workers by `pid`.
    Ready {
        /// The worker's id.
        w: String,
        /// The worker's process id, as it appears in the tokens it draws.
        pid: u32,
    },
    /// A critical section started (the body's first instruction): a worker killed before its
    /// [`End`](Self::End) still leaves the section on record.
    Begin {
        /// The task.
        w: String,
        /// The section's number within its task; `(w, seq)` names a section.
        seq: u64,
        /// The lock's token, to match the section with its tenure in the servers' histories.
        token: String,
        /// The fencing token the body uses (0 without fencing or for other lock kinds).
        fence: u64,
        /// When the acquisition was called.
        called: i64,
        /// When the body started.
        start: i64,
        /// What kind of lock the section holds, which decides who may hold it alongside.
        kind: LockKind,
        /// The Redis keys the section holds, each checked against its own tenure.
        keys: Vec<String>,
        /// How long the body means to hold: the test waits for a long section it asked for, and
        /// the summary counts the bodies that outlast the lease.
        hold_ms: u64,
    },
    /// The body is over (its last instruction ran, or it is about to be dropped), written
    /// before the lock is released: a worker killed between its release and its
    /// [`End`](Self::End) is not mistaken for one killed inside the section.
    Over {
        /// The task.
        w: String,
        /// The section's number within its task.
        seq: u64,
        /// When the body was over.
        end: i64,
        /// Whether `CurrentLock::is_lost` said so then.
        lost_seen: bool,
        /// When the worker saw its lease lost (see [`Record::End`]'s), if it did by then.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lost_at: Option<i64>,
    },
    /// A critical section ended: everything the checker judges it by.
    End {
        /// The task.
        w: String,
        /// The section's number within its task.
        seq: u64,
        /// The lock's token.
        token: String,
        /// The fencing token the body used.
        fence: u64,
        /// When the body started.
        start: i64,
        /// The body's last instruction, or the moment the body future was dropped.
        end: i64,
        /// What the acquisition returned (`Dropped` when the test dropped it on purpose).
        outcome: Outcome,
        /// Whether `CurrentLock::is_lost` said so when the body finished: a body that saw its
        /// loss is not trusted to have held the lock throughout.
        lost_seen: bool,
        /// When the worker saw the lease lost (`CurrentLock::lost()` or the guard's resolved
        /// with a loss, not a release): the checker judges a lost section up to here. Absent
        /// when it never was, and in records written before this field.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lost_at: Option<i64>,
        /// The body's fenced read of the register.
        read: StoreCall,
        /// The body's fenced write: the store's log is checked against the writes the workers
        /// saw accepted, plus those whose fate they could not know.
        write: StoreCall,
        /// What kind of lock the section held.
        kind: LockKind,
        /// The Redis keys it held.
        keys: Vec<String>,
    },
    /// An acquisition failed before any body ran: counted in the summary, judged by nothing.
    Err {
        /// The task.
        w: String,
        /// The section's number within its task.
        seq: u64,
        /// When the failure was returned.
        at: i64,
        /// Why it failed.
        outcome: Outcome,
        /// The error as displayed, for a person reading the run.
        msg: String,
    },
    /// A guard or a guarded future was dropped: (g) bounds how long that took.
    Drop {
        /// The task.
        w: String,
        /// When the drop returned.
        at: i64,
        /// What was dropped.
        dropped: Dropped,
        /// How long the drop took (µs).
        took_us: u64,
    },
    /// The runtime ran the worker's 10 ms heartbeat [`Record::LATE`] or more late: (g) bounds
    /// it, except while the worker itself was stopped, and (e) excuses a body cancelled late
    /// while its process was kept off the CPU.
    Stall {
        /// The worker.
        w: String,
        /// When the late heartbeat ran.
        at: i64,
        /// How late it was (µs).
        late_us: u64,
    },
    /// The workload stopped (its stdin closed): the test waits for one from every live worker
    /// before it reads the records.
    Done {
        /// The worker.
        w: String,
        /// Critical sections tried, over every task.
        iterations: u64,
        /// The heartbeat's worst delay (ms).
        worst_heartbeat_ms: u64,
    },
    /// `victim`: the body read the register and is about to stop itself (SIGSTOP); the test
    /// pauses until then, and checks the store against what the victim read.
    Pausing {
        /// The body's fencing token.
        fence: u64,
        /// The register's value it read.
        read: i64,
    },
    /// `victim`: the body runs again after SIGCONT.
    Resumed {
        /// Whether `CurrentLock::is_lost` said so at once: the lease ran out in the pause.
        lost_seen: bool,
    },
    /// `victim`: the write it sent after the pause reached the store.
    Wrote {
        /// Whether the store accepted it (a fenced store refuses a stale fence).
        accepted: bool,
    },
    /// `victim`: what the acquisition returned once the body was over.
    Outcome {
        /// `Ok`, or why not.
        outcome: Outcome,
    },
    /// `victim`: the last line; everything the process sent the store was sent before it.
    Exit,
    /// `tokens`: one lock token, for the randomness checks.
    Token {
        /// The token as the library drew it.
        token: String,
    },
}

impl Record {
    /// The period of the worker's heartbeat.
    pub const HEARTBEAT: Duration = Duration::from_millis(10);
    /// The heartbeat's lateness from which it writes a [`Record::Stall`].
    pub const LATE: Duration = Duration::from_millis(2);

    /// The record as one line of JSON, without the newline.
    ///
    /// # Panics
    /// Never: every record serializes.
    #[must_use]
    pub fn line(&self) -> String {
        serde_json::to_string(self).expect("a record serializes")
    }

    /// Reads back a line [`line`](Self::line) wrote.
    ///
    /// # Errors
    /// When `line` is not such a record.
    pub fn parse(line: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(line)
    }
}

/// What a critical section locks. Each kind has a task of its own in every worker.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum LockKind {
    /// The register's exclusive, fenced lock.
    Lock,
    /// A reader of the read-write lock: readers may hold it side by side.
    Read,
    /// A writer of the read-write lock: alone.
    Write,
    /// One of the semaphore's permits: up to the permits side by side.
    Permit,
    /// Two of three keys at once: alone on each of them.
    Multi,
    /// A term of an election's leader: alone, like a writer.
    Leader,
}

impl LockKind {
    /// The kind's name, as records and the checker's summary spell it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::Read => "read",
            Self::Write => "write",
            Self::Permit => "permit",
            Self::Multi => "multi",
            Self::Leader => "leader",
        }
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What an acquisition (`run`, `acquire`) came to. Written as one word: `ok`, `dropped`,
/// `busy`, `backend`, `error`, or `lost-<reason>` with the reason's label (`lost-expired`,
/// `lost-max_hold`, ..).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(try_from = "String", into = "String")]
pub enum Outcome {
    /// It returned `Ok`.
    Ok,
    /// The test dropped the guard or the guarded future on purpose.
    Dropped,
    /// `LockError::Busy`: the lock stayed taken for the whole wait.
    Busy,
    /// `LockError::Backend`: a server failed or did not answer.
    Backend,
    /// Any other error.
    Error,
    /// `LockError::Lost`: the lease ended before the body did, for this reason.
    Lost(LostReason),
}

/// Every reason a lease can be lost, for reading an outcome back.
const LOST_REASONS: [LostReason; 7] = [
    LostReason::Expired,
    LostReason::Stolen,
    LostReason::Gone,
    LostReason::MaxHold,
    LostReason::NotRenewed,
    LostReason::Shutdown,
    LostReason::Released,
];

impl From<&LockError> for Outcome {
    fn from(err: &LockError) -> Self {
        match err {
            LockError::Lost { reason, .. } => Self::Lost(*reason),
            LockError::Busy { .. } => Self::Busy,
            LockError::Backend { .. } => Self::Backend,
            _ => Self::Error,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ok => f.write_str("ok"),
            Self::Dropped => f.write_str("dropped"),
            Self::Busy => f.write_str("busy"),
            Self::Backend => f.write_str("backend"),
            Self::Error => f.write_str("error"),
            Self::Lost(reason) => write!(f, "lost-{}", reason.label()),
        }
    }
}

impl FromStr for Outcome {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "ok" => Self::Ok,
            "dropped" => Self::Dropped,
            "busy" => Self::Busy,
            "backend" => Self::Backend,
            "error" => Self::Error,
            _ => {
                let reason = s
                    .strip_prefix("lost-")
                    .and_then(|label| LOST_REASONS.into_iter().find(|r| r.label() == label));
                Self::Lost(reason.ok_or_else(|| format!("unknown outcome {s:?}"))?)
            }
        })
    }
}

impl TryFrom<String> for Outcome {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Outcome> for String {
    fn from(outcome: Outcome) -> Self {
        outcome.to_string()
    }
}

/// A body's call to the fenced store, as far as the body knows.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StoreCall {
    /// Not made (the body ended first, or had no reason to).
    NotMade,
    /// Sent, no answer yet: the store may or may not have taken it.
    InFlight,
    /// The store accepted it.
    Accepted,
    /// The store refused a stale fence.
    Rejected,
    /// The call failed: the store may or may not have taken it.
    Failed,
}

impl fmt::Display for StoreCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotMade => "not_made",
            Self::InFlight => "in_flight",
            Self::Accepted => "accepted",
            Self::Rejected => "rejected",
            Self::Failed => "failed",
        })
    }
}

/// What a cancellation test dropped.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Dropped {
    /// A guard, without releasing it.
    Guard,
    /// A guarded future, in the middle of its body.
    Future,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_reads_back_as_it_was_written() {
        let records = [
            Record::Ready {
                w: "1".into(),
                pid: 42,
            },
            Record::Begin {
                w: "1.0".into(),
                seq: 7,
                token: "h:42:9f".into(),
                fence: 41,
                called: 1,
                start: 2,
                kind: LockKind::Multi,
                keys: vec!["lock:a".into(), "lock:b".into()],
                hold_ms: 12,
            },
            Record::Over {
                w: "1.0".into(),
                seq: 7,
                end: 3,
                lost_seen: true,
                lost_at: Some(3),
            },
            Record::End {
                w: "1.0".into(),
                seq: 7,
                token: "h:42:9f".into(),
                fence: 41,
                start: 2,
                end: 3,
                outcome: Outcome::Lost(LostReason::MaxHold),
                lost_seen: true,
                lost_at: Some(3),
                read: StoreCall::Accepted,
                write: StoreCall::InFlight,
                kind: LockKind::Lock,
                keys: vec!["lock:register".into()],
            },
            Record::Err {
                w: "1.1".into(),
                seq: 8,
                at: 4,
                outcome: Outcome::Busy,
                msg: "a message with \"quotes\" and\na newline".into(),
            },
            Record::Drop {
                w: "1".into(),
                at: 5,
                dropped: Dropped::Future,
                took_us: 250,
            },
            Record::Stall {
                w: "1".into(),
                at: 6,
                late_us: 70_000,
            },
            Record::Done {
                w: "1".into(),
                iterations: 100,
                worst_heartbeat_ms: 3,
            },
            Record::Pausing { fence: 2, read: -1 },
            Record::Resumed { lost_seen: false },
            Record::Wrote { accepted: true },
            Record::Outcome {
                outcome: Outcome::Ok,
            },
            Record::Exit,
            Record::Token {
                token: "h:42:ab".into(),
            },
        ];
        for record in records {
            let line = record.line();
            assert!(!line.contains('\n'), "one line: {line}");
            assert_eq!(Record::parse(&line).expect(&line), record);
        }
    }

    #[test]
    fn outcomes_are_one_word_each_and_read_back() {
        let all = [
            Outcome::Ok,
            Outcome::Dropped,
            Outcome::Busy,
            Outcome::Backend,
            Outcome::Error,
        ]
        .into_iter()
        .chain(LOST_REASONS.map(Outcome::Lost));
        for outcome in all {
            let word = outcome.to_string();
            assert_eq!(word.parse::<Outcome>(), Ok(outcome));
            assert_eq!(
                serde_json::to_string(&outcome).unwrap(),
                format!("\"{word}\"")
            );
        }
        assert_eq!(
            Outcome::Lost(LostReason::Expired).to_string(),
            "lost-expired"
        );
        assert!("lost-nothing".parse::<Outcome>().is_err());
        assert!(Record::parse(r#"{"record":"outcome","outcome":"lost-nothing"}"#).is_err());
        assert!(Record::parse("begin w=1.0 seq=1").is_err());
    }
}
