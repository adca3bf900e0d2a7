//! Redis distributed locks for async Rust, as one attribute.
//!
//! ```no_run
//! use lock_runtime::{distributed_lock, LockError};
//!
//! #[derive(Debug, thiserror::Error)]
//! enum DeployError {
//!     #[error(transparent)]
//!     Lock(#[from] LockError),
//! }
//!
//! #[distributed_lock(key = "deploy:<id>", ttl = "60s")]
//! async fn deploy(id: u64) -> Result<(), DeployError> {
//!     // Runs only while this process holds the Redis lock `lock:deploy:<id>`.
//!     Ok(())
//! }
//! ```
//!
//! The attribute is sugar over the manual API, which you can use directly:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
//! use std::time::Duration;
//! use lock_runtime::Registry;
//!
//! // In production: Registry::from_url("redis://10.0.0.5:6379/")? or LOCK_REDIS_URL.
//! let registry = Registry::in_memory();
//! let guard = registry.lock("deploy:7").ttl(Duration::from_secs(60)).acquire().await?;
//! // ... the lease keeper renews the lock while the guard lives ...
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # How it works
//!
//! A lock is one Redis string, `SET lock:<key> <token> NX PX <ttl>`, as redis-py, redsync and
//! node-redlock take it, so services in other languages that lock the same key exclude ours;
//! only its owner releases or extends it. A lease keeper renews what the process holds, waiters
//! queue and are handed the lock by its release, and with [`OnLost::Cancel`] a body whose lease
//! can no longer be confirmed is dropped before its key can expire. The details are in the
//! [`guide`]: [how it works](guide::how_it_works), [deployments](guide::deployments) (single
//! node, Sentinel, Cluster, Redlock, in memory), [metrics](guide::metrics), and the spans a lock
//! shows in traces ([tracing](guide::tracing): every request, hold and release is a `tracing`
//! span under the caller's, with no feature to turn on and no cost without a subscriber).
//!
//! # Choosing the options
//!
//! **`ttl`** is how long a crashed holder blocks everyone else, not how long the work may take:
//! while the holder lives, the lease keeper renews the lock every ttl/3. Pick it from how long
//! you can afford to wait after a crash (a few seconds to a minute). Below ~300 ms a renewal
//! round trip that is slow for once can cost the lease. With `renew = false` the lock simply
//! expires after `ttl`, and a guarded body is stopped just before.
//!
//! **`wait`** chooses between failing fast and queueing. Zero (the default) tries once and
//! returns [`LockError::Busy`], which carries the holder's remaining lease: right for requests
//! (answer 409 with `Retry-After`) and for jobs that another replica is already doing. A positive
//! `wait` parks the caller on a release notification, with no polling: right for work that
//! must happen, just not concurrently.
//!
//! **`on_lost`**: when the lease can no longer be guaranteed (Redis unreachable past the
//! lease's deadline, or the key taken away), [`OnLost::Cancel`] drops the body *before* the key
//! can expire on the server and returns [`LockError::Lost`]. Prefer it. Use
//! [`OnLost::Continue`] only when stopping halfway is worse than overlapping, and watch
//! [`CurrentLock::lost`] to stop at a safe point.
//!
//! **`min_hold` / `max_hold`**: `min_hold` keeps the key after a successful run until the
//! period is over, so a cron job on five replicas runs once per period (ShedLock's
//! `lockAtLeastFor`); a failed run releases at once so another replica can retry. `max_hold`
//! stops renewing after a bound, so a hung holder cannot keep the lock forever.
//!
//! # Fencing: what makes a lock safe
//!
//! No lock can stop a holder that paused (GC, swap, a stopped VM) past its lease from waking up
//! and writing. Fencing can: with `fencing`, every acquisition takes a number that strictly
//! increases per key, and the storage you write to rejects a write whose token is lower than
//! one it has already seen.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
//! use std::sync::Mutex;
//!
//! /// The storage side: remembers the highest token per record and refuses older writers.
//! struct FencedStore {
//!     highest: Mutex<u64>,
//! }
//! impl FencedStore {
//!     fn write(&self, fence: u64) -> Result<(), &'static str> {
//!         let mut highest = self.highest.lock().unwrap();
//!         if fence < *highest {
//!             return Err("stale writer: a newer lock holder has written");
//!         }
//!         *highest = fence;
//!         Ok(())
//!     }
//! }
//!
//! let store = FencedStore { highest: Mutex::new(0) };
//! let registry = lock_runtime::Registry::in_memory();
//! let first = registry.lock("invoice:7").fencing(true).acquire().await?;
//! let old_token = first.fence().unwrap();
//! first.release().await?;
//! let second = registry.lock("invoice:7").fencing(true).acquire().await?;
//! store.write(second.fence().unwrap()).unwrap();
//! // The first holder, waking up late, is refused by the storage, not by the lock.
//! assert!(store.write(old_token).is_err());
//! # Ok(()) }
//! ```
//!
//! For data in Redis, [`FencedKey`] is that check: a write carries the holder's token, and one
//! script refuses it if a higher token was already written to the key, or runs it and records
//! the token (the `fenced_write` example shows a paused holder's late write refused, where a
//! plain `SET` overwrites the next holder's). In SQL the same check is a conditional update,
//! whose row count says whether it was refused: `UPDATE .. SET .., fence = $token WHERE id =
//! $id AND fence <= $token` (equal is the same holder writing again: no two holders get the
//! same token). A token is only meaningful against the same lock's tokens: fence each record
//! with one lock key's tokens.
//!
//! **The counter.** It lives at `fence:{lock:<key>}` (`fence:lock:<key>` when the key has a
//! `{hash tag}`), one name on a single server, Sentinel and Cluster, so moving between them
//! keeps tokens increasing. Each token is the greater of the counter plus one and the server's
//! clock (`TIME`) in microseconds since 1970, so tokens are large (about 1.8 × 10^15, exact in a
//! JSON number) and follow the clock: compare them; never count on their values. The counter
//! expires a day after the lease it was taken for, so per-entity keys (`invoice:<id>`) do not
//! pile up in Redis; while a fenced lock is held, its renewals keep the counter (and put it back
//! at the holder's token if it was deleted), so it names the holder's token, an election's
//! term, for as long as the hold lasts. A counter that holds anything else than a token fails
//! the acquisition, with nothing written, naming it: delete it.
//!
//! **The promise.** Per key, each token is greater than every token handed out before it,
//! also when the counter is gone (expired, deleted, lost in a restart without persistence) or
//! rolled back (a failover to a replica that had not received the last tokens), under two
//! assumptions: the clock of the server that hands out the next token is not behind the clock
//! of the one that handed out the earlier ones by more than the time in between (a failover's
//! duration at least: seconds of clock error, not more), and one key's tokens are handed out
//! slower than one per microsecond (a lock cycle takes a round trip, tens of microseconds at
//! the very least). In memory ([`MemoryStore`]) nothing rolls back: a live counter counts one
//! by one, on Tokio's clock, and a new counter starts above every token the store handed out.
//!
//! # Testing code that takes locks
//!
//! [`Registry::in_memory`] (or several registries sharing one [`MemoryStore`], one per simulated
//! replica) behaves like Redis, including waiting, fencing and expiry, and runs on Tokio's clock,
//! so `tokio::time::pause()` makes leases expire instantly. Install it as the default registry
//! (or under the name your attribute uses) in the test:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lock_runtime::{distributed_lock, LockError, Registry};
//!
//! #[distributed_lock(key = "refund:<order>", registry = "payments")]
//! async fn refund(order: u64) -> Result<u64, LockError> {
//!     Ok(order)
//! }
//!
//! Registry::in_memory().install_as("payments");
//! assert_eq!(refund(42).await.unwrap(), 42);
//! # }
//! ```
//!
//! # Cargo features
//!
//! - `tls`: `rediss://` URLs (single node, Cluster, Sentinel, Redlock), through rustls.
//! - `postgres`: the Postgres store ([`RegistryBuilder::postgres`], `LOCK_POSTGRES_URL`),
//!   through tokio-postgres; `postgres-tls` adds TLS to it (`sslmode=require`), through rustls.
//! - `metrics`: acquisitions, waits, holds, handoffs, renewals and losses through the
//!   [`metrics`](https://docs.rs/metrics) facade ([`guide::metrics`]).

