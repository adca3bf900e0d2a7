//! Taking a lock, a reader's place or a permit (and queueing when busy): `acquire.lua`.

use std::time::Duration;

use redis::Value;

use super::call::{locking, Call, Script};
use crate::backend::contract::{ttl_ms, Acquire, Attempt, Share};
use crate::error::LockError;
use crate::key::LockKey;

/// `KEYS[1]` lock, `KEYS[2]` fencing counter, `KEYS[3]`/`KEYS[4]` the waiters' queue (see
/// below); `ARGV[1]` token, `ARGV[2]` ttl ms, `ARGV[3]` `1` to take a fencing token, `ARGV[4]`
/// `1` to queue up when busy, `ARGV[5]` the publish command (`PUBLISH`, or `SPUBLISH` in a
/// cluster), `ARGV[6]` a semaphore's size, or `read` for a reader (`0` or absent: the lock
/// itself, also a read-write lock's write side), `ARGV[7]` the number of the caller's attempt,
/// which names its place in the queue, `ARGV[8]` `1` when the caller waits if busy: a busy
/// reply then marks the holder's value (`WAITED` in `prelude.lua`), so that its release, which
/// is a plain delete for an unmarked value, wakes or hands over; `ARGV[9]` `1` when other
/// waiters of the caller's process wait for the lock: taken, it is marked at once. With the lock alone, or the lock and its
/// counter, as `KEYS`, there is no queue:
/// Redlock, `confirm_replicas`, and a cluster slot in migration (where Redis refuses a script
/// whose keys are not all on one node) use it that way. Used after a plain `SET NX PX` was
/// refused, and with fencing.
///
/// Returns `{1, fence}` when acquired (fence 0 without fencing), `{0, pttl, owner}` when busy (the
/// holder's remaining lease and token), `{2, type}` when the key holds something that is not a
/// lock. A retry with the same token after a lost reply, or after the lock was handed to this
/// waiter, finds its own token and takes the lock again instead of waiting for itself. The
/// counter is incremented in the same script as the `SET`, so no holder can ever see an older
/// token than a previous holder.
///
/// A free lock goes to the oldest live waiter: to the caller if that is it (or if nobody
/// waits), else it is handed over as [`RELEASE_LUA`](super::RELEASE_LUA) does and the caller queues up behind. A
/// busy caller that asked to queue takes (or keeps, renewing its deadline) its place: waiting
/// is first come, first served, and each attempt while waiting renews the place.
///
/// Readers and semaphores (`ARGV[6]` = `read` or N) keep a sorted set under the key: each
/// holder's token scored by its deadline (server clock, ms), and one member scored `+inf` that
/// says what the set is, `#read` or `#permits=N`. A place is taken (`{1, 0}`) when, after
/// expired holders are dropped, fewer than N remain (readers: any number) and no waiter for the
/// whole lock is queued (a free set goes to such a waiter first); else `{0, ms until the soonest
/// deadline, tag}`. A set of another kind or size answers `{3, its tag}` and is left untouched;
/// a string (a lock, or a writer) answers busy with its holder. The key expires with its last
/// deadline. The lock itself (a writer) treats such a set as busy and queues behind it, which
/// stops new readers and permit takers until it has had its turn.
///
/// A fencing token is the greater of the counter plus one and the server's clock in
/// microseconds (`TIME`), so tokens go on rising over a counter that a failover rolled back or
/// that expired, was deleted or lost, as long as this server's clock is not behind the clock
/// that handed out the earlier tokens by more than the time since, and a key's tokens come
/// slower than one a microsecond (see `next_fence` in `prelude.lua`). The counter expires a day
/// after the lease it was taken for (renewals keep a held lock's), so per-entity keys do not
/// pile up. Lua numbers are doubles, exact to 2^53: microseconds since 1970 stay below that
/// until 2255.
///
/// Before it writes anything, the script checks the keys it shares with the others: a counter
/// that is not a token (another type, or a string that is not digits below 2^53), a queue that
/// is not a sorted set or a hash of places that is not a hash fails it with `CORRUPTKEY <role>
/// <type> <key>` and nothing changed (read as [`LockError::InvalidKey`] saying to delete the
/// key). A handoff asks whether the caller may publish before it writes, writes the lock first
/// (what `maxmemory` refuses) and publishes last: a refusal of either changes nothing.
pub const ACQUIRE_LUA: &str = concat!(
    include_str!("prelude.lua"),
    include_str!("queue.lua"),
    include_str!("acquire.lua")
);

