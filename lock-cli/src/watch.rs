//! Watching one lock: poll `inspect` and print what changed.
//!
//! Taking a lock publishes nothing (only releases notify waiters), so polling is the one way to
//! see every transition in every mode. What a poll cannot see directly it infers: a lease that
//! grew was renewed, one that shrank early was kept for `min_hold`, and a fencing token that moved
//! while the lock looked free means someone took and released it between two looks.
//!
//! The server reads a lease when it answers, anywhere between the request and its answer: a
//! lease is compared with what the time between two reads can have left of it, bounded by the
//! round trips ([`Between`]), so a late answer (a loaded server or machine) is not taken for a
//! lease cut short, nor an early one for a renewal.

use std::time::Duration;

use lock_runtime::{LockInfo, Registry};
use tokio::time::{Instant, MissedTickBehavior};

use crate::render;

/// Slack for comparing two remaining leases: the servers round them to milliseconds (PTTL
/// down, Postgres up), and their clocks and ours tick at their own granularity.
const SLACK: Duration = Duration::from_millis(50);

/// How much time passed on the server between two reads of a lock, each made somewhere between
/// sending its request and receiving its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Between {
    /// From the first answer to the second request.
    pub least: Duration,
    /// From the first request to the second answer.
    pub most: Duration,
}

impl Between {
    /// Between a look sent and answered at `before` (`(sent, received)`) and one at `now`.
    #[must_use]
    pub fn looks(before: (Instant, Instant), now: (Instant, Instant)) -> Self {
        Self {
            least: now.0.saturating_duration_since(before.1),
            most: now.1.saturating_duration_since(before.0),
        }
    }
}

/// What one look found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Someone holds the lock.
    Held {
        /// The owner token.
        owner: String,
        /// The remaining lease (`None`: no expiry).
        remaining: Option<Duration>,
        /// The last fencing token.
        fence: Option<u64>,
    },
    /// Nobody holds it.
    Free {
        /// The last fencing token.
        fence: Option<u64>,
    },
    /// Redis did not answer.
    Unreachable(String),
}

impl From<LockInfo> for Seen {
    fn from(info: LockInfo) -> Self {
        match info.owner {
            Some(owner) => Self::Held {
                owner,
                remaining: info.remaining,
                fence: info.fence,
            },
            None => Self::Free { fence: info.fence },
        }
    }
}

fn held(owner: &str, remaining: Option<Duration>, fence: Option<u64>) -> String {
    let fence = fence.map(|f| format!(", fence {f}")).unwrap_or_default();
    let left = remaining.map_or_else(|| "no expiry".to_owned(), render::duration);
    format!("by {}{fence}, {left} left", render::owner(owner))
}

/// The line to print for going from `before` to `now`, read `elapsed` after the previous look;
/// `None` when nothing worth a line happened (a lease ticking down).
#[must_use]
pub fn change(before: Option<&Seen>, now: &Seen, elapsed: Between) -> Option<String> {
    use Seen::{Free, Held, Unreachable};
    let line = match (before, now) {
        (
            None | Some(Unreachable(_)),
            Held {
                owner,
                remaining,
                fence,
            },
        ) => {
            format!("held {}", held(owner, *remaining, *fence))
        }
        (None | Some(Unreachable(_)), Free { fence }) => match fence {
            Some(f) => format!("free (last fence {f})"),
            None => "free".to_owned(),
        },
        (Some(Unreachable(old)), Unreachable(error)) if old == error => return None,
        (_, Unreachable(error)) => format!("cannot read the lock: {error}"),
        (
            Some(Free { fence: old }),
            Held {
                owner,
                remaining,
                fence,
            },
        ) => {
            // A fence that moved by more than one means holders came and went unseen.
            let missed = match (old, fence) {
                (Some(old), Some(new)) if *new > old + 1 => {
                    format!(" ({} earlier holders came and went unseen)", new - old - 1)
                }
                _ => String::new(),
            };
            format!("taken {}{missed}", held(owner, *remaining, *fence))
        }
        (Some(Free { fence: old }), Free { fence }) => match (old, fence) {
            (Some(old), Some(new)) if new > old => {
                format!("taken and released between two looks (fence now {new})")
            }
            _ => return None,
        },
        (Some(Held { remaining, .. }), Free { .. }) => match remaining {
            // Gone while the lease still ran, however late the second read was.
            Some(left) if *left > elapsed.most + SLACK => "released".to_owned(),
            Some(_) => "expired".to_owned(),
            None => "deleted".to_owned(),
        },
        (
            Some(Held {
                owner: old,
                remaining: was,
                ..
            }),
            Held {
                owner,
                remaining,
                fence,
            },
        ) => {
            if old != owner {
                return Some(format!("taken over {}", held(owner, *remaining, *fence)));
            }
            let (Some(was), Some(left)) = (was, remaining) else {
                return None;
            };
            // Unchanged, it has between `was - most` and `was - least` left.
            if *left + elapsed.least > *was + SLACK {
                format!("renewed: {} left", render::duration(*left))
            } else if *left + elapsed.most + SLACK < *was {
                format!(
                    "lease cut short: {} left (kept for min_hold, or shortened by hand)",
                    render::duration(*left)
                )
            } else {
                return None;
            }
        }
    };
    Some(line)
}

