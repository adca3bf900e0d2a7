//! The Lua scripts that make each lock operation one atomic round trip, one module each: its
//! Lua (`<name>.lua`, after the shared `prelude.lua`, and `queue.lua` for the two that serve
//! the waiters' queue), the one function that builds its call, and the one that reads its
//! reply.
//!
//! The data layout is the common one (redis-py's `Lock`, redsync, node-redlock): one string per
//! lock holding the owner's token, with a `PX` expiry. A service in another language that locks
//! the same Redis key with `SET key token NX PX ttl` excludes ours, and ours excludes it. Our
//! waiters also queue up beside the lock, so that a release hands it straight to the oldest.

use redis::aio::ConnectionLike;
use redis::ServerErrorKind;

pub(crate) mod acquire;
pub(crate) mod acquire_all;
mod call;
pub(crate) mod force_unlock;
pub(crate) mod inspect;
mod marks;
pub(crate) mod release;
pub(crate) mod renew;
pub(crate) mod undo;

pub use acquire::ACQUIRE_LUA;
pub use acquire_all::ACQUIRE_ALL_LUA;
pub(crate) use call::Call;
pub use force_unlock::FORCE_UNLOCK_LUA;
pub use inspect::INSPECT_LUA;
pub(crate) use marks::{silent_when_bare, waited_for};
pub use release::{RELEASE_BARE_LUA, RELEASE_LUA};
pub use renew::RENEW_LUA;
pub use undo::UNDO_LUA;

/// Every script, for loading them all when a connection opens.
pub(crate) const ALL: [&str; 8] = [
    ACQUIRE_LUA,
    ACQUIRE_ALL_LUA,
    RELEASE_LUA,
    RELEASE_BARE_LUA,
    UNDO_LUA,
    RENEW_LUA,
    INSPECT_LUA,
    FORCE_UNLOCK_LUA,
];

/// Loads every script on the server behind `con`.
pub(crate) async fn load_all(con: &mut impl ConnectionLike) -> redis::RedisResult<()> {
    let mut load = redis::pipe();
    for script in ALL {
        load.cmd("SCRIPT").arg("LOAD").arg(script);
    }
    load.query_async::<()>(con).await
}

/// Whether a reply says the server did not have the script.
pub(crate) fn is_noscript(reply: &redis::Value) -> bool {
    matches!(reply, redis::Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
}

#[cfg(test)]
mod tests {
    use crate::backend::contract::{FENCE_EXPIRY_MS, NOTE_HELD_EVERY};

    #[test]
    fn a_note_of_how_long_a_lock_is_held_outlasts_the_renewals_until_the_next() {
        let prelude = include_str!("prelude.lua");
        let ttls = 2 * NOTE_HELD_EVERY;
        assert!(prelude.contains(&format!("local HELD_NOTE_TTLS = {ttls}\n")));
    }

    #[test]
    fn the_scripts_keep_fencing_counters_for_fence_expiry_ms() {
        let prelude = include_str!("prelude.lua");
        assert!(prelude.contains(&format!("local FENCE_EXPIRY_MS = '{FENCE_EXPIRY_MS}'")));
        for script in super::ALL {
            let spelled = script.matches(&FENCE_EXPIRY_MS.to_string()).count();
            assert!(spelled <= 1, "only the prelude spells it");
        }
    }
}
