//! A scheduled job that must run once per period although every replica schedules it: three
//! replica processes fire `daily_report` at the start of each "day" (2 s here), and the lock
//! with `min_hold` makes exactly one of them build the report.
//!
//! `cargo run --release -p lock-examples --example daily_report`. Without
//! `LOCK_REDIS_URL`/`REDIS_URL` it starts a throwaway redis-server.
//!
//! - The winner keeps the lock after its report until the day is over (`min_hold`), so the
//!   other replicas, and their retries, find it taken and skip.
//! - On failure the lock is released at once: the very first attempt of the run fails (the
//!   warehouse export is late), and another replica's retry builds that day's report.
//! - Each report is an entry in a Redis list per day; the parent counts them and exits
//!   non-zero unless every day has exactly one.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{distributed_lock, LockError};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

const REPLICAS: u32 = 3;
const DAYS: u32 = 3;
/// One "day". `min_hold` below is the same length.
const DAY: Duration = Duration::from_secs(2);
/// How long building the report takes.
const BUILD: Duration = Duration::from_millis(300);
/// A replica that found the lock taken looks again after this long, until its day is over:
/// the job may have failed elsewhere and need a retry.
const RETRY_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
enum ReportError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The injected failure: the data was not ready.
    #[error("the warehouse export is not ready")]
    WarehouseNotReady,
}

fn reports_key(run: &str, day: u32) -> String {
    format!("daily-report:{run}:day:{day}:reports")
}

fn attempts_key(run: &str) -> String {
    format!("daily-report:{run}:attempts")
}

