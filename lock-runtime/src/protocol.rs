//! The wire protocol, for services in other languages that lock the same resources.
//!
//! - A lock is one Redis string, `<prefix><key>` (prefix `lock:` by default), holding the
//!   owner's token, with a `PX` expiry: `SET <prefix><key> <token> NX PX <ttl_ms>` takes it, as
//!   redis-py's `Lock`, redsync and node-redlock do, so their holders and ours exclude each other.
//! - Our waiters queue up beside the lock, in its cluster slot: `queue:{<prefix><key>}`, a sorted
//!   set of their tokens by arrival, and `queued:{<prefix><key>}`, a hash from each token to
//!   `"<deadline ms> <ttl ms> <fencing 0|1> <place>"` (the deadline on the server's clock, one
//!   ttl after the waiter's last attempt, and the number the waiter gave that attempt),
//!   followed by `" aside"` for an election's candidate standing aside: its place is kept, and
//!   passed over by every handoff. [`ACQUIRE_LUA`] takes or renews a place (`ARGV[10]` = `1`
//!   standing aside: it never takes the lock); a place past its deadline is dropped, never
//!   served.
//! - A release is [`RELEASE_LUA`]: owner-checked, it hands the lock to the oldest live waiter
//!   not standing aside (`SET` to its token until its place's deadline) or deletes it, and
//!   publishes on the channel named like the lock key (`SPUBLISH` in a cluster): a plain
//!   release before it deletes, a handoff after it wrote the lock in the waiter's name (so a
//!   handoff that `maxmemory` refuses tells no one), both after checking, where the server can
//!   say (`redis.acl_check_cmd`, Redis and Valkey 7+), that the caller may publish. The message
//!   is `<released>` when the lock is free, and `<released>:<next>:<fence>:<place>` when it went
//!   to a waiter, each name the SHA-1 (lowercase hex) of a token, and `<place>` the waiter's
//!   attempt that kept the place (the waiter trusts the handoff only if no later attempt of its
//!   own found the lock taken); any other message wakes a waiter too. A peer that deletes with its own script is
//!   still safe; our waiters then notice the release when the holder's lease would have ended,
//!   and the oldest of them takes the lock.
//! - A waiter of ours marks the lock it waits for, if the holder's token is of our form
//!   (`<host>:<pid>:` and 32 hex digits): the value becomes `<token>+w`, its expiry kept. A
//!   release that finds the bare token knows nobody waited and only deletes it, with no message:
//!   `DELIFEQ` where the server has it, else [`RELEASE_LUA`]'s first lines (`ARGV[3]` = `1`), or
//!   [`RELEASE_BARE_LUA`] for many locks in one call. Another client's value is never marked,
//!   and its release through [`RELEASE_LUA`] always hands over or notifies. A reader or permit
//!   taker that waits has no place in the queue (a handoff wakes only the waiter it went to):
//!   it also sets the field `#unqueued` of `queued:{<prefix><key>}`, kept at least as long as
//!   the lock's lease, and every holder the lock is handed to or taken by from the queue is
//!   marked while the field lives; the release that frees the lock and publishes deletes it.
//! - Readers of a read-write lock, and a semaphore of N permits, are a sorted set under
//!   `<prefix><key>` instead: each holder's token scored by its deadline (server clock, ms) and
//!   one member scored `+inf` naming the kind, `#read` or `#permits=N`. [`ACQUIRE_LUA`] with
//!   `ARGV[6]` = `read` or N takes a place, [`RELEASE_LUA`] and [`RENEW_LUA`] release and renew
//!   it as they do a lock; a writer (a plain lock) and a plain `SET NX` on the key are refused
//!   while any place lives.
//! - A multi-key lock takes all its keys, sorted, in one [`ACQUIRE_ALL_LUA`] call (each key a
//!   plain lock holding the same token), and releases and renews each as a lock.
//! - Redlock takes back an attempt that won only a minority with [`UNDO_LUA`], which wakes
//!   nobody.
//! - A renewal is [`RENEW_LUA`] (an owner-checked `PEXPIRE`; for a fenced lock it also keeps
//!   the counter), an inspection [`INSPECT_LUA`], an operator's unconditional unlock
//!   [`FORCE_UNLOCK_LUA`].
//! - An election's candidates hold its key as a lock whose token starts with the identity the
//!   leader shows: `<identity>@<host>:<pid>:` and 32 hex digits. An elected candidate publishes
//!   `+elected` on the key's channel (it wakes observers, not waiters), and a candidate's
//!   release is never the silent delete of a bare token (`ARGV[3]` = `0`): it always
//!   publishes. The term is the fencing token taken with the lock.
//! - Fencing counters live at `fence:{<prefix><key>}` (`fence:<prefix><key>` when the key has
//!   a hash tag), in the lock's cluster slot: a string of digits, the last token handed out.
//!   A token is taken only in the step that takes the lock ([`ACQUIRE_LUA`],
//!   [`ACQUIRE_ALL_LUA`], or [`RELEASE_LUA`] handing it over): the greater of the counter plus
//!   one and the server's `TIME` in microseconds, written back with an expiry of the lease plus
//!   a day. So tokens rise over a counter that is gone or that a failover rolled back,
//!   assuming the server's clock is not behind the previous server's by more than the time
//!   since its last token (a failover's duration at least) and tokens of a key come slower than
//!   one a microsecond. [`RENEW_LUA`] keeps a held fenced lock's counter: when it has less than
//!   the lease plus half a day left, it is set again to the greater of its value and the
//!   holder's token, expiring a day beyond the lease, so it names the holder's token (an
//!   election's term) for as long as the lock is held.
//! - How long a lock has been held lives at `since:{<prefix><key>}` (`since:<prefix><key>` when
//!   the key has a hash tag), in the lock's cluster slot: `<SHA-1 of the holder's token>
//!   <ms on the server's clock>`, the moment it took the lock. [`RENEW_LUA`] writes it at the
//!   holder's first renewal (`ARGV` says how long the lock has been held by then) and keeps it
//!   every 32nd, for 64 ttls each time; [`INSPECT_LUA`] returns how long the holder has held
//!   the lock when the note names it. A note naming anyone else says nothing (the next holder's
//!   first renewal writes over it); anything else there (another type, a string not of this
//!   form) says nothing and is never written over. Neither script lists the note among its `KEYS`, and both
//!   touch it only where the ACL allows (`redis.acl_check_cmd`), so an ACL without `since:`
//!   patterns locks and renews as before, with no time held shown.
//! - The scripts check the keys beside the lock before writing anything: a counter that is not
//!   digits below 2^53 - 1, a queue that is not a sorted set, or places that are not a hash fail
//!   the script with the error `CORRUPTKEY <counter|queue|queued> <type found> <key>` and
//!   nothing changed. A caller whose ACL lacks the publish command is refused before anything
//!   is written; a counter at the last token of the range (2^53 - 1) is refused as exhausted.
//!
//! ```
//! // The same owner-checked release, from any Redis client:
//! assert!(lock_runtime::protocol::RELEASE_LUA.contains("owner ~= token"));
//! ```

/// Reads who holds a lock from its token, as `lockctl` shows it.
pub use crate::token::TokenOwner;

pub use crate::backend::redis::scripts::{
    ACQUIRE_ALL_LUA, ACQUIRE_LUA, FORCE_UNLOCK_LUA, INSPECT_LUA, RELEASE_BARE_LUA, RELEASE_LUA,
    RENEW_LUA, UNDO_LUA,
};

/// The Postgres store's schema (`distributed_lock`, version 1): its tables and the functions
/// that are its protocol, as the store creates it on first use (`lockctl schema` prints it).
#[cfg(feature = "postgres")]
pub const POSTGRES_SCHEMA: &str = crate::backend::postgres::SCHEMA;
