//! Renewing a batch of locks and places: `renew.lua`.

use super::call::{Call, Script};
use crate::backend::contract::{Renewal, Renewed};
use crate::names;

/// `KEYS` the locks, then the fencing counter of each fenced one in the same order; `ARGV`
/// token, ttl ms, fencing token (`0`: not fenced) and how long the lock has been held in ms
/// (`-`: not noted this time) for each lock in turn. One script call
/// renews a whole batch: the keeper sends one command per batch instead of one per lock.
/// Returns per lock 1 (renewed), 0 (no such key: expired or deleted; of a semaphore: no live
/// permit of ours) or -1 (someone else's value); a lock that is no longer ours is never
/// touched. A permit's deadline moves to now + ttl, and the set's expiry to its last live
/// deadline. A renewed fenced lock's counter is kept a day beyond the lease (written about
/// twice a day) and put back at the holder's token if it is gone: it names the holder's term
/// for as long as the lock is held. A renewal that says how long the lock has been held writes
/// it beside the lock for inspections, or keeps what it wrote (`held_key` in the prelude).
pub const RENEW_LUA: &str = concat!(include_str!("prelude.lua"), include_str!("renew.lua"));

static SCRIPT: Script = Script::new(RENEW_LUA);

/// The script's call renewing `locks` (positions in `batch`).
pub(crate) fn call(batch: &[Renewal<'_>], locks: impl Iterator<Item = usize> + Clone) -> Call {
    let fences: Vec<String> = locks
        .clone()
        .filter(|&i| batch[i].fence.is_some())
        .map(|i| names::fence(batch[i].key))
        .collect();
    let keys: Vec<&str> = locks
        .clone()
        .map(|i| batch[i].key.stored.as_str())
        .chain(fences.iter().map(String::as_str))
        .collect();
    locks.fold(Call::new(&SCRIPT, &keys), |call, i| {
        let lock = &batch[i];
        let call = call
            .arg(lock.token)
            .arg(lock.ttl_ms)
            .arg(lock.fence.unwrap_or(0));
        match lock.note_held {
            Some(ms) => call.arg(ms),
            None => call.arg("-"),
        }
    })
}

/// What the script found for one lock: its flag 1 (renewed), 0 (gone) or -1 (someone else's).
pub(crate) fn renewed(flag: i64) -> Renewed {
    match flag {
        1 => Renewed::Yes,
        0 => Renewed::Gone,
        _ => Renewed::Taken,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_flag_of_the_script_is_read() {
        assert_eq!(renewed(1), Renewed::Yes);
        assert_eq!(renewed(0), Renewed::Gone);
        // Anyone else's, a sorted set that is not ours or its place ran out: never renewed.
        assert_eq!(renewed(-1), Renewed::Taken);
    }
}
