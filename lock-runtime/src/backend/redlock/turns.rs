//! Turns: this registry's attempts on a key go one at a time, and never overlap a release of
//! the key from here.
//!
//! Two attempts that race each other to the nodes can split the vote (each wins a minority),
//! and an attempt that crosses a release finds the lock free on some nodes and still held on
//! others. Either way the nodes that answered decide nothing, and the attempt waits for the
//! silent ones, up to the per-node timeout: with a node down, each such round costs that
//! timeout. Contenders in other processes can still split the vote (Redlock's random pause is
//! for them); those of one registry need not. A release waits only for the attempt on its way,
//! and only until that attempt has heard from a majority (the rest are stragglers); an attempt
//! waits for its turn no longer than its caller waits (see `Redlock::acquire`); a release holds
//! attempts back only until it is settled on a quorum.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

use crate::key::LockKey;

/// Each key's turn, while anyone here attempts or releases it.
#[derive(Default)]
pub(super) struct Turns(Arc<Mutex<HashMap<String, Turn>>>);

#[derive(Default)]
struct Turn {
    attempting: bool,
    /// The attempt on its way has not heard from a majority yet: releases wait for it.
    holding_releases: bool,
    /// Releases on their way, or waiting for the attempt to come back first.
    releasing: usize,
    /// Told whenever the two above change.
    changed: Arc<Notify>,
}

/// The right to send one attempt on a lock's keys.
pub(super) struct AttemptTurn {
    turns: Arc<Mutex<HashMap<String, Turn>>>,
    names: Vec<String>,
}

/// A release on its way: attempts on its keys wait until it is back.
pub(super) struct Releasing {
    turns: Arc<Mutex<HashMap<String, Turn>>>,
    names: Vec<String>,
}

