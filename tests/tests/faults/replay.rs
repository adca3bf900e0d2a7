//! What a workload run keeps when its checks fail, so that they can be run again on exactly
//! those inputs: the servers' histories (as `MONITOR` lines, one file per server; Postgres's
//! change log in `run.json`), the workers' records, the faults with their times, the soak's seed, and what the fenced store held.
//!
//! ```text
//! LOCK_FAULT_REPLAY=target/tmp/fault-runs/<run> \
//!     cargo test -p lock-tests --test faults -- --ignored a_kept_run_is_checked_again
//! ```

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::changes::{self, Change};
use super::checker::{self, ClockStep, FaultRecord, Inputs, Minimums, Report};
use super::model::{self, History};
use super::monitor::{parse_line, Entry, Event};
use super::support::now_us;
use super::workers::Line;

/// Everything the checks read about one run.
#[derive(Serialize, Deserialize)]
pub struct Kept {
    pub name: String,
    pub fencing: bool,
    pub quorum: usize,
    /// The semaphore's permits.
    pub permits: usize,
    pub minimums: Minimums,
    /// The soak's random draw, when it had one.
    pub seed: Option<u64>,
    pub bad_exits: Vec<String>,
    pub lines: Vec<Line>,
    pub killed: HashMap<u32, i64>,
    pub faults: Vec<FaultRecord>,
    /// The jumps of the machine's wall clock the run saw (none recorded before they were
    /// watched).
    #[serde(default)]
    pub clock_steps: Vec<ClockStep>,
    pub register: i64,
    pub rejected: i64,
    pub log: Vec<String>,
    pub leftover_without_ttl: Vec<String>,
    pub proxy: (u64, u64),
    pub ran_for: Duration,
    /// Whether the servers have `SET .. IFEQ` (see `model::rebuild`).
    pub ifeq: bool,
    /// The ports of each copy of the data's servers, as `LockSystem::observed` names them.
    pub servers: Vec<Vec<u16>>,
    /// Per copy of the data, per server: what it ran for clients (replication left out).
    #[serde(skip)]
    pub events: Vec<Vec<Vec<Event>>>,
    /// Postgres: the holders' table's change log, its one history.
    #[serde(default)]
    pub changes: Option<Vec<Change>>,
}

impl Kept {
    /// Runs the checks.
    pub fn check(&self) -> Report {
        let histories: Vec<History> = match &self.changes {
            Some(changes) => vec![changes::history(changes)],
            None => self
                .events
                .iter()
                .map(|streams| model::rebuild(streams, "lock:", self.ifeq))
                .collect(),
        };
        checker::check(&Inputs {
            name: &self.name,
            fencing: self.fencing,
            minimums: self.minimums,
            bad_exits: &self.bad_exits,
            lines: &self.lines,
            killed: &self.killed,
            histories: &histories,
            quorum: self.quorum,
            permits: self.permits,
            faults: &self.faults,
            clock_steps: &self.clock_steps,
            register: self.register,
            rejected: self.rejected,
            log: &self.log,
            leftover_without_ttl: &self.leftover_without_ttl,
            proxy: self.proxy,
            ran_for: self.ran_for,
        })
    }

    /// Writes the run under the test binary's scratch directory and returns where.
    pub fn save(&self) -> PathBuf {
        let slug: String = self
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("fault-runs")
            .join(format!("{slug}-{}", now_us() / 1_000_000));
        std::fs::create_dir_all(&dir).expect("create the run's directory");
        let run = serde_json::to_string_pretty(self).expect("a run serializes");
        std::fs::write(dir.join("run.json"), run).expect("write run.json");
        for (g, group) in self.events.iter().enumerate() {
            for (s, events) in group.iter().enumerate() {
                let mut text = String::new();
                for event in events {
                    match event {
                        Event::Lost { at_us } => writeln!(text, "# lost {at_us}"),
                        Event::Gap { from_us, to_us } => {
                            writeln!(text, "# gap {from_us} {to_us}")
                        }
                        Event::Command(entry) => writeln!(text, "{}", monitor_line(entry)),
                    }
                    .expect("a String takes every write");
                }
                let port = self.servers[g][s];
                std::fs::write(dir.join(format!("server-{g}-{port}.monitor")), text)
                    .expect("write a server's history");
            }
        }
        dir
    }

    /// Reads back what [`save`](Self::save) wrote.
    pub fn load(dir: &Path) -> Self {
        let run = std::fs::read_to_string(dir.join("run.json"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join("run.json").display()));
        let mut kept: Self = serde_json::from_str(&run).expect("run.json as `save` writes it");
        kept.events = kept
            .servers
            .iter()
            .enumerate()
            .map(|(g, group)| {
                group
                    .iter()
                    .map(|port| {
                        let path = dir.join(format!("server-{g}-{port}.monitor"));
                        let text = std::fs::read_to_string(&path)
                            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                        text.lines().map(read_event).collect()
                    })
                    .collect()
            })
            .collect();
        kept
    }
}

