//! A pool of 4 GPUs shared by 3 worker processes with 8 render jobs each. Every job marks its
//! GPU busy in Redis for the length of the render; the pool's count says how many run at once.
//! Without a semaphore all 24 jobs pile onto the pool together. With
//! `#[distributed_lock(key = "gpu-pool", permits = 4)]` at most 4 run at any moment, across all
//! processes, and the others wait their turn.
//!
//! `cargo run --release -p lock-examples --example gpu_pool`. Without
//! `LOCK_REDIS_URL`/`REDIS_URL` it starts a throwaway redis-server. It prints the most jobs seen
//! running at once with and without the semaphore, and exits non-zero if the semaphore ever let
//! more than 4 run together (or never let two share the pool).

use std::time::Duration;

use lock_runtime::{distributed_lock, LockError};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

const GPUS: i64 = 4;
const PROCESSES: u32 = 3;
const JOBS_PER_PROCESS: u32 = 8;
const RENDER: Duration = Duration::from_millis(40);

#[derive(Debug, thiserror::Error)]
enum RenderError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// One render: takes a GPU (the count of busy GPUs goes up), renders, gives it back. Returns
/// how many GPUs were busy when it started, itself included.
async fn render(mut con: MultiplexedConnection, busy: &str) -> Result<i64, RenderError> {
    let running: i64 = con.incr(busy, 1).await?;
    tokio::time::sleep(RENDER).await;
    let _: i64 = con.decr(busy, 1).await?;
    Ok(running)
}

/// The same render, at most `GPUS` at once across every process.
#[distributed_lock(key = "gpu-pool:<busy>", permits = 4, ttl = "10s", wait = "60s")]
async fn render_on_pool(con: MultiplexedConnection, busy: &str) -> Result<i64, RenderError> {
    render(con, busy).await
}

/// A worker process: connects, says READY, waits for the start, runs its jobs at once and
/// prints the most GPUs it saw busy.
async fn worker(url: &str, busy: &str, pooled: bool) -> Result<(), RenderError> {
    let con = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let _start = lock_examples::ready_and_wait_for_start();
    let jobs: Vec<_> = (0..JOBS_PER_PROCESS)
        .map(|_| {
            let (con, busy) = (con.clone(), busy.to_owned());
            tokio::spawn(async move {
                if pooled {
                    render_on_pool(con, &busy).await
                } else {
                    render(con, &busy).await
                }
            })
        })
        .collect();
    let mut most = 0;
    for job in jobs {
        most = most.max(job.await.expect("job task")?);
    }
    println!("MOST {most}");
    Ok(())
}

/// Runs every job in `PROCESSES` worker processes; the most jobs seen running at once.
fn run_jobs(url: &str, busy: &str, pooled: bool) -> i64 {
    let pooled = if pooled { "1" } else { "0" };
    let mut workers = lock_examples::start_copies(
        (0..PROCESSES)
            .map(|_| {
                vec![
                    ("GPU_POOL_BUSY", busy.to_owned()),
                    ("GPU_POOL_POOLED", pooled.to_owned()),
                    ("LOCK_REDIS_URL", url.to_owned()),
                ]
            })
            .collect(),
    );
    lock_examples::start_all(&mut workers, "start");
    lock_examples::finish_copies(workers)
        .iter()
        .filter_map(|line| line.strip_prefix("MOST "))
        .map(|n| n.parse::<i64>().expect("a count"))
        .max()
        .expect("every worker reports")
}

#[tokio::main]
async fn main() {
    if let Ok(busy) = std::env::var("GPU_POOL_BUSY") {
        let url = std::env::var("LOCK_REDIS_URL").expect("set by the parent");
        let pooled = std::env::var("GPU_POOL_POOLED").as_deref() == Ok("1");
        if let Err(e) = worker(&url, &busy, pooled).await {
            eprintln!("worker {}: {e}", std::process::id());
            std::process::exit(1);
        }
        return;
    }

    let (_server, url) = lock_examples::redis_url();
    let run = std::process::id();
    println!(
        "{} render jobs in {PROCESSES} processes, {} ms each, on a pool of {GPUS} GPUs\n",
        PROCESSES * JOBS_PER_PROCESS,
        RENDER.as_millis()
    );
    // Blocking work (child processes): keep it off the async workers.
    let free_for_all = {
        let url = url.clone();
        tokio::task::spawn_blocking(move || run_jobs(&url, &format!("gpus:{run}:free"), false))
    }
    .await
    .unwrap();
    let pooled =
        tokio::task::spawn_blocking(move || run_jobs(&url, &format!("gpus:{run}:pooled"), true))
            .await
            .unwrap();
    println!("without a semaphore:  up to {free_for_all:>2} jobs on the pool at once");
    println!("with permits = {GPUS}:     up to {pooled:>2} jobs on the pool at once");
    if !(2..=GPUS).contains(&pooled) {
        println!(
            "\nCHECK FAILED: with permits = {GPUS} between 2 and {GPUS} jobs must share the pool; \
             saw {pooled}"
        );
        std::process::exit(1);
    }
    println!(
        "\nwith #[distributed_lock(key = \"gpu-pool:<busy>\", permits = {GPUS})]: never more \
         than {GPUS} at once, across every process."
    );
}