fn map(turns: &Mutex<HashMap<String, Turn>>) -> MutexGuard<'_, HashMap<String, Turn>> {
    turns.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The stored names of every key of `key` (a multi-key lock's are its members).
fn names(key: &LockKey) -> Vec<String> {
    key.keys().iter().map(|k| k.channel().to_owned()).collect()
}

impl Turns {
    /// Waits until no attempt nor release of any of `key`'s keys is on its way from here, and
    /// takes the turn on all of them at once.
    pub(super) async fn attempt(&self, key: &LockKey) -> AttemptTurn {
        let names = names(key);
        loop {
            let changed = {
                let mut turns = map(&self.0);
                let busy = names.iter().find_map(|name| {
                    turns
                        .get(name)
                        .filter(|t| t.attempting || t.releasing > 0)
                        .map(|t| registered(&t.changed))
                });
                let Some(changed) = busy else {
                    for name in &names {
                        let turn = turns.entry(name.clone()).or_default();
                        (turn.attempting, turn.holding_releases) = (true, true);
                    }
                    return AttemptTurn {
                        turns: self.0.clone(),
                        names,
                    };
                };
                changed
            };
            changed.await;
        }
    }

    /// Marks a release of `key` on its way (later attempts wait for it), and waits for the
    /// attempt already on its way, if any, until it has heard from a majority.
    pub(super) async fn releasing(&self, key: &LockKey) -> Releasing {
        let names = names(key);
        {
            let mut turns = map(&self.0);
            for name in &names {
                turns.entry(name.clone()).or_default().releasing += 1;
            }
        }
        // Dropped midway, it takes its mark back.
        let releasing = Releasing {
            turns: self.0.clone(),
            names,
        };
        loop {
            let attempting = {
                let turns = map(&self.0);
                releasing.names.iter().find_map(|name| {
                    turns
                        .get(name)
                        .filter(|t| t.attempting && t.holding_releases)
                        .map(|t| registered(&t.changed))
                })
            };
            match attempting {
                Some(changed) => changed.await,
                None => return releasing,
            }
        }
    }
}

/// A wait for `changed`, registered at once: called under the map's lock, where the state was
/// read and where every change is made, so no change between the two goes unnoticed.
fn registered(changed: &Arc<Notify>) -> Pin<Box<OwnedNotified>> {
    let mut notified = Box::pin(changed.clone().notified_owned());
    notified.as_mut().enable();
    notified
}

/// Applies `change` to each named turn, wakes its waiters, and takes idle turns out.
fn update(turns: &Mutex<HashMap<String, Turn>>, names: &[String], change: impl Fn(&mut Turn)) {
    let mut turns = map(turns);
    for name in names {
        let Some(turn) = turns.get_mut(name) else {
            continue;
        };
        change(turn);
        turn.changed.notify_waiters();
        if !turn.attempting && turn.releasing == 0 {
            turns.remove(name);
        }
    }
}

impl AttemptTurn {
    /// The attempt heard from a majority: what is left are stragglers, which a release that
    /// crosses it can meet without leaving the attempt undecided on the nodes that answered.
    pub(super) fn let_releases_pass(&self) {
        update(&self.turns, &self.names, |t| t.holding_releases = false);
    }
}

impl Drop for AttemptTurn {
    fn drop(&mut self) {
        update(&self.turns, &self.names, |t| {
            (t.attempting, t.holding_releases) = (false, false);
        });
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        update(&self.turns, &self.names, |t| t.releasing -= 1);
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use futures_util::FutureExt;

    use super::*;

    fn key(name: &str) -> LockKey {
        LockKey::new("lock:", name.to_owned()).unwrap()
    }

    fn held(turns: &Turns) -> usize {
        map(&turns.0).len()
    }

    #[tokio::test]
    async fn one_attempt_at_a_time_and_none_across_a_release() {
        let turns = Turns::default();
        let (a, b) = (key("a"), key("b"));
        let first = turns.attempt(&a).await;
        let other_key = turns.attempt(&b).await;
        let mut second = pin!(turns.attempt(&a));
        assert!(
            second.as_mut().now_or_never().is_none(),
            "a second attempt on the key waits for the first"
        );
        let mut releasing = pin!(turns.releasing(&a));
        assert!(
            releasing.as_mut().now_or_never().is_none(),
            "a release waits for the attempt on its way"
        );
        drop(first);
        let released = releasing.await;
        assert!(
            second.as_mut().now_or_never().is_none(),
            "an attempt queued before the release waits for it too"
        );
        drop(released);
        drop(second.await);
        drop(other_key);
        assert_eq!(held(&turns), 0, "the last one out takes the key's turn out");
    }

    #[tokio::test]
    async fn a_release_passes_an_attempt_that_heard_from_a_majority() {
        let turns = Turns::default();
        let a = key("a");
        let attempt = turns.attempt(&a).await;
        let mut releasing = pin!(turns.releasing(&a));
        assert!(releasing.as_mut().now_or_never().is_none());
        attempt.let_releases_pass();
        let released = releasing.await;
        let mut next = pin!(turns.attempt(&a));
        drop(attempt);
        assert!(
            next.as_mut().now_or_never().is_none(),
            "attempts still go one at a time, and none crosses the release"
        );
        drop(released);
        drop(next.await);
        assert_eq!(held(&turns), 0);
    }

    #[tokio::test]
    async fn a_release_dropped_while_it_waits_takes_its_mark_back() {
        let turns = Turns::default();
        let a = key("a");
        let attempt = turns.attempt(&a).await;
        assert!(turns.releasing(&a).now_or_never().is_none());
        drop(attempt);
        drop(
            turns
                .attempt(&a)
                .now_or_never()
                .expect("nothing on its way"),
        );
        assert_eq!(held(&turns), 0);
    }

    #[tokio::test]
    async fn a_multi_key_lock_takes_the_turn_on_each_of_its_keys() {
        let turns = Turns::default();
        let both = LockKey::many("lock:", vec!["b".to_owned(), "a".to_owned()]).unwrap();
        let b = key("b");
        let one = turns.attempt(&b).await;
        let mut all = pin!(turns.attempt(&both));
        assert!(all.as_mut().now_or_never().is_none());
        drop(one);
        drop(all.await);
        assert_eq!(held(&turns), 0);
    }
}
