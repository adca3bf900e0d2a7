//! The wire protocol, for services in other languages that lock the same resources.
//!
//! - A lock is one Redis string, `<prefix><key>` (prefix `lock:` by default), holding the
//!   owner's token, with a `PX` expiry: `SET <prefix><key> <token> NX PX <ttl_ms>` takes it, as
//!   redis-py's `Lock`, redsync and node-redlock do, so their holders and ours exclude each other.
//! - A release is [`RELEASE_LUA`]: an owner-checked delete that also publishes on the channel
//!   named like the lock key (`SPUBLISH` in a cluster), which wakes our waiters at once. The
//!   message is the SHA-1 (lowercase hex) of the released token; any other message wakes a
//!   waiter too. A peer that deletes with its own script is still safe; our waiters then notice
//!   the release when the holder's lease would have ended.
//! - Redlock takes back an attempt that won only a minority with [`UNDO_LUA`], which wakes
//!   nobody.
//! - A renewal is [`RENEW_LUA`] (an owner-checked `PEXPIRE`), an inspection [`INSPECT_LUA`],
//!   an operator's unconditional unlock [`FORCE_UNLOCK_LUA`].
//! - Fencing counters live at `fence:{<prefix><key>}` (`fence:<prefix><key>` when the key has
//!   a hash tag), in the lock's cluster slot, and are only ever incremented by [`ACQUIRE_LUA`],
//!   in the same step that takes the lock.
//!
//! ```
//! // The same owner-checked release, from any Redis client:
//! assert!(lock_runtime::protocol::RELEASE_LUA.contains("redis.pcall('GET', KEYS[1]) == ARGV[1]"));
//! ```

pub use crate::backend::redis::scripts::{
    ACQUIRE_LUA, FORCE_UNLOCK_LUA, INSPECT_LUA, RELEASE_LUA, RENEW_LUA, UNDO_LUA,
};
