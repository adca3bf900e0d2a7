//! Renewing a batch of locks and places: `renew.lua`.

use super::call::{Call, Script};
use crate::backend::contract::{Renewal, Renewed};

/// `KEYS` locks; `ARGV` token and ttl ms for each key in turn. One script call renews a whole
/// batch: the keeper sends one command per batch instead of one per lock. Returns per key 1
/// (renewed), 0 (no such key: expired or deleted; of a semaphore: no live permit of ours) or -1
/// (someone else's value); a lock that is no longer ours is never touched. A permit's deadline
/// moves to now + ttl, and the set's expiry to its last live deadline.
pub const RENEW_LUA: &str = concat!(include_str!("prelude.lua"), include_str!("renew.lua"));

static SCRIPT: Script = Script::new(RENEW_LUA);

/// The script's call renewing `locks` (positions in `batch`).
pub(crate) fn call(batch: &[Renewal<'_>], locks: impl Iterator<Item = usize> + Clone) -> Call {
    let keys: Vec<&str> = locks.clone().map(|i| batch[i].redis_key).collect();
    locks.fold(Call::new(&SCRIPT, &keys), |call, i| {
        call.arg(batch[i].token).arg(batch[i].ttl_ms)
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