/// Prints `key`'s changes every `every` until Ctrl-C, or until `until` has passed.
pub async fn watch(registry: &Registry, key: &str, every: Duration, until: Option<Duration>) {
    let started = Instant::now();
    let stop_at = until.map(|d| started + d);
    let ctrl_c = tokio::signal::ctrl_c();
    let mut ctrl_c = std::pin::pin!(ctrl_c);
    let mut ticks = tokio::time::interval(every.max(Duration::from_millis(1)));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // What the last look saw, and when its request went and its answer came.
    let mut last: Option<(Seen, (Instant, Instant))> = None;
    println!(
        "watching {} every {}; Ctrl-C stops",
        registry.redis_key(key),
        render::duration(every)
    );
    loop {
        tokio::select! {
            _ = &mut ctrl_c => return,
            () = sleep_until(stop_at) => return,
            _ = ticks.tick() => {}
        }
        let sent = Instant::now();
        let seen = match registry.inspect(key).await {
            Ok(info) => Seen::from(info),
            Err(e) => Seen::Unreachable(e.to_string()),
        };
        let look = (sent, Instant::now());
        let elapsed = last.as_ref().map_or(
            Between {
                least: Duration::ZERO,
                most: Duration::ZERO,
            },
            |(_, before)| Between::looks(*before, look),
        );
        if let Some(line) = change(last.as_ref().map(|(s, _)| s), &seen, elapsed) {
            println!("{:>9.3}s  {line}", (sent - started).as_secs_f64());
        }
        last = Some((seen, look));
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const A: &str = "web-1:7:aaaaaaaa0123456789abcdef01234567";
    const B: &str = "web-2:8:bbbbbbbb0123456789abcdef01234567";

    fn held_by(owner: &str, left_ms: u64, fence: u64) -> Seen {
        Seen::Held {
            owner: owner.to_owned(),
            remaining: Some(MS * u32::try_from(left_ms).unwrap()),
            fence: Some(fence),
        }
    }

    fn free(fence: u64) -> Seen {
        Seen::Free { fence: Some(fence) }
    }

    /// Two reads `ms` apart, answered at once.
    fn exactly(ms: u32) -> Between {
        Between {
            least: MS * ms,
            most: MS * ms,
        }
    }

    /// The second read sent `sent_ms` after the first was answered, and answered `late_ms`
    /// after it was sent.
    fn answered_late(sent_ms: u32, late_ms: u32) -> Between {
        Between {
            least: MS * sent_ms,
            most: MS * (sent_ms + late_ms),
        }
    }

    #[test]
    fn first_look_always_prints_the_state() {
        let line = change(None, &held_by(A, 4200, 3), exactly(0)).unwrap();
        assert_eq!(line, "held by web-1:7:aaaaaaaa…, fence 3, 4.2s left");
        assert_eq!(
            change(None, &free(3), exactly(0)).unwrap(),
            "free (last fence 3)"
        );
    }

    #[test]
    fn a_lease_ticking_down_prints_nothing() {
        let line = change(
            Some(&held_by(A, 4200, 3)),
            &held_by(A, 4100, 3),
            exactly(100),
        );
        assert_eq!(line, None);
    }

    #[test]
    fn a_lease_that_grew_was_renewed() {
        let line = change(
            Some(&held_by(A, 3000, 3)),
            &held_by(A, 4950, 3),
            exactly(100),
        );
        assert_eq!(line.unwrap(), "renewed: 5.0s left");
    }

    #[test]
    fn a_lease_cut_short_hints_at_min_hold() {
        let line = change(
            Some(&held_by(A, 3000, 3)),
            &held_by(A, 1000, 3),
            exactly(100),
        );
        assert!(line.unwrap().starts_with("lease cut short: 1.0s left"));
    }

    #[test]
    fn going_free_tells_release_from_expiry() {
        let released = change(Some(&held_by(A, 3000, 3)), &free(3), exactly(100));
        assert_eq!(released.unwrap(), "released");
        let expired = change(Some(&held_by(A, 80, 3)), &free(3), exactly(100));
        assert_eq!(expired.unwrap(), "expired");
    }

    /// Found on Postgres on a loaded machine: a read answered 700ms after it was sent saw the
    /// lease 700ms shorter than the time between the requests said.
    #[test]
    fn a_late_answer_is_not_a_lease_cut_short() {
        let line = change(
            Some(&held_by(A, 3000, 3)),
            &held_by(A, 2280, 3),
            answered_late(20, 700),
        );
        assert_eq!(line, None);
        // Shorter than even the latest answer allows: cut short.
        let line = change(
            Some(&held_by(A, 3000, 3)),
            &held_by(A, 2000, 3),
            answered_late(20, 700),
        );
        assert!(line.unwrap().starts_with("lease cut short: 2.0s left"));
    }

    /// The first read answered late, read at once: the second, sent when it came, finds the lease
    /// barely changed, which is no renewal.
    #[test]
    fn a_late_earlier_answer_is_not_a_renewal() {
        let slow_first = Between {
            least: MS,
            most: 701 * MS,
        };
        let line = change(Some(&held_by(A, 3000, 3)), &held_by(A, 2999, 3), slow_first);
        assert_eq!(line, None);
    }

    /// Gone before the lease could have run out, however late the second answer: released;
    /// gone when it may have run out: expired.
    #[test]
    fn a_late_answer_tells_release_from_expiry_by_the_latest_read() {
        let released = change(Some(&held_by(A, 800, 3)), &free(3), answered_late(20, 700));
        assert_eq!(released.unwrap(), "released");
        let expired = change(Some(&held_by(A, 700, 3)), &free(3), answered_late(20, 700));
        assert_eq!(expired.unwrap(), "expired");
    }

    #[test]
    fn a_new_owner_is_a_takeover() {
        let line = change(
            Some(&held_by(A, 3000, 3)),
            &held_by(B, 5000, 4),
            exactly(100),
        );
        assert_eq!(
            line.unwrap(),
            "taken over by web-2:8:bbbbbbbb…, fence 4, 5.0s left"
        );
    }

    #[test]
    fn fences_reveal_holders_between_two_looks() {
        let line = change(Some(&free(3)), &free(4), exactly(100));
        assert_eq!(
            line.unwrap(),
            "taken and released between two looks (fence now 4)"
        );
        let line = change(Some(&free(3)), &held_by(B, 5000, 6), exactly(100));
        assert_eq!(
            line.unwrap(),
            "taken by web-2:8:bbbbbbbb…, fence 6, 5.0s left (2 earlier holders came and went unseen)"
        );
    }

    #[test]
    fn the_same_error_twice_prints_once() {
        let down = Seen::Unreachable("connection refused".into());
        assert!(change(Some(&free(1)), &down, exactly(1)).is_some());
        assert_eq!(change(Some(&down), &down, exactly(1)), None);
        assert_eq!(
            change(Some(&down), &free(1), exactly(1)).unwrap(),
            "free (last fence 1)"
        );
    }
}
