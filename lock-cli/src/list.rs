//! `lockctl list`: the held locks under a key prefix, one row each, or those of one owner, the
//! longest queues or the oldest holders, as a table or as JSON.

use std::time::Instant;

use futures_util::StreamExt;
use lock_runtime::{LockError, LockInfo, Registry};
use serde_json::json;

use crate::scan::{self, Found};
use crate::target::Target;
use crate::{json, render, Failure};

const INSPECT_AT_ONCE: usize = 32;

/// Which of the held locks to list, and how.
#[derive(Debug, Default)]
pub struct Listing {
    /// Only those held by this owner (see [`render::owned_by`]).
    pub owner: Option<String>,
    /// Only those with callers queued, the longest queue first.
    pub queued: bool,
    /// Only those whose time held is known, the longest held first.
    pub oldest: bool,
    /// At most this many rows.
    pub top: Option<usize>,
    /// JSON for scripts instead of a table.
    pub json: bool,
}

/// A key the scan found, read through the registry.
struct Lock {
    key: String,
    found: Found,
    info: Result<LockInfo, LockError>,
    /// When the answer came: a time held is as of then.
    answered: Instant,
}

/// Lists the locks whose key starts with `key_prefix` that `listing` asks for: the keys come
/// from a scan of every node, their state from `Registry::inspect` (so Redlock rows show the
/// majority's owner).
///
/// # Errors
/// When no node could be scanned.
pub async fn list(
    target: &Target,
    registry: &Registry,
    key_prefix: &str,
    listing: &Listing,
) -> Result<(), Failure> {
    let under = registry.redis_key(key_prefix);
    let scan = scan::scan(target, &under).await?;
    for failed in &scan.failed {
        eprintln!("warning: could not scan {failed}");
    }
    let redlock = matches!(target, Target::Redlock(_));
    // A few inspections in flight at once: thousands of locks would otherwise cost thousands
    // of sequential round trips; a few dozen keep the server's load negligible.
    let mut locks: Vec<Lock> = futures_util::stream::iter(&scan.keys)
        .map(|found| read(registry, found))
        .buffered(INSPECT_AT_ONCE)
        .collect()
        .await;
    // Released since the scan saw them; on Redlock, a key on a minority of nodes is shown as
    // held by no majority.
    locks.retain(|l| {
        redlock
            || l.info
                .as_ref()
                .map_or(true, |info| render::holder(info).is_some())
    });
    if let Some(who) = &listing.owner {
        locks.retain(|l| match &l.info {
            Ok(info) => render::held_by(info, who),
            Err(e) => {
                eprintln!("warning: could not read {}: {e}", l.found.redis_key);
                false
            }
        });
    }
    arrange(&mut locks, listing, Instant::now());
    if listing.json {
        let rows: Vec<_> = locks
            .iter()
            .map(|l| {
                let mut row = match &l.info {
                    Ok(info) => json::lock(&l.key, &l.found.redis_key, info),
                    Err(e) => json!({
                        "key": l.key, "store_key": l.found.redis_key, "error": e.to_string()
                    }),
                };
                if redlock {
                    row["nodes"] = json!({ "with_key": l.found.nodes, "of": target.urls().len() });
                }
                row
            })
            .collect();
        let out = json!({ "under": under, "locks": rows, "unscanned": scan.failed });
        println!("{out}");
        return Ok(());
    }
    let mut what = match (&listing.owner, listing.queued) {
        (Some(who), false) => format!(" held by {who}"),
        (Some(who), true) => format!(" held by {who} with callers queued"),
        (None, true) => " with callers queued".to_owned(),
        (None, false) => String::new(),
    };
    if listing.oldest {
        what.push_str(" whose time held is known");
    }
    if locks.is_empty() {
        println!("no locks{what} under {under}");
        return Ok(());
    }
    let mut header = vec!["KEY", "OWNER", "HELD", "TTL", "FENCE", "QUEUE"];
    if redlock {
        header.push("NODES");
    }
    let mut rows = vec![header.into_iter().map(str::to_owned).collect::<Vec<_>>()];
    rows.extend(
        locks
            .iter()
            .map(|l| row(l, redlock.then(|| target.urls().len()))),
    );
    print!("{}", render::table(&rows));
    let nodes = match target {
        Target::Redlock(urls) => format!(" on {} of {} nodes", scan.scanned, urls.len()),
        Target::Cluster(_) => format!(" on {} masters", scan.scanned),
        Target::Sentinel { .. } => format!(
            " on {}, the master the sentinels name",
            scan.master.as_deref().unwrap_or("?")
        ),
        _ => String::new(),
    };
    let shown = locks.len();
    println!(
        "{shown} lock{}{what} under {under}{nodes}",
        if shown == 1 { "" } else { "s" }
    );
    Ok(())
}

