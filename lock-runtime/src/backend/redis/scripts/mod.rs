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
pub(crate) mod release;
pub(crate) mod renew;
pub(crate) mod undo;

pub use acquire::ACQUIRE_LUA;
pub use acquire_all::ACQUIRE_ALL_LUA;
pub(crate) use call::Call;
pub use force_unlock::FORCE_UNLOCK_LUA;
pub use inspect::INSPECT_LUA;
pub use release::{RELEASE_BARE_LUA, RELEASE_LUA};
pub use renew::RENEW_LUA;
pub use undo::UNDO_LUA;

/// What a lock's value has after its holder's token once someone waited for it (`WAITED` in
/// `prelude.lua`, which spells it too; a test holds the two equal).
const WAITED: &str = "+w";

/// Whether `token` is one the scripts mark once someone waits for it (`ours` in
/// `prelude.lua`: `host:pid:` and 32 hex digits, as `token::new_token` makes them). Another
/// client's token is never marked, so only the release script can tell whether its lock was
/// waited for.
pub(crate) fn marked_when_waited(token: &str) -> bool {
    let mut parts = token.rsplit(':');
    let random = parts.next().unwrap_or_default();
    let pid = parts.next().unwrap_or_default();
    parts.next().is_some()
        && random.len() == 32
        && random.bytes().all(|b| b.is_ascii_hexdigit())
        && !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `value` is `token` marked as waited for.
pub(crate) fn waited_for(value: &[u8], token: &str) -> bool {
    value.strip_suffix(WAITED.as_bytes()) == Some(token.as_bytes())
}

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
    use crate::backend::contract::FENCE_EXPIRY_MS;

    #[test]
    fn the_prelude_marks_a_waited_for_lock_as_the_client_reads_it() {
        let prelude = include_str!("prelude.lua");
        assert!(prelude.contains(&format!("local WAITED = '{}'", super::WAITED)));
        assert!(super::waited_for(b"h:1:ab+w", "h:1:ab"));
        assert!(!super::waited_for(b"h:1:ab", "h:1:ab"));
        assert!(!super::waited_for(b"h:2:ab+w", "h:1:ab"));
        let ours = "host:12:0123456789abcdef0123456789abcdef";
        assert!(super::marked_when_waited(ours));
        assert!(super::marked_when_waited(&crate::token::new_token()));
        for foreign in [
            "python-worker",
            "h:1:ab",
            "host:x:0123456789abcdef0123456789abcdef",
        ] {
            assert!(!super::marked_when_waited(foreign), "{foreign}");
        }
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