/// The job. The day is part of the key, so a lock kept a little past midnight never delays the
/// next day's run; `min_hold` is what turns every later attempt of the same day into a skip.
/// `ttl` only bounds how long a crashed replica blocks the retry.
#[distributed_lock(key = "report:<run>:<day>", ttl = "5s", min_hold = "2s")]
async fn daily_report(
    run: &str,
    day: u32,
    replica: u32,
    mut con: MultiplexedConnection,
) -> Result<(), ReportError> {
    event(replica, day, "took the lock, building the report");
    let attempt: u64 = con.incr(attempts_key(run), 1).await?;
    tokio::time::sleep(BUILD).await;
    if attempt == 1 {
        return Err(ReportError::WarehouseNotReady);
    }
    let () = con
        .rpush(reports_key(run, day), format!("replica {replica}"))
        .await?;
    event(
        replica,
        day,
        "REPORT DONE; the lock stays taken until the day is over (min_hold)",
    );
    Ok(())
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// One line per event on stdout; the parent merges the replicas' lines into one timeline.
fn event(replica: u32, day: u32, what: &str) {
    println!("EVENT {} {replica} {day} {what}", now_us());
}

/// A replica's scheduler: at the start of each day, run the job; on "busy", look again every
/// `RETRY_EVERY` until the day is over; after its own failure, leave the retry to the others.
async fn replica(replica: u32, run: &str, url: &str) -> Result<(), ReportError> {
    let con = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    // The parent answers with the first day's start, once every replica is ready.
    let first_day_us: u128 = lock_examples::ready_and_wait_for_start()
        .parse()
        .expect("a start time");
    for day in 1..=DAYS {
        let starts = first_day_us + u128::from(day - 1) * DAY.as_micros();
        let ends = starts + DAY.as_micros();
        sleep_until_us(starts).await;
        loop {
            match daily_report(run, day, replica, con.clone()).await {
                Ok(()) => break,
                Err(ReportError::Lock(LockError::Busy { .. })) => {
                    if now_us() + RETRY_EVERY.as_micros() >= ends {
                        event(replica, day, "busy; no time for another retry today");
                        break;
                    }
                    event(replica, day, "busy: taken by another replica; retry soon");
                    tokio::time::sleep(RETRY_EVERY).await;
                }
                Err(ReportError::WarehouseNotReady) => {
                    event(
                        replica,
                        day,
                        "FAILED (warehouse export not ready): lock released at once",
                    );
                    break;
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

async fn sleep_until_us(at_us: u128) {
    let now = now_us();
    if at_us > now {
        let wait = u64::try_from(at_us - now).unwrap_or(u64::MAX);
        tokio::time::sleep(Duration::from_micros(wait)).await;
    }
}

#[tokio::main]
async fn main() {
    if let Ok(n) = std::env::var("REPORT_REPLICA") {
        let n: u32 = n.parse().expect("replica number");
        let run = std::env::var("REPORT_RUN").expect("set by the parent");
        let url = std::env::var("LOCK_REDIS_URL").expect("set by the parent");
        if let Err(e) = replica(n, &run, &url).await {
            eprintln!("replica {n}: {e}");
            std::process::exit(1);
        }
        return;
    }

    let (_server, url) = lock_examples::redis_url();
    // Keys of this run only, so runs against a shared Redis never see each other's reports.
    let run = format!("{:x}", now_us() % 0xff_ffff);
    let mut replicas = lock_examples::start_copies(
        (1..=REPLICAS)
            .map(|r| {
                vec![
                    ("REPORT_REPLICA", r.to_string()),
                    ("REPORT_RUN", run.clone()),
                    ("LOCK_REDIS_URL", url.clone()),
                ]
            })
            .collect(),
    );
    // Day 1 starts shortly after everyone is ready; each replica schedules from this clock.
    let first_day_us = now_us() + 100_000;
    lock_examples::start_all(&mut replicas, &first_day_us.to_string());
    println!(
        "{REPLICAS} replicas schedule `daily_report` at the start of every {} s day, \
         key report:{run}:<day>, min_hold 2s\n",
        DAY.as_secs()
    );
    let mut events = Vec::new();
    for line in lock_examples::finish_copies(replicas) {
        let parts: Vec<&str> = line.splitn(5, ' ').collect();
        if parts.len() == 5 && parts[0] == "EVENT" {
            events.push((
                parts[1].parse::<u128>().unwrap(),
                parts[2].parse::<u32>().unwrap(),
                parts[3].parse::<u32>().unwrap(),
                parts[4].to_owned(),
            ));
        }
    }
    events.sort_by_key(|e| e.0);

    let mut day_shown = 0;
    for (at, replica, day, what) in &events {
        if *day != day_shown {
            println!("day {day}");
            day_shown = *day;
        }
        let since_day_start =
            (*at as f64 - first_day_us as f64) / 1e6 - f64::from(day - 1) * DAY.as_secs_f64();
        println!("  {since_day_start:>+6.2}s  replica {replica}  {what}");
    }

    // The checks: the reports counted in Redis, and the failure handed over to a retry.
    let mut con = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("connect to redis");
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    for day in 1..=DAYS {
        let reports: Vec<String> = redis::cmd("LRANGE")
            .arg(reports_key(&run, day))
            .arg(0)
            .arg(-1)
            .query(&mut con)
            .expect("read the reports");
        summary.push(format!(
            "day {day}: {} report(s) {reports:?}",
            reports.len()
        ));
        if reports.len() != 1 {
            failures.push(format!(
                "day {day} has {} reports, expected exactly one",
                reports.len()
            ));
        }
    }
    let by_day = |needle: &str| -> BTreeMap<u32, Vec<u32>> {
        let mut map: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (_, replica, day, what) in &events {
            if what.starts_with(needle) {
                map.entry(*day).or_default().push(*replica);
            }
        }
        map
    };
    let failed = by_day("FAILED");
    let done = by_day("REPORT DONE");
    match failed.iter().next() {
        Some((day, who)) => match done.get(day) {
            Some(by) if by.iter().all(|r| !who.contains(r)) => summary.push(format!(
                "day {day}: replica {} failed, the lock was released at once, and replica {} \
                 retried and built the report",
                who[0], by[0]
            )),
            _ => failures.push(format!(
                "day {day}: after replica {} failed, no other replica built the report",
                who[0]
            )),
        },
        None => failures.push("the injected failure did not happen".to_owned()),
    }
    let _: () = redis::cmd("DEL")
        .arg(attempts_key(&run))
        .arg((1..=DAYS).map(|d| reports_key(&run, d)).collect::<Vec<_>>())
        .query(&mut con)
        .expect("clean up");

    println!();
    for line in &summary {
        println!("{line}");
    }
    if !failures.is_empty() {
        for failure in &failures {
            println!("CHECK FAILED: {failure}");
        }
        std::process::exit(1);
    }
    println!(
        "\n{DAYS} days, {REPLICAS} replicas scheduling the job each day: exactly one report per \
         day, counted in Redis."
    );
}
