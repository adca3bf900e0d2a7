//! `--renew-ifeq`: what a renewal costs as the renewal script (`EVALSHA` of `RENEW_LUA`, one
//! call per chunk of 512 locks) against `SET key token IFEQ token PX ttl GET` (one command per
//! lock, 512 pipelined), side by side on one server that has both (Valkey 8.1+:
//! `LOCK_TEST_SERVER=$(scripts/ensure-redis --valkey)`).
//!
//! These are the commands lock-runtime's keeper sends for exclusive locks (the script on a
//! server without `IFEQ`), sent here straight so that both run against the same server, keys
//! and moment: rounds alternate, each renewing every lock once. The server side is `INFO
//! commandstats` (µs inside the command, the script's inner commands included) and `INFO cpu`
//! (everything the server did, reading and parsing 512 commands included); the client side is
//! the round trip of one chunk.

use std::time::{Duration, Instant};

use crate::stats::{dur, Samples};

const LOCKS: usize = 10_000;
const CHUNK: usize = 512;
const ROUNDS: usize = 20;
const TTL_MS: u64 = 60_000;

#[derive(Default)]
struct Side {
    command_usec: f64,
    cpu_secs: f64,
    renewals: u64,
    round_trips: Vec<Duration>,
}

impl Side {
    fn usec_per_renewal(&self) -> f64 {
        self.command_usec / self.renewals as f64
    }

    fn cpu_usec_per_renewal(&self) -> f64 {
        self.cpu_secs * 1e6 / self.renewals as f64
    }
}

