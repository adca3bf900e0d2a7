//! Where locks live. The registry talks to one of these; each speaks the same operations.

use std::time::Duration;

use crate::io::Home;
use crate::key::LockKey;
use crate::timeouts::Timeouts;
use crate::waiting::WaitHub;
use crate::LockError;

pub(crate) mod memory;
pub(crate) mod redis;
pub(crate) mod redlock;

pub use memory::MemoryStore;
pub(crate) use redis::config::Tls;

/// How long a fencing counter outlives the last fenced acquisition of its key: one day, so a
/// server re-creating an expired counter may have a clock up to a day behind (see
/// `ACQUIRE_LUA`, which spells the same number). Clock errors are seconds, not days; a longer
/// expiry would only keep more counters around.
pub(crate) const FENCE_EXPIRY_MS: u64 = 24 * 3600 * 1000;

/// The outcome of one acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Ours; with the fencing token when one was asked for.
    Acquired { fence: Option<u64> },
    /// Someone else's; with the holder's remaining lease (`None`: the key has no expiry).
    Busy { retry_after: Option<Duration> },
}

/// What a renewal found for one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// Still ours; its expiry was set again.
    Yes,
    /// No key at all: it expired on the server or was deleted.
    Gone,
    /// Someone else's token (or another kind of value) is under the key.
    Taken,
}

/// One lock in a renewal batch.
pub(crate) struct Renewal<'a> {
    pub redis_key: &'a str,
    pub token: &'a str,
    pub ttl_ms: u64,
}

/// What `inspect` finds under a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// The holder's token (`host:pid:random`), `None` when the lock is free.
    pub owner: Option<String>,
    /// The remaining lease, `None` when free or without expiry.
    pub remaining: Option<Duration>,
    /// The last fencing token handed out for this key, while its counter lives (it expires a
    /// day after the key's last fenced acquisition).
    pub fence: Option<u64>,
}

pub(crate) enum Backend {
    /// A standalone server or a Redis Cluster.
    Redis(Box<redis::RedisBackend>),
    /// Independent masters.
    Redlock(Box<redlock::Redlock>),
    Memory(MemoryStore),
}

/// Milliseconds for `PX`/`PEXPIRE`, at least 1 (0 would be an error or mean "delete now").
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Backend {
    /// One Redis server.
    pub(crate) fn server(url: &str, tls: &Tls, timeouts: Timeouts) -> Result<Self, LockError> {
        let topology = redis::config::Topology::Server(Box::new(tls.client(url)?));
        Ok(Self::Redis(Box::new(redis::RedisBackend::new(
            topology, timeouts,
        ))))
    }

    /// A Redis Cluster, found through these seeds.
    pub(crate) fn cluster(
        seeds: Vec<String>,
        tls: &Tls,
        timeouts: Timeouts,
    ) -> Result<Self, LockError> {
        let seeds = redis::config::ClusterSeeds::parse(seeds, tls)?;
        let topology = redis::config::Topology::Cluster(seeds);
        Ok(Self::Redis(Box::new(redis::RedisBackend::new(
            topology, timeouts,
        ))))
    }

    /// The master these sentinels name for the service `master`.
    pub(crate) fn sentinel(
        master: &str,
        sentinels: Vec<String>,
        timeouts: Timeouts,
    ) -> Result<Self, LockError> {
        let topology =
            redis::config::Topology::Sentinel(redis::config::sentinel_setup(master, sentinels)?);
        Ok(Self::Redis(Box::new(redis::RedisBackend::new(
            topology, timeouts,
        ))))
    }

    /// Redlock over these independent masters.
    pub(crate) fn redlock(
        nodes: Vec<String>,
        tls: &Tls,
        timeouts: Timeouts,
    ) -> Result<Self, LockError> {
        let clients = redis::config::redlock_nodes(nodes, tls)?;
        Ok(Self::Redlock(Box::new(redlock::Redlock::new(
            clients, timeouts,
        ))))
    }

    /// Where this backend's background work runs.
    pub(crate) fn home(&self) -> Home {
        match self {
            Self::Memory(_) => Home::Caller,
            Self::Redis(_) | Self::Redlock(_) => Home::Io,
        }
    }

    /// `host:port` (never credentials), for errors and traces.
    pub(crate) fn node(&self) -> &str {
        match self {
            Self::Redis(n) => n.node(),
            Self::Redlock(r) => r.node(),
            Self::Memory(_) => "memory",
        }
    }

    /// Whether keys must keep the lock, its counter and its channel in one hash slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Redis(n) if n.is_cluster())
    }

    pub(crate) fn hub(&self) -> &WaitHub {
        match self {
            Self::Redis(n) => n.hub(),
            Self::Redlock(r) => r.hub(),
            Self::Memory(m) => m.hub(),
        }
    }

    /// `first`: the first attempt of an acquisition, which is usually uncontended; later
    /// attempts (while waiting) go straight to the script that also reports the holder's lease.
    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        token: &str,
        ttl: Duration,
        fencing: bool,
        first: bool,
    ) -> Result<Attempt, LockError> {
        match self {
            Self::Redis(n) => n.acquire(key, token, ttl, fencing, first).await,
            Self::Redlock(r) => r.acquire(key, token, ttl, fencing, first).await,
            Self::Memory(m) => Ok(m.acquire(key, token, ttl, fencing)),
        }
    }

    /// Deletes the lock if it is still ours and wakes waiters; `Ok(false)` if it was not ours.
    pub(crate) async fn release(&self, key: &LockKey, token: &str) -> Result<bool, LockError> {
        match self {
            Self::Redis(n) => n.release(key, token).await,
            Self::Redlock(r) => r.release(key, token).await,
            Self::Memory(m) => Ok(m.release(key, token)),
        }
    }

    /// Sets the expiry of each lock that is still ours. Per lock: what the server found, or
    /// `None` when unknown (that part of the batch failed; retry).
    ///
    /// Each call to a node is bounded by `budget`, so one dead node cannot hold back the
    /// renewals that live nodes confirm.
    pub(crate) async fn renew(
        &self,
        batch: &[Renewal<'_>],
        budget: Duration,
    ) -> Result<Vec<Option<Renewed>>, LockError> {
        match self {
            Self::Redis(n) => n.renew(batch, budget).await,
            Self::Redlock(r) => r.renew(batch, budget).await,
            Self::Memory(m) => Ok(m.renew(batch).into_iter().map(Some).collect()),
        }
    }

    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<LockInfo, LockError> {
        match self {
            Self::Redis(n) => n.inspect(key).await,
            Self::Redlock(r) => r.inspect(key).await,
            Self::Memory(m) => Ok(m.inspect(key)),
        }
    }

    pub(crate) async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        match self {
            Self::Redis(n) => n.force_unlock(key).await,
            Self::Redlock(r) => r.force_unlock(key).await,
            Self::Memory(m) => Ok(m.force_unlock(key)),
        }
    }
}