async fn read(registry: &Registry, found: &Found) -> Lock {
    let key = found
        .redis_key
        .strip_prefix(registry.prefix())
        .unwrap_or(&found.redis_key)
        .to_owned();
    let info = registry.inspect(&key).await;
    Lock {
        key,
        found: found.clone(),
        info,
        answered: Instant::now(),
    }
}

/// The rows `listing` asks for, in its order, with every time held as of `now` (see
/// [`held_as_of`]): only the locks with callers queued, the longest queue first, or those
/// whose time held is known, the oldest holder first; at most `top` of them.
fn arrange(locks: &mut Vec<Lock>, listing: &Listing, now: Instant) {
    held_as_of(locks, now);
    if listing.queued {
        locks.retain(|l| l.info.as_ref().is_ok_and(|info| info.waiters > 0));
        // Stable: ties stay in key order.
        locks.sort_by_key(|l| std::cmp::Reverse(l.info.as_ref().map_or(0, |i| i.waiters)));
    }
    if listing.oldest {
        let held_for = |l: &Lock| l.info.as_ref().ok().and_then(|i| i.held_for);
        locks.retain(|l| held_for(l).is_some());
        locks.sort_by_key(|l| std::cmp::Reverse(held_for(l)));
    }
    if let Some(top) = listing.top {
        locks.truncate(top);
    }
}

/// Brings every time held to one moment, `now`: each was measured when its lock was read, and
/// a lock read later would otherwise count the scan's time as held, and could pass an older one.
/// At most by the lease that was left when it was read: past that, the lock may have ended.
fn held_as_of(locks: &mut [Lock], now: Instant) {
    for lock in locks {
        if let Ok(LockInfo {
            held_for: Some(held),
            remaining,
            ..
        }) = &mut lock.info
        {
            let since_read = now.saturating_duration_since(lock.answered);
            *held += remaining.map_or(since_read, |left| since_read.min(left));
        }
    }
}

/// One row. `redlock_nodes` is the node count in Redlock mode.
fn row(lock: &Lock, redlock_nodes: Option<usize>) -> Vec<String> {
    let mut row = vec![lock.key.clone()];
    match &lock.info {
        Ok(info) => {
            let owner = render::holder(info).unwrap_or_else(|| "(no majority)".to_owned());
            row.extend([
                owner,
                render::held(info),
                render::remaining(info),
                render::fence(info),
                info.waiters.to_string(),
            ]);
        }
        // Something else under the prefix (not a string, a stray brace in a cluster): show it
        // rather than hide it.
        Err(e) => row.extend([
            format!("error: {e}"),
            "-".to_owned(),
            "-".to_owned(),
            "-".to_owned(),
            "-".to_owned(),
        ]),
    }
    if let Some(total) = redlock_nodes {
        row.push(format!("{}/{total}", lock.found.nodes));
    }
    row
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn read_at(key: &str, held_ms: u64, answered: Instant) -> Lock {
        let mut info = LockInfo::default();
        info.held_for = Some(Duration::from_millis(held_ms));
        info.remaining = Some(Duration::from_secs(30));
        Lock {
            key: key.to_owned(),
            found: Found {
                redis_key: key.to_owned(),
                nodes: 1,
            },
            info: Ok(info),
            answered,
        }
    }

    fn held_ms(lock: &Lock) -> u128 {
        lock.info.as_ref().unwrap().held_for.unwrap().as_millis()
    }

    #[test]
    fn the_oldest_holder_comes_first_as_of_one_moment_not_as_each_lock_was_read() {
        let start = Instant::now();
        // Taken 100 ms before the first read; the second lock, taken 30 ms after it, was read
        // 50 ms later, when it had been held 120 ms.
        let mut locks = vec![
            read_at("late", 120, start + Duration::from_millis(50)),
            read_at("early", 100, start),
        ];
        let oldest = Listing {
            oldest: true,
            top: Some(1),
            ..Listing::default()
        };
        arrange(&mut locks, &oldest, start + Duration::from_millis(60));
        let keys: Vec<&str> = locks.iter().map(|l| l.key.as_str()).collect();
        assert_eq!(keys, ["early"]);
        assert_eq!(held_ms(&locks[0]), 160);
    }

    #[test]
    fn a_time_held_grows_after_its_read_by_no_more_than_the_lease_left() {
        let start = Instant::now();
        let mut lock = read_at("ended", 100, start);
        if let Ok(info) = &mut lock.info {
            info.remaining = Some(Duration::from_millis(2_000));
        }
        let mut locks = [lock, read_at("held", 100, start)];
        held_as_of(&mut locks, start + Duration::from_secs(25));
        assert_eq!(
            held_ms(&locks[0]),
            2_100,
            "it may have ended with its lease"
        );
        assert_eq!(held_ms(&locks[1]), 25_100);
    }
}
