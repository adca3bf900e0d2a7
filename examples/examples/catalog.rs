//! A product catalog read by many and rewritten by few: 3 processes, each with 8 reader tasks
//! and 1 writer task, on one read-write lock. Every body records in Redis, atomically, that it
//! is inside and how many of the other kind are: readers must overlap each other (that is the
//! point of a read lock), and a writer must never overlap anyone.
//!
//! `cargo run --release -p lock-examples --example catalog`. Without
//! `LOCK_REDIS_URL`/`REDIS_URL` it starts a throwaway redis-server. It prints the most readers
//! seen together and how many bodies overlapped a writer, and exits non-zero unless readers
//! overlapped and no writer did.

use std::time::Duration;

use lock_runtime::{distributed_lock, LockError};
use redis::aio::MultiplexedConnection;

const PROCESSES: u32 = 3;
const READERS_PER_PROCESS: u32 = 8;
const ROUNDS: u32 = 5;
const BODY: Duration = Duration::from_millis(5);

#[derive(Debug, thiserror::Error)]
enum CatalogError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Marks one body of kind `mine` inside for `BODY`; returns how many of its kind were inside
/// (itself included) and how many of `other`, read in the same atomic step.
async fn inside(
    con: &mut MultiplexedConnection,
    mine: &str,
    other: &str,
) -> Result<(i64, i64), CatalogError> {
    let (now, others): (i64, Option<i64>) = redis::pipe()
        .atomic()
        .incr(mine, 1)
        .get(other)
        .query_async(con)
        .await?;
    tokio::time::sleep(BODY).await;
    let _: i64 = redis::cmd("DECR").arg(mine).query_async(con).await?;
    Ok((now, others.unwrap_or(0)))
}

#[distributed_lock(key = "catalog:<run>", mode = "read", wait = "60s")]
async fn read(mut con: MultiplexedConnection, run: &str) -> Result<(i64, i64), CatalogError> {
    inside(
        &mut con,
        &format!("{run}:readers"),
        &format!("{run}:writers"),
    )
    .await
}

#[distributed_lock(key = "catalog:<run>", wait = "60s")]
async fn write(mut con: MultiplexedConnection, run: &str) -> Result<(i64, i64), CatalogError> {
    inside(
        &mut con,
        &format!("{run}:writers"),
        &format!("{run}:readers"),
    )
    .await
}

/// A process: its readers and its writer, `ROUNDS` times each; prints the most readers seen
/// together and the bodies that overlapped a writer.
async fn worker(url: &str, run: &str) -> Result<(), CatalogError> {
    let con = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let _start = lock_examples::ready_and_wait_for_start();
    let tasks: Vec<_> = (0..=READERS_PER_PROCESS)
        .map(|i| {
            let (con, run) = (con.clone(), run.to_owned());
            tokio::spawn(async move {
                let (mut most_readers, mut overlaps) = (0, 0);
                for _ in 0..ROUNDS {
                    if i == 0 {
                        let (writers, readers) = write(con.clone(), &run).await?;
                        overlaps += i64::from(writers != 1 || readers != 0);
                    } else {
                        let (readers, writers) = read(con.clone(), &run).await?;
                        most_readers = most_readers.max(readers);
                        overlaps += i64::from(writers != 0);
                    }
                }
                Ok::<_, CatalogError>((most_readers, overlaps))
            })
        })
        .collect();
    let (mut most_readers, mut overlaps) = (0, 0);
    for task in tasks {
        let (most, over) = task.await.expect("task")?;
        most_readers = most_readers.max(most);
        overlaps += over;
    }
    println!("READERS {most_readers} OVERLAPS {overlaps}");
    Ok(())
}

#[tokio::main]
async fn main() {
    if let Ok(run) = std::env::var("CATALOG_RUN") {
        let url = std::env::var("LOCK_REDIS_URL").expect("set by the parent");
        if let Err(e) = worker(&url, &run).await {
            eprintln!("worker {}: {e}", std::process::id());
            std::process::exit(1);
        }
        return;
    }

    let (_server, url) = lock_examples::redis_url();
    let run = std::process::id().to_string();
    println!(
        "{PROCESSES} processes, each with {READERS_PER_PROCESS} readers and 1 writer of one \
         catalog, {ROUNDS} rounds each\n"
    );
    let lines = tokio::task::spawn_blocking(move || {
        let mut workers = lock_examples::start_copies(
            (0..PROCESSES)
                .map(|_| {
                    vec![
                        ("CATALOG_RUN", run.clone()),
                        ("LOCK_REDIS_URL", url.clone()),
                    ]
                })
                .collect(),
        );
        lock_examples::start_all(&mut workers, "start");
        lock_examples::finish_copies(workers)
    })
    .await
    .unwrap();
    let (mut most_readers, mut overlaps) = (0, 0);
    for line in &lines {
        let Some(rest) = line.strip_prefix("READERS ") else {
            continue;
        };
        let (most, over) = rest.split_once(" OVERLAPS ").expect("READERS n OVERLAPS m");
        most_readers = most_readers.max(most.parse::<i64>().expect("a count"));
        overlaps += over.parse::<i64>().expect("a count");
    }
    println!("most readers inside together: {most_readers}");
    println!("bodies that overlapped a writer: {overlaps}");
    if most_readers < 2 || overlaps != 0 {
        println!(
            "\nCHECK FAILED: readers must read together (saw at most {most_readers}) and no \
             writer may overlap anyone (saw {overlaps})"
        );
        std::process::exit(1);
    }
    println!(
        "\nwith mode = \"read\" on the readers: they read side by side, and each writer wrote \
         alone."
    );
}