static SCRIPT: Script = Script::new(ACQUIRE_LUA);

/// The script's call for `attempt`, naming the waiters' queue when `queued`, publishing a
/// handoff with `publish` (`PUBLISH`, or `SPUBLISH` in a cluster).
pub(crate) fn call(attempt: &Acquire<'_>, queued: bool, publish: &str) -> Call {
    locking(&SCRIPT, attempt.key, queued, attempt.fencing)
        .arg(attempt.token)
        .arg(ttl_ms(attempt.ttl))
        .arg(u8::from(attempt.fencing))
        .arg(u8::from(attempt.queue))
        .arg(publish)
        .arg(attempt.share.wire())
        .arg(attempt.attempt)
        .arg(u8::from(attempt.waits))
        .arg(u8::from(attempt.others_wait))
        .arg(u8::from(attempt.aside))
}

/// The plain `SET NX PX` an exclusive lock's first attempt starts with (see
/// `Acquire::plain_set_first`): a script call costs Redis more, and most acquisitions find the
/// lock free. Only a refusal needs the script's answers (whose token? how long?).
pub(crate) fn plain_set(attempt: &Acquire<'_>) -> redis::Cmd {
    let sized = 32 + attempt.key.stored.len() + attempt.token.len();
    let mut set = redis::Cmd::with_capacity(6, sized);
    set.arg("SET")
        .arg(&attempt.key.stored)
        .arg(attempt.token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms(attempt.ttl));
    set
}

/// What the reply to this script (or to `ACQUIRE_ALL_LUA`, whose replies are alike) says of
/// `attempt` on `node`. The refusals are errors: another size or kind of shared lock, and a key
/// that holds application data.
pub(crate) fn read(
    reply: Vec<Value>,
    attempt: &Acquire<'_>,
    node: &str,
) -> Result<Attempt, LockError> {
    match reply.as_slice() {
        [Value::Int(1), Value::Int(fence)] => Ok(Attempt::Acquired {
            fence: attempt
                .fencing
                .then_some(u64::try_from(*fence).unwrap_or(0)),
        }),
        [Value::Int(0), Value::Int(pttl), owner @ ..] => Ok(Attempt::Busy {
            retry_after: u64::try_from(*pttl).ok().map(Duration::from_millis),
            holder: owner
                .first()
                .and_then(|o| redis::from_redis_value_ref::<String>(o).ok()),
            at: match owner.get(1) {
                Some(Value::Int(i)) => key_index(*i),
                _ => 0,
            },
        }),
        [Value::Int(3), found] => {
            let found = redis::from_redis_value_ref::<String>(found).unwrap_or_default();
            Err(match Share::from_tag(&found) {
                Some(found) => attempt.share.mismatch(&attempt.key.name, node, found),
                None => not_a_lock(attempt.key, "sorted set", node),
            })
        }
        other => {
            let kind = other
                .get(1)
                .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                .unwrap_or_default();
            let at = match other.get(2) {
                Some(Value::Int(i)) => key_index(*i),
                _ => 0,
            };
            let keys = attempt.key.keys();
            Err(not_a_lock(keys.get(at).unwrap_or(attempt.key), &kind, node))
        }
    }
}

/// The key holds application data (`kind`), which is left untouched.
pub(crate) fn not_a_lock(key: &LockKey, kind: &str, node: &str) -> LockError {
    LockError::InvalidKey {
        key: key.name.clone(),
        reason: format!(
            "Redis key `{}` on {node} holds a {kind}, not a lock; it was left untouched. Pick a \
             registry prefix or key that no application data uses",
            crate::error::shown(&key.stored),
        ),
    }
}