fn read_event(line: &str) -> Event {
    if let Some(at) = line.strip_prefix("# lost ") {
        return Event::Lost {
            at_us: at.parse().expect("a time in µs"),
        };
    }
    if let Some((from, to)) = line
        .strip_prefix("# gap ")
        .and_then(|span| span.split_once(' '))
    {
        return Event::Gap {
            from_us: from.parse().expect("a time in µs"),
            to_us: to.parse().expect("a time in µs"),
        };
    }
    let entry = parse_line(format!("{line}\r\n").as_bytes())
        .unwrap_or_else(|| panic!("not a MONITOR line: {line}"));
    Event::Command(entry)
}

/// `entry` as `MONITOR` prints it, escaped as Redis escapes (`sdscatrepr`).
fn monitor_line(entry: &Entry) -> String {
    let secs = entry.at_us / 1_000_000;
    let micros = entry.at_us % 1_000_000;
    let source = match (entry.lua, entry.peer_port) {
        (true, _) => "lua".to_owned(),
        (false, Some(port)) => format!("127.0.0.1:{port}"),
        (false, None) => "unix".to_owned(),
    };
    let mut line = format!("+{secs}.{micros:06} [0 {source}]");
    for arg in &entry.args {
        line.push_str(" \"");
        for &b in arg {
            match b {
                b'"' => line.push_str("\\\""),
                b'\\' => line.push_str("\\\\"),
                b'\n' => line.push_str("\\n"),
                b'\r' => line.push_str("\\r"),
                b'\t' => line.push_str("\\t"),
                0x20..=0x7e => line.push(char::from(b)),
                other => write!(line, "\\x{other:02x}").expect("a String takes every write"),
            }
        }
        line.push('"');
    }
    line
}

#[test]
fn a_kept_history_reads_back_as_it_was() {
    let line = "+1795371742.000062 [0 127.0.0.1:5] \"SET\" \"lock:a\\\"b\\n\\x01\" \"tok\" \"PX\" \"1000\"";
    let entry = parse_line(format!("{line}\r\n").as_bytes()).unwrap();
    assert_eq!(monitor_line(&entry), line);
    let Event::Command(again) = read_event(&monitor_line(&entry)) else {
        panic!("a command");
    };
    assert_eq!(again.args, entry.args);
    assert_eq!(
        (again.at_us, again.lua, again.peer_port),
        (entry.at_us, false, Some(5))
    );
    assert!(matches!(read_event("# lost 12"), Event::Lost { at_us: 12 }));
    assert!(matches!(
        read_event("# gap 12 36"),
        Event::Gap {
            from_us: 12,
            to_us: 36
        }
    ));
}

#[test]
fn a_kept_run_reads_back_the_workers_records_as_they_were() {
    use lock_tests::records::{LockKind, Outcome, Record, StoreCall};
    let lines = vec![
        Line {
            worker: 1,
            record: Record::Ready {
                w: "1".into(),
                pid: 11,
            },
        },
        Line {
            worker: 1,
            record: Record::End {
                w: "1.0".into(),
                seq: 1,
                token: "h:11:a".into(),
                fence: 1,
                start: 100,
                end: 200,
                outcome: Outcome::Lost(lock_runtime::LostReason::Expired),
                lost_seen: true,
                lost_at: Some(150),
                read: StoreCall::Accepted,
                write: StoreCall::InFlight,
                kind: LockKind::Lock,
                keys: vec!["lock:register".into()],
            },
        },
    ];
    let kept = Kept {
        name: "records round trip".into(),
        fencing: false,
        quorum: 1,
        permits: 2,
        minimums: Minimums::NONE,
        seed: None,
        bad_exits: Vec::new(),
        lines: lines.clone(),
        killed: HashMap::new(),
        faults: Vec::new(),
        clock_steps: vec![ClockStep {
            before_us: 300,
            after_us: 9_400,
            moved_us: 9_000,
        }],
        register: 0,
        rejected: 0,
        log: Vec::new(),
        leftover_without_ttl: Vec::new(),
        proxy: (0, 0),
        ran_for: Duration::from_secs(1),
        ifeq: false,
        servers: Vec::new(),
        events: Vec::new(),
        changes: Some(vec![Change {
            op: 'U',
            at_us: 10,
            key: "lock:register".into(),
            token: "h:1:a".into(),
            share: String::new(),
            old_until_us: Some(900),
            new_until_us: Some(1_010),
            new_token: Some("h:1:a".into()),
        }]),
    };
    let dir = kept.save();
    let again = Kept::load(&dir);
    std::fs::remove_dir_all(&dir).expect("remove the kept run");
    let records = |lines: &[Line]| -> Vec<(u32, Record)> {
        lines.iter().map(|l| (l.worker, l.record.clone())).collect()
    };
    assert_eq!(records(&again.lines), records(&lines));
    assert_eq!(again.changes, kept.changes);
    assert_eq!(again.clock_steps, kept.clock_steps);
}

/// Runs the checks again on a run a failed workload kept (see the module's documentation).
#[test]
#[ignore = "replays a kept run: LOCK_FAULT_REPLAY=<dir> cargo test -p lock-tests --test faults -- --ignored"]
fn a_kept_run_is_checked_again() {
    let dir = std::env::var("LOCK_FAULT_REPLAY")
        .expect("LOCK_FAULT_REPLAY names a directory a failed workload run kept");
    let report = Kept::load(Path::new(&dir)).check();
    checker::print_summary(&report);
    assert!(
        report.violations.is_empty(),
        "{} violations",
        report.violations.len()
    );
}