#![warn(missing_docs)]

mod acquisition;
mod backend;
mod backoff;
mod current;
mod deployment;
mod election;
mod error;
mod fenced;
mod guard;
pub mod guide;
mod io;
mod keeper;
mod key;
mod lease;
mod lock;
mod metrics;
mod names;
mod options;
pub mod protocol;
mod registry;
mod report;
mod spans;
mod state;
mod timeouts;
mod token;
mod transaction;
mod waiting;

#[doc(hidden)]
pub mod __private;

pub use backend::{LockInfo, MemoryStore, Permits, Place};
pub use current::{current, CurrentLock};
pub use deployment::Deployment;
pub use election::{Election, Leader, Leadership, Observer, SteppedDown, Term};
pub use error::{LockError, LostReason, StoreError};
pub use fenced::{FencedKey, FencedWrite};
pub use guard::LockGuard;
pub use key::{KeyBuilder, MAX_KEYS_PER_LOCK, MAX_KEY_BYTES};
pub use lock::LockRequest;
// The attribute's guide lives here, beside the runtime its examples run on: as a doc test of
// lock-macros, they made it build a second copy of lock-runtime and its dependencies.
#[doc(inline)]
#[doc = include_str!("docs/attribute.md")]
pub use lock_macros::distributed_lock;
pub use metrics::SECONDS_BUCKETS;
pub use options::{LockOptions, Mode, OnLost};
pub use registry::{named, registry, HeldLock, Registry, RegistryBuilder};
pub use transaction::TransactionCheck;
