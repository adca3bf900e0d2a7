//! `lockctl leader`: who leads an election (`Registry::election`), once or as it changes.
//!
//! Following uses the library's observer: woken by the election's notifications (a leader
//! elected, resigning, handing over) and by the end of the leader's lease, so it sends nothing
//! while nothing changes, unlike `watch`, which polls any lock.

use std::time::Duration;

use lock_runtime::{Election, Leader, Registry};
use tokio::time::Instant;

use crate::render;
use crate::Failure;

/// The line that says who leads.
#[must_use]
pub fn line(leader: Option<&Leader>) -> String {
    match leader {
        None => "no leader".to_owned(),
        Some(leader) => {
            let term = leader
                .term
                .map(|t| format!(", term {t}"))
                .unwrap_or_default();
            let led = leader
                .led_for
                .map(|d| format!(", leading for {}", render::duration(d)))
                .unwrap_or_default();
            let left = leader
                .remaining
                .map_or_else(|| "no expiry".to_owned(), render::duration);
            format!("leader {}{term}{led}, {left} left", leader.identity)
        }
    }
}

/// Prints who leads `key` now, and the candidates in line after it, the next first (those a
/// leader can hand its term to: `Election::hand_over`), and those standing aside in their
/// places (`Election::stand_aside`); as one JSON object with `json`.
pub async fn show(registry: &Registry, key: &str, json: bool) -> Result<(), Failure> {
    let election = registry.election(key);
    let leader = election.leader().await?;
    let candidates = election.in_line().await?;
    let aside = election.standing_aside().await?;
    if json {
        println!(
            "{}",
            crate::json::leader(key, leader.as_ref(), &candidates, &aside)
        );
        return Ok(());
    }
    println!("{}", line(leader.as_ref()));
    if !candidates.is_empty() {
        println!("in line: {}", candidates.join(", "));
    }
    if !aside.is_empty() {
        println!("standing aside: {}", aside.join(", "));
    }
    Ok(())
}

/// Prints who leads `key`, then a line per change, until Ctrl-C or until `until` has passed.
/// An error (Redis unreachable) is printed once and observing goes on.
pub async fn watch(registry: &Registry, key: &str, until: Option<Duration>) -> Result<(), Failure> {
    let election: Election = registry.election(key);
    // Fail fast on a bad key, an unreachable Redis or a lock's key.
    election.leader().await?;
    let started = Instant::now();
    let stop_at = until.map(|d| started + d);
    let ctrl_c = tokio::signal::ctrl_c();
    let mut ctrl_c = std::pin::pin!(ctrl_c);
    let mut observer = election.observe();
    println!(
        "following the election {}; Ctrl-C stops",
        registry.redis_key(key)
    );
    let mut last_error = None;
    loop {
        let next = tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            () = sleep_until(stop_at) => return Ok(()),
            next = observer.next() => next,
        };
        let shown = match next {
            Ok(leader) => {
                last_error = None;
                line(leader.as_ref())
            }
            Err(error) => {
                let error = error.to_string();
                if last_error.as_ref() == Some(&error) {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                last_error = Some(error.clone());
                format!("cannot read the election: {error}")
            }
        };
        println!("{:>9.3}s  {shown}", started.elapsed().as_secs_f64());
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
