//! An operator's unconditional unlock: `force_unlock.lua`.

use super::call::{Call, Script};
use crate::key::LockKey;

/// `KEYS[1]` lock; `ARGV[1]` the publish command. Deletes whatever lock is there (an operator's
/// decision) and wakes waiters, naming the tenure as [`RELEASE_LUA`](super::RELEASE_LUA) does.
pub const FORCE_UNLOCK_LUA: &str = concat!(
    include_str!("prelude.lua"),
    include_str!("force_unlock.lua")
);

static SCRIPT: Script = Script::new(FORCE_UNLOCK_LUA);

/// The script's call deleting `key`, publishing with `publish`.
pub(crate) fn call(key: &LockKey, publish: &str) -> Call {
    Call::new(&SCRIPT, &[&key.stored]).arg(publish)
}

/// Whether the reply says a lock was there.
pub(crate) fn deleted(reply: i64) -> bool {
    reply == 1
}
