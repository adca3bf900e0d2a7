//! The design card's example, run by three replica processes racing for the same deploys.
//!
//! `./scripts/demo` (or `cargo run --release -p lock-examples --example deploy`). Without
//! `LOCK_REDIS_URL`/`REDIS_URL` it starts a throwaway redis-server. Each replica deploys
//! environments 1 and 2; every deploy takes three lease lengths, so the lease keeper must renew
//! it. The parent prints the merged timeline and checks that no two replicas ever deployed the
//! same id at once and that fencing tokens only grew.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{distributed_lock, LockError};

#[derive(Debug, thiserror::Error)]
enum DeployError {
    #[error(transparent)]
    Lock(#[from] LockError),
}

const STEP: Duration = Duration::from_millis(400);

/// The whole integration: one attribute.
#[distributed_lock(key = "deploy:<id>", ttl = "500ms", wait = "30s", fencing = true)]
async fn deploy(id: u64, replica: u32) -> Result<u64, DeployError> {
    let lock = lock_runtime::current().expect("inside a locked fn");
    let fence = lock.fence().expect("fencing = true");
    event(replica, id, "start", fence, "");
    for step in 1..=3 {
        tokio::time::sleep(STEP).await;
        let registry = lock_runtime::registry()?;
        let left = registry
            .inspect(lock.key())
            .await?
            .remaining
            .unwrap_or_default();
        event(
            replica,
            id,
            "renewed",
            fence,
            &format!(
                "step {step}/3, lease has {} ms left of 500",
                left.as_millis()
            ),
        );
    }
    event(replica, id, "done", fence, "");
    Ok(fence)
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// One line per event on stdout; the parent merges them.
fn event(replica: u32, id: u64, what: &str, fence: u64, detail: &str) {
    println!("EVENT {} {replica} {id} {what} {fence} {detail}", now_us());
}

#[tokio::main]
async fn main() {
    if let Ok(replica) = std::env::var("DEPLOY_REPLICA") {
        let replica: u32 = replica.parse().expect("replica number");
        // Replicas start at different ids so they contend from the first moment.
        let ids = if replica.is_multiple_of(2) {
            [1, 2]
        } else {
            [2, 1]
        };
        for id in ids {
            if let Err(e) = deploy(id, replica).await {
                eprintln!("replica {replica}: deploy {id} failed: {e}");
                std::process::exit(1);
            }
        }
        return;
    }

    let (_server, url) = lock_examples::redis_url();
    let started = now_us();
    let replicas: Vec<_> = (1..=3)
        .map(|r| {
            Command::new(std::env::current_exe().unwrap())
                .env("DEPLOY_REPLICA", r.to_string())
                .env("LOCK_REDIS_URL", &url)
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a replica")
        })
        .collect();
    let mut events = Vec::new();
    for mut child in replicas {
        let out = BufReader::new(child.stdout.take().unwrap());
        for line in out.lines().map_while(Result::ok) {
            let parts: Vec<&str> = line.splitn(7, ' ').collect();
            if parts.len() >= 6 && parts[0] == "EVENT" {
                events.push((
                    parts[1].parse::<u128>().unwrap(),
                    parts[2].parse::<u32>().unwrap(),
                    parts[3].parse::<u64>().unwrap(),
                    parts[4].to_owned(),
                    parts[5].parse::<u64>().unwrap(),
                    parts.get(6).copied().unwrap_or("").to_owned(),
                ));
            }
        }
        assert!(child.wait().unwrap().success(), "a replica failed");
    }
    // Stable, by time only: each replica's events keep the order it printed them in.
    events.sort_by_key(|e| e.0);

    println!("\n   time  replica  lock                  fence  event");
    for (at, replica, id, what, fence, detail) in &events {
        println!(
            "{:>6.2}s  {replica:>7}  deploy:{id}  {fence:>16}  {what} {detail}",
            (at - started) as f64 / 1e6
        );
    }

    // The checks the demo exists to show.
    let mut holder: BTreeMap<u64, Option<u32>> = BTreeMap::new();
    let mut last_fence: BTreeMap<u64, u64> = BTreeMap::new();
    for (_, replica, id, what, fence, _) in &events {
        let slot = holder.entry(*id).or_default();
        match what.as_str() {
            "start" => {
                assert!(slot.is_none(), "two replicas deployed {id} at once");
                *slot = Some(*replica);
                let last = last_fence.entry(*id).or_default();
                assert!(fence > last, "fencing token went backwards on deploy:{id}");
                *last = *fence;
            }
            "done" => *slot = None,
            _ => assert_eq!(*slot, Some(*replica), "an event outside the holder's lease"),
        }
    }
    let starts = events.iter().filter(|e| e.3 == "start").count();
    println!(
        "\n{starts} deploys by 3 replicas: one holder per id at a time, fencing tokens increasing, \
         every 1.2 s deploy outlived its 500 ms lease thanks to renewal."
    );
}
