//! Where locks live: the stores behind the [`Store`] contract, and the [`Backend`] that the
//! registry, the keeper and the guards talk to, whichever store it is.

use std::time::Duration;

use crate::error::LockError;
use crate::io::Home;
use crate::key::LockKey;
use crate::options::Share;
use crate::timeouts::Timeouts;
use crate::waiting::WaitHub;

mod contract;
pub(crate) mod memory;
pub(crate) mod redis;
pub(crate) mod redlock;

pub(crate) use contract::{ttl_ms, Acquire, Attempt, Renewal, Renewed, Store};
pub use contract::{LockInfo, Permits, Place};
pub use memory::MemoryStore;
pub(crate) use redis::config::Tls;
use redis::config::{ClusterSeeds, Topology};

pub(crate) enum Backend {
    /// A standalone server, a Redis Cluster, or the master Sentinels name.
    Redis(Box<redis::RedisBackend>),
    /// Independent masters.
    Redlock(Box<redlock::Redlock>),
    Memory(MemoryStore),
}

impl Backend {
    /// One Redis server; its writes count once `replicas` of its replicas acknowledged them.
    pub(crate) fn server(
        url: &str,
        tls: &Tls,
        timeouts: Timeouts,
        replicas: u32,
    ) -> Result<Self, LockError> {
        let client = tls.client(url, "server")?;
        Ok(Self::redis(
            Topology::Server(Box::new(client)),
            timeouts,
            replicas,
        ))
    }

    /// A Redis Cluster, found through these seeds.
    pub(crate) fn cluster(
        seeds: Vec<String>,
        tls: &Tls,
        timeouts: Timeouts,
    ) -> Result<Self, LockError> {
        let seeds = ClusterSeeds::parse(seeds, tls)?;
        Ok(Self::redis(Topology::Cluster(seeds), timeouts, 0))
    }

    /// The master these sentinels name for the service `master`; its writes count once
    /// `replicas` of its replicas acknowledged them.
    pub(crate) fn sentinel(
        master: &str,
        sentinels: Vec<String>,
        tls: &Tls,
        timeouts: Timeouts,
        replicas: u32,
    ) -> Result<Self, LockError> {
        let setup = redis::config::sentinel_setup(master, sentinels, tls)?;
        Ok(Self::redis(Topology::Sentinel(setup), timeouts, replicas))
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

    fn redis(topology: Topology, timeouts: Timeouts, replicas: u32) -> Self {
        Self::Redis(Box::new(redis::RedisBackend::new(
            topology, timeouts, replicas,
        )))
    }

    /// Where this backend's background work runs.
    pub(crate) fn home(&self) -> Home {
        match self {
            Self::Memory(_) => Home::Caller,
            Self::Redis(_) | Self::Redlock(_) => Home::Io,
        }
    }

    /// How many replicas must acknowledge each acquisition and renewal (0: none).
    pub(crate) fn confirm_replicas(&self) -> u32 {
        match self {
            Self::Redis(n) => n.confirm_replicas(),
            Self::Redlock(_) | Self::Memory(_) => 0,
        }
    }

    /// Whether a failed attempt is taken back in the background (Redlock's undo). The next
    /// attempt then needs a token of its own: with the same one, a late undo could delete what
    /// it won.
    pub(crate) fn undoes_failed_attempts(&self) -> bool {
        matches!(self, Self::Redlock(_))
    }

    /// Whether fencing tokens are offered: everywhere but on Redlock, whose independent
    /// counters cannot promise a number that only grows.
    pub(crate) fn offers_fencing(&self) -> bool {
        !matches!(self, Self::Redlock(_))
    }

    /// Whether a release hands the lock straight to the oldest waiter that queued up: memory,
    /// and a single deployment's Redis without `confirm_replicas` (see
    /// `RedisBackend::hands_over`).
    pub(crate) fn hands_over(&self) -> bool {
        match self {
            Self::Redis(n) => n.hands_over(),
            Self::Memory(_) => true,
            Self::Redlock(_) => false,
        }
    }

    /// Whether keys must keep the lock, its counter and its channel in one hash slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Redis(n) if n.is_cluster())
    }
}

/// Runs `$call` on whichever store `$backend` is.
macro_rules! each {
    ($backend:expr, $store:ident => $call:expr) => {
        match $backend {
            Backend::Redis($store) => $call,
            Backend::Redlock($store) => $call,
            Backend::Memory($store) => $call,
        }
    };
}

impl Backend {
    /// An operator's force-unlock of `token`'s lock: on Redlock, answered by every node that
    /// answers in time, not only a quorum (see [`redlock::Redlock::release_everywhere`]).
    pub(crate) async fn release_everywhere(
        &self,
        key: &LockKey,
        token: &str,
        share: Share,
    ) -> Result<bool, LockError> {
        match self {
            Self::Redlock(r) => r.release_everywhere(key, token, share).await,
            other => other.release(key, token, share).await,
        }
    }
}

impl Store for Backend {
    fn node(&self) -> &str {
        each!(self, s => s.node())
    }

    fn hub(&self) -> &WaitHub {
        each!(self, s => s.hub())
    }

    async fn acquire(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        each!(self, s => s.acquire(attempt).await)
    }

    async fn release(&self, key: &LockKey, token: &str, share: Share) -> Result<bool, LockError> {
        each!(self, s => s.release(key, token, share).await)
    }

    async fn renew(
        &self,
        batch: &[Renewal<'_>],
        budget: Duration,
    ) -> Result<Vec<Option<Renewed>>, LockError> {
        each!(self, s => s.renew(batch, budget).await)
    }

    async fn inspect(&self, key: &LockKey) -> Result<LockInfo, LockError> {
        each!(self, s => s.inspect(key).await)
    }

    async fn announce_taken(&self, key: &LockKey) -> Result<(), LockError> {
        each!(self, s => s.announce_taken(key).await)
    }

    async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        each!(self, s => s.force_unlock(key).await)
    }
}
