//! Letting go of a token: a release, or a waiter leaving the queue: `release.lua`.

use super::call::{locking, Call, Script};
use crate::key::LockKey;

/// `KEYS` as for [`ACQUIRE_LUA`](super::ACQUIRE_LUA); `ARGV[1]` token, `ARGV[2]` the publish
/// command, `ARGV[3]` `1` when the token is one that waiters mark and not a candidate's
/// (optional: see `marks::silent_when_bare`), `ARGV[4]` the identity of a candidate to hand
/// the lock to ahead of the others where it is in line (optional: an election's hand-over;
/// then 3 is returned when it went to that candidate). Lets go of
/// the token: takes it out of the waiters' queue, and if it holds the lock, hands the lock to
/// the oldest live waiter or deletes it; of readers or a semaphore (a sorted set, see
/// [`ACQUIRE_LUA`](super::ACQUIRE_LUA)), removes the token's place, and with the last live one gone deletes the set
/// and hands the lock to the oldest live waiter if any. A waiter for the whole lock that leaves
/// the queue of a shared or free key publishes, so whoever it held off may enter. `pcall` so a key
/// of another type reads as "not ours" instead of an error. A value that is the bare token of
/// a kind waiters mark (nobody waited for it: see `WAITED` in `prelude.lua`) is deleted with no
/// look at the queue and no message. Returns 1 when the lock was deleted, 2 when it was handed
/// over, 0 when it was not ours.
///
/// It publishes on the lock's channel: `<released>` when the lock is now free, and
/// `<released>:<next>:<fence>:<place>` when it went to a waiter, where each name is the SHA-1 of
/// a token (it names a tenure without handing out the token itself), the fence is the new
/// holder's fencing token (0 without fencing) and the place the waiter's attempt that kept the
/// place the lock went to (a waiter trusts a handoff only for a place no later attempt of its
/// own found taken). The waiter learns from the message alone that it holds the
/// lock, and others that it is not free. A release that several Redlock nodes publish wakes one
/// waiter per process, not one per node.
pub const RELEASE_LUA: &str = concat!(
    include_str!("release_head.lua"),
    include_str!("prelude.lua"),
    include_str!("queue.lua"),
    include_str!("release.lua")
);

static SCRIPT: Script = Script::new(RELEASE_LUA);

/// `KEYS[i]` held by `ARGV[i]`, each a token that waiters mark: deletes each lock whose value is
/// the bare token, and answers 1 for it, 0 for the others (which [`RELEASE_LUA`] then
/// releases). One call for the releases of a whole batch (`coalesce.rs`) on a server without
/// `DELIFEQ`.
pub const RELEASE_BARE_LUA: &str = include_str!("release_bare.lua");

static BARE: Script = Script::new(RELEASE_BARE_LUA);

/// The script's call letting go of `token` on `key`, naming the waiters' queue when `queued`,
/// publishing with `publish`.
pub(crate) fn call(key: &LockKey, token: &str, queued: bool, publish: &str) -> Call {
    locking(&SCRIPT, key, queued, false)
        .arg(token)
        .arg(publish)
        .arg(if super::marks::silent_when_bare(token) {
            "1"
        } else {
            "0"
        })
}

/// The script's call letting `token` go of `key`, handing the lock to the candidate that
/// campaigns as `successor` where it is in line (the queue named).
pub(crate) fn call_to(key: &LockKey, token: &str, publish: &str, successor: &str) -> Call {
    locking(&SCRIPT, key, true, false)
        .arg(token)
        .arg(publish)
        .arg("0")
        .arg(successor)
}

/// Whether the reply to [`call_to`] says the lock went to the successor (`Some(true)`), to
/// someone else or nobody (`Some(false)`), or was not ours (`None`).
pub(crate) fn released_to(reply: i64) -> Option<bool> {
    released(reply).then_some(reply == 3)
}

/// One call of [`RELEASE_BARE_LUA`] for `locks` (lock key, token).
pub(crate) fn bare<'a>(locks: impl Iterator<Item = (&'a str, &'a str)> + Clone) -> redis::Cmd {
    let keys: Vec<&str> = locks.clone().map(|(key, _)| key).collect();
    let mut call = Call::new(&BARE, &keys);
    for (_, token) in locks {
        call = call.arg(token);
    }
    call.cmd()
}

/// [`RELEASE_BARE_LUA`]'s reply, one answer per lock: 1 deleted, 0 left to the release script.
pub(crate) fn bare_replies(reply: redis::Value, locks: usize) -> redis::RedisResult<Vec<i64>> {
    let replies: Vec<i64> = redis::from_redis_value(reply)?;
    if replies.len() != locks {
        return Err((
            redis::ErrorKind::Parse,
            "the release script answered for another number of locks",
            format!("{} answers for {locks} locks", replies.len()),
        )
            .into());
    }
    Ok(replies)
}

/// `DELIFEQ key token` (Valkey 9+), which stands in for the script where nobody waited for the
/// lock: it deletes the bare token, and refuses (0) a value marked as waited for, which the
/// script then releases, handing over and waking.
pub(crate) fn delifeq(key: &LockKey, token: &str) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(3, 16 + key.stored.len() + token.len());
    cmd.arg("DELIFEQ").arg(&key.stored).arg(token);
    cmd
}

/// Whether the reply (the script's, or `DELIFEQ`'s) says the token held the lock (deleted, or
/// handed over).
pub(crate) fn released(reply: i64) -> bool {
    reply > 0
}