/// A script's 1-based key number, as an index.
fn key_index(i: i64) -> usize {
    usize::try_from(i - 1).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn attempt(key: &LockKey, fencing: bool, share: Share) -> Acquire<'_> {
        Acquire {
            key,
            token: "host:1:00",
            ttl: Duration::from_secs(1),
            fencing,
            attempt: 1,
            queue: false,
            waits: false,
            others_wait: false,
            share,
            give_up_at: tokio::time::Instant::now(),
            aside: false,
        }
    }

    fn one() -> LockKey {
        LockKey::new("lock:", "job".to_owned()).unwrap()
    }

    #[test]
    fn an_acquired_reply_carries_a_fence_only_where_one_was_asked_for() {
        let key = one();
        let reply = || vec![Value::Int(1), Value::Int(42)];
        let fenced = read(reply(), &attempt(&key, true, Share::Exclusive), "n");
        assert_eq!(fenced.unwrap(), Attempt::Acquired { fence: Some(42) });
        let plain = read(reply(), &attempt(&key, false, Share::Exclusive), "n");
        assert_eq!(plain.unwrap(), Attempt::Acquired { fence: None });
    }

    #[test]
    fn a_busy_reply_carries_the_holders_lease_its_token_and_which_key_was_taken() {
        let key = one();
        let exclusive = attempt(&key, false, Share::Exclusive);
        let busy = read(
            vec![Value::Int(0), Value::Int(1500), text("h:2:ff")],
            &exclusive,
            "n",
        );
        assert_eq!(
            busy.unwrap(),
            Attempt::Busy {
                retry_after: Some(Duration::from_millis(1500)),
                holder: Some("h:2:ff".to_owned()),
                at: 0,
            }
        );
        // A key without an expiry (-1) has no lease to wait out; a shared holder shows no token.
        let forever = read(vec![Value::Int(0), Value::Int(-1)], &exclusive, "n");
        assert_eq!(
            forever.unwrap(),
            Attempt::Busy {
                retry_after: None,
                holder: None,
                at: 0,
            }
        );
        // A multi-key lock's reply names the key found taken, from 1.
        let keys = LockKey::many("lock:", vec!["a".to_owned(), "b".to_owned()]).unwrap();
        let second = read(
            vec![Value::Int(0), Value::Int(10), text("h:2:ff"), Value::Int(2)],
            &attempt(&keys, false, Share::Exclusive),
            "n",
        );
        assert!(matches!(second.unwrap(), Attempt::Busy { at: 1, .. }));
    }

    #[test]
    fn a_shared_key_of_another_kind_or_size_is_refused_naming_both() {
        let key = one();
        let refused = read(
            vec![Value::Int(3), text("#permits=3")],
            &attempt(&key, false, Share::Read),
            "node-a",
        )
        .unwrap_err();
        let shown = refused.to_string();
        assert!(
            matches!(refused, LockError::InvalidOptions { .. })
                && shown.contains("a semaphore of 3 permits")
                && shown.contains("a read lock")
                && shown.contains("node-a"),
            "{shown}"
        );
        // A sorted set whose tag is not ours is application data.
        let foreign = read(
            vec![Value::Int(3), text("#mine")],
            &attempt(&key, false, Share::Read),
            "node-a",
        )
        .unwrap_err();
        assert!(
            matches!(&foreign, LockError::InvalidKey { key, .. } if key == "job")
                && foreign.to_string().contains("sorted set"),
            "{foreign}"
        );
    }

    #[test]
    fn a_key_holding_application_data_is_refused_naming_the_key_its_type_and_the_node() {
        let keys = LockKey::many("lock:", vec!["a".to_owned(), "b".to_owned()]).unwrap();
        let refused = read(
            vec![Value::Int(2), text("hash"), Value::Int(2)],
            &attempt(&keys, false, Share::Exclusive),
            "node-b",
        )
        .unwrap_err();
        let shown = refused.to_string();
        assert!(
            matches!(&refused, LockError::InvalidKey { key, .. } if key == "b")
                && shown.contains("`lock:b` on node-b holds a hash"),
            "{shown}"
        );
    }
}
