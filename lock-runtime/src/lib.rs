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
//! - **Wire protocol.** One Redis string per lock, `SET lock:<key> <token> NX PX <ttl>`, the
//!   convention of redis-py's `Lock`, redsync and node-redlock, so services in other languages
//!   that lock the same key exclude ours. The token is `host:pid:` plus 128 bits from the OS
//!   random source, fresh for every acquisition. Release and renewal are owner-checked scripts:
//!   a lock is never released or extended by anyone but its owner.
//! - **Any runtime.** Redis connections, notification subscribers and lease keepers run on the
//!   library's own I/O thread, so one [`Registry`] serves every Tokio runtime of the process
//!   (one per `#[tokio::test]`, say), whichever used it first and whether or not it still runs.
//! - **Lease keeper.** One task per [`Registry`] renews every held lock at a third of its ttl,
//!   batching renewals into one script call per batch. Each lease keeps a local deadline: the
//!   send time of its last confirmed renewal plus ttl minus drift (1 % of ttl + 2 ms). When that
//!   deadline passes unconfirmed, or Redis says the token is gone, the lease is lost, and with
//!   [`OnLost::Cancel`] the body is dropped *before* the key can expire on the server.
//! - **Waiting.** A busy lock is waited for by notification: each release publishes on the
//!   lock's channel, one subscriber connection per registry serves every waiter, and each wait
//!   is bounded by the holder's remaining lease, so a lost message costs at most one lease.
//! - **Reentrancy.** Inside a guarded body, locking a key the task already holds re-enters the
//!   existing lease. Spawned tasks do not inherit it.
//! - **Cancel safety.** Dropping a guard or a guarded future releases the lock in the
//!   background; the process keeps listing it as held until Redis confirmed the release.
//! - **Fencing.** With `fencing`, each acquisition takes a number that strictly increases per
//!   key (see [Fencing](#fencing-what-makes-a-lock-safe) for the exact promise), incremented in
//!   the same script as the `SET`. Give it to the storage you write to, which rejects writes
//!   older than the newest it has seen: that is what makes a lock safe against a holder that
//!   paused past its lease (Kleppmann, "How to do distributed locking").
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
//! In SQL the same check is `UPDATE .. SET .., fence = $token WHERE id = $id AND fence <= $token`.
//!
//! **The counter.** It lives at `fence:{lock:<key>}` (`fence:lock:<key>` when the key has a
//! `{hash tag}`), one name on a single server, Sentinel and Cluster, so moving between them
//! keeps tokens increasing. It expires a day after the last fenced acquisition of its key, so
//! per-entity keys (`invoice:<id>`) do not pile up in Redis. A missing counter (new, expired,
//! deleted, or lost with the server's data) starts at the server's clock (`TIME`) in
//! microseconds since 1970, which is above every token an earlier counter handed out: that one
//! started at its own clock reading and grew by one per fenced acquisition, far slower than one
//! per microsecond. Tokens are therefore large (about 1.7 × 10^15, exact in a JSON number) and
//! consecutive only while one counter lives. Compare them; never count on their values.
//!
//! **The promise.** Per key, each token is greater than every token handed out before it,
//! unless a counter is lost and re-created by a server whose clock is behind the clock that
//! last incremented it by more than the time in between. That time is at least a day when the
//! counter expired; it can be short when the counter was lost in a restart without persistence
//! or a failover to a replica that had not received it (which also lose the lock itself). A
//! counter that survives, replicated or persisted, never consults a clock. In memory
//! ([`MemoryStore`]) the same rules hold on Tokio's clock, and a new counter starts above every
//! token the store handed out.
//!
//! # Single node, Sentinel, Cluster or Redlock
//!
//! - **One Redis server** (`LOCK_REDIS_URL=redis://..`): the simplest, with fencing. A failover
//!   to a replica that had not yet received the lock, or a restart without persistence, can let a
//!   second holder in; the first learns at its next renewal. Fencing covers that gap.
//! - **Redis Sentinel** (`LOCK_REDIS_SENTINEL=url,url` and `LOCK_REDIS_SENTINEL_MASTER=name`,
//!   or [`RegistryBuilder::sentinel`]): one server, whichever the sentinels name as master; the
//!   registry follows a failover on its own. The failover gap of one server applies.
//! - **Redis Cluster** (`LOCK_REDIS_CLUSTER=seed,seed`): the same guarantees per shard, with
//!   fencing; the lock, its counter and its notifications share the key's hash slot.
//! - **Redlock** (`LOCK_REDIS_URL=url,url,url`): survives a minority of independent masters
//!   failing, at N round trips per operation, and **without fencing** (no counter is monotonic
//!   across independent nodes). Restart a failed node only after one max ttl.
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
//! # Metrics
//!
//! With the `metrics` feature, acquisitions by outcome, wait and hold times, handoffs,
//! renewals, losses by reason and the locks held now are reported through the
//! [`metrics`](https://docs.rs/metrics) facade to whatever recorder the process installed,
//! labeled by registry ([`RegistryBuilder::name`]) and key template
//! ([`LockOptions::template`]; the attribute sets it), never by the rendered key. The README's
//! "Metrics" section lists them.
//!
//! # Cargo features
//!
//! - `tls`: `rediss://` URLs (single node, Cluster, Sentinel, Redlock), through rustls.
//! - `metrics`: the metrics above.

#![warn(missing_docs)]

mod acquisition;
mod backend;
mod backoff;
mod current;
mod error;
mod guard;
mod io;
mod keeper;
mod key;
mod lease;
mod lock;
mod metrics;
mod options;
pub mod protocol;
mod registry;
mod state;
mod timeouts;
mod token;
mod waiting;

#[doc(hidden)]
pub mod __private;

pub use backend::{LockInfo, MemoryStore, Permits};
pub use current::{current, CurrentLock};
pub use error::{LockError, LostReason};
pub use guard::LockGuard;
pub use key::{KeyBuilder, MAX_KEYS_PER_LOCK, MAX_KEY_BYTES};
pub use lock::LockRequest;
pub use lock_macros::distributed_lock;
pub use options::{LockOptions, Mode, OnLost};
pub use registry::{named, registry, HeldLock, Registry, RegistryBuilder};
