//! Taking back a Redlock attempt that won only a minority: `undo.lua`.

use super::call::{Call, Script};
use crate::key::LockKey;

/// `KEYS[1]` lock; `ARGV[1]` token. [`RELEASE_LUA`](super::RELEASE_LUA) without the notification: it takes back a
/// Redlock attempt that won only a minority of nodes. Nobody waits for such an attempt to end
/// (no one saw it hold a quorum), and telling them would wake waiters for nothing.
pub const UNDO_LUA: &str = concat!(include_str!("prelude.lua"), include_str!("undo.lua"));

static SCRIPT: Script = Script::new(UNDO_LUA);

/// The script's call taking `token` back from `key`.
pub(crate) fn call(key: &LockKey, token: &str) -> Call {
    Call::new(&SCRIPT, &[&key.stored]).arg(token)
}

/// Whether the reply says it took something back.
pub(crate) fn undone(reply: i64) -> bool {
    reply == 1
}
