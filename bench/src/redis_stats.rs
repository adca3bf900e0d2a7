//! What the server counts: `INFO` (commands, CPU) and `MONITOR` (who sent which command).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, PoisonError};

/// One `INFO stats cpu commandstats` snapshot.
#[derive(Clone, Debug, Default)]
pub struct Info {
    /// Calls per command, commands run inside scripts included (`cmdstat_<name>`).
    pub calls: HashMap<String, u64>,
    /// Server CPU, user + system, in seconds.
    pub cpu_secs: f64,
}

impl Info {
    pub fn take(con: &mut redis::Connection) -> Info {
        let text: String = redis::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query(con)
            .expect("INFO");
        let mut info = Info::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("cmdstat_") {
                let Some((name, stats)) = rest.split_once(':') else {
                    continue;
                };
                let calls = stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("calls="))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                info.calls.insert(name.to_owned(), calls);
            } else if let Some(v) = line
                .strip_prefix("used_cpu_user:")
                .or_else(|| line.strip_prefix("used_cpu_sys:"))
            {
                info.cpu_secs += v.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
        info
    }

    /// Calls of `command` since `earlier`.
    pub fn delta(&self, earlier: &Info, command: &str) -> u64 {
        self.calls.get(command).copied().unwrap_or(0)
            - earlier.calls.get(command).copied().unwrap_or(0)
    }

    /// Every command the server executed since `earlier` (inside scripts too), except `INFO`.
    pub fn total_delta(&self, earlier: &Info) -> u64 {
        self.calls
            .keys()
            .filter(|name| name.as_str() != "info")
            .map(|name| self.delta(earlier, name))
            .sum()
    }
}

/// The median time the server spent on `command` since the last `CONFIG RESETSTAT`, in µs
/// (`INFO latencystats`, Redis 7+), or NaN when the server does not track it.
pub fn server_median_usec(con: &mut redis::Connection, command: &str) -> f64 {
    let text: String = redis::cmd("INFO")
        .arg("latencystats")
        .query(con)
        .expect("INFO latencystats");
    let prefix = format!("latency_percentiles_usec_{command}:");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.split(',').find_map(|kv| kv.strip_prefix("p50=")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// A `MONITOR` connection that records every line the server sends.
pub struct Monitor {
    stream: TcpStream,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Monitor {
    pub fn start(port: u16) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect for MONITOR");
        stream.write_all(b"MONITOR\r\n").expect("send MONITOR");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let read = stream.try_clone().expect("clone the MONITOR socket");
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(read).lines().map_while(Result::ok) {
                sink.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
            }
        });
        Monitor {
            stream,
            lines,
            reader: Some(reader),
        }
    }

    /// Commands sent by clients (not run inside scripts, not from `exclude`) between the
    /// `ECHO <start>` and `ECHO <end>` markers, per command name.
    pub fn count_between(
        &self,
        start: &str,
        end: &str,
        exclude: &[String],
    ) -> BTreeMap<String, u64> {
        // The end marker may still be on its way to us.
        for _ in 0..200 {
            if self.lines().iter().any(|l| l.contains(end)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let lines = self.lines();
        let mut counts = BTreeMap::new();
        let mut inside = false;
        for line in &lines {
            if line.contains(start) {
                inside = true;
                continue;
            }
            if line.contains(end) {
                break;
            }
            if !inside {
                continue;
            }
            // `+1700000000.123456 [0 127.0.0.1:40000] "SET" "key" ...`, or `[0 lua]`.
            let Some((_, rest)) = line.split_once('[') else {
                continue;
            };
            let Some((source, command)) = rest.split_once(']') else {
                continue;
            };
            let addr = source.split_whitespace().nth(1).unwrap_or("");
            if addr == "lua" || exclude.iter().any(|e| e == addr) {
                continue;
            }
            let name = command
                .split_whitespace()
                .next()
                .unwrap_or("")
                .trim_matches('"')
                .to_ascii_uppercase();
            *counts.entry(name).or_insert(0) += 1;
        }
        counts
    }

    fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}
