//! A multi-key lock's keys, taken all or none: `acquire_all.lua`.

use super::call::{Call, Script};
use crate::backend::contract::{ttl_ms, Acquire};
use crate::names;

/// A multi-key lock: `KEYS[1..n]` the locks (sorted), then with fencing `KEYS[n+1..2n]` their
/// counters; `ARGV[1]` token, `ARGV[2]` ttl ms, `ARGV[3]` `1` to take a fencing token, `ARGV[4]`
/// n, `ARGV[5]` `1` when the caller waits if busy (it marks the taken key, as
/// [`ACQUIRE_LUA`](super::ACQUIRE_LUA) does), `ARGV[6]` `1` when other waiters of the caller's
/// process wait for any of the keys (taken, they are marked). All or none: every key free (or already this token's) is set to the token with the ttl;
/// else nothing is written and the reply is `{0, pttl, owner, i}` for the first taken key `i`
/// (a reader's or permit's set reads as taken, by its tag), or `{2, type, i}` for a key that
/// holds application data. Taken, it replies `{1, fence}`: with fencing, the next token of
/// every key's counter (as [`ACQUIRE_LUA`](super::ACQUIRE_LUA) takes one), the highest of them, and every counter
/// raised to it, so the token is above each key's earlier tokens and a later holder of any of
/// them gets a higher one. It does not queue, and takes free keys even where single-key
/// waiters are queued (a key with waiters is free only after its holder's lease ran out).
pub const ACQUIRE_ALL_LUA: &str =
    concat!(include_str!("prelude.lua"), include_str!("acquire_all.lua"));

static SCRIPT: Script = Script::new(ACQUIRE_ALL_LUA);

/// The script's call for `attempt` (a multi-key lock): every lock, then with fencing their
/// counters. Its reply reads as the acquire script's ([`super::acquire::read`]).
pub(crate) fn call(attempt: &Acquire<'_>) -> Call {
    let keys = attempt.key.keys();
    let locks = keys.iter().map(|k| k.stored.as_str());
    let fences: Vec<String> = if attempt.fencing {
        keys.iter().map(names::fence).collect()
    } else {
        Vec::new()
    };
    let names: Vec<&str> = locks.chain(fences.iter().map(String::as_str)).collect();
    Call::new(&SCRIPT, &names)
        .arg(attempt.token)
        .arg(ttl_ms(attempt.ttl))
        .arg(u8::from(attempt.fencing))
        .arg(keys.len())
        .arg(u8::from(attempt.waits))
        .arg(u8::from(attempt.others_wait))
}