/// `(usec inside commands of `command`, server CPU seconds)` now.
fn server_counters(con: &mut redis::Connection, command: &str) -> (f64, f64) {
    let text: String = redis::cmd("INFO")
        .arg("cpu")
        .arg("commandstats")
        .query(con)
        .expect("INFO");
    let prefix = format!("cmdstat_{command}:");
    let mut usec = 0.0;
    let mut cpu = 0.0;
    for line in text.lines() {
        if let Some(stats) = line.strip_prefix(&prefix) {
            usec = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("usec="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
        } else if let Some(v) = line
            .strip_prefix("used_cpu_user:")
            .or_else(|| line.strip_prefix("used_cpu_sys:"))
        {
            cpu += v.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    (usec, cpu)
}

fn token(i: usize) -> String {
    format!("bench:{}:{i:032x}", std::process::id())
}

fn key(i: usize) -> String {
    format!("lock:renew-ifeq:{i}")
}

/// One round over every lock, by the script or by `SET .. IFEQ`, added to `out`.
fn round(con: &mut redis::Connection, script: &redis::Script, ifeq: bool, out: &mut Side) {
    let (usec_before, cpu_before) = server_counters(con, if ifeq { "set" } else { "evalsha" });
    let mut renewed = 0u64;
    for chunk in (0..LOCKS).collect::<Vec<_>>().chunks(CHUNK) {
        let started = Instant::now();
        if ifeq {
            let mut pipe = redis::pipe();
            for &i in chunk {
                pipe.cmd("SET")
                    .arg(key(i))
                    .arg(token(i))
                    .arg("IFEQ")
                    .arg(token(i))
                    .arg("PX")
                    .arg(TTL_MS)
                    .arg("GET");
            }
            let found: Vec<Option<String>> = pipe.query(con).expect("SET IFEQ");
            out.round_trips.push(started.elapsed());
            renewed += chunk
                .iter()
                .zip(found)
                .filter(|(&i, f)| f.as_deref() == Some(token(i).as_str()))
                .count() as u64;
        } else {
            let mut call = script.prepare_invoke();
            for &i in chunk {
                call.key(key(i)).arg(token(i)).arg(TTL_MS);
            }
            let flags: Vec<i64> = call.invoke(con).expect("EVALSHA");
            out.round_trips.push(started.elapsed());
            renewed += flags.iter().filter(|f| **f == 1).count() as u64;
        }
    }
    assert_eq!(renewed, LOCKS as u64, "every lock renewed");
    let (usec_after, cpu_after) = server_counters(con, if ifeq { "set" } else { "evalsha" });
    out.command_usec += usec_after - usec_before;
    out.cpu_secs += cpu_after - cpu_before;
    out.renewals += renewed;
}

/// Runs the comparison on a server the fixture starts, and prints it.
pub fn run() {
    let server = lock_tests::RedisServer::start();
    let url = server.url();
    let mut con = lock_tests::connection(&url);
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut con)
        .expect("INFO server");
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
    };
    let version = match field("valkey_version:") {
        Some(v) => format!("Valkey {v}"),
        None => format!("Redis {}", field("redis_version:").unwrap_or_default()),
    };
    let probe: redis::RedisResult<Option<String>> = redis::cmd("SET")
        .arg("lock:renew-ifeq:probe")
        .arg("x")
        .arg("IFEQ")
        .arg("y")
        .query(&mut con);
    if probe.is_err() {
        eprintln!(
            "[lock-bench] this server ({version}) has no SET IFEQ: run it on Valkey 8.1+, \
             LOCK_TEST_SERVER=$(scripts/ensure-redis --valkey) cargo run --release -p lock-bench -- --renew-ifeq"
        );
        // `exit` runs no destructors: stop the server first.
        drop(server);
        std::process::exit(1);
    }
    let script = redis::Script::new(lock_runtime::protocol::RENEW_LUA);
    for chunk in (0..LOCKS).collect::<Vec<_>>().chunks(CHUNK) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            pipe.cmd("SET")
                .arg(key(i))
                .arg(token(i))
                .arg("PX")
                .arg(TTL_MS)
                .ignore();
        }
        pipe.query::<()>(&mut con).expect("take the locks");
    }
    let (mut by_script, mut by_ifeq) = (Side::default(), Side::default());
    // A warm-up round of each (the script's first call loads it), not counted.
    round(&mut con, &script, false, &mut Side::default());
    round(&mut con, &script, true, &mut Side::default());
    for _ in 0..ROUNDS {
        round(&mut con, &script, false, &mut by_script);
        round(&mut con, &script, true, &mut by_ifeq);
    }
    let rtt = |side: &Side| Samples::new(side.round_trips.clone());
    let (rtt_script, rtt_ifeq) = (rtt(&by_script), rtt(&by_ifeq));
    println!(
        "Renewal on {version}: {LOCKS} locks, {ROUNDS} rounds of each, alternating, chunks of {CHUNK}\n\
         \n| per renewal | script (EVALSHA RENEW_LUA) | SET IFEQ .. GET | IFEQ ÷ script |\n|---|---|---|---|"
    );
    let ratio = |a: f64, b: f64| format!("{:.2}", a / b);
    println!(
        "| server µs inside the command (commandstats) | {:.2} µs | {:.2} µs | {} |",
        by_script.usec_per_renewal(),
        by_ifeq.usec_per_renewal(),
        ratio(by_ifeq.usec_per_renewal(), by_script.usec_per_renewal())
    );
    println!(
        "| server CPU, user + sys (INFO cpu) | {:.2} µs | {:.2} µs | {} |",
        by_script.cpu_usec_per_renewal(),
        by_ifeq.cpu_usec_per_renewal(),
        ratio(
            by_ifeq.cpu_usec_per_renewal(),
            by_script.cpu_usec_per_renewal()
        )
    );
    let median = |s: &Samples| s.median().as_secs_f64() * 1e6;
    println!(
        "| client round trip of a {CHUNK}-lock chunk, median (p90) | {} ({}) | {} ({}) | {} |",
        dur(rtt_script.median()),
        dur(rtt_script.quantile(0.9)),
        dur(rtt_ifeq.median()),
        dur(rtt_ifeq.quantile(0.9)),
        ratio(median(&rtt_ifeq), median(&rtt_script))
    );
}
