//! Where locks live: the stores behind the [`Store`] contract, and the [`Backend`] that the
//! registry, the keeper and the guards talk to, whichever store it is.

use std::time::Duration;

use crate::deployment::Deployment;
use crate::error::LockError;
use crate::io::Home;
use crate::key::LockKey;
use crate::options::Share;
use crate::timeouts::Timeouts;
use crate::waiting::WaitHub;

mod contract;
pub(crate) mod memory;
pub(crate) mod notification;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod redis;
pub(crate) mod redlock;
pub(crate) mod tls;

pub(crate) use contract::{ttl_ms, Acquire, Attempt, Renewal, Renewed, Store, NOTE_HELD_EVERY};
pub use contract::{LockInfo, Permits, Place};
pub use memory::MemoryStore;
use redis::config::{ClusterSeeds, Topology};
pub(crate) use tls::Tls;

/// Declares the stores, once: the [`Backend`] that dispatches to whichever one a registry
/// was built on, and `each!`, which runs one call on it. A new store is one line here.
/// A store behind a feature names it (`#[cfg(feature = "...")]`, after its doc).
macro_rules! stores {
    ($d:tt $($(#[doc = $doc:literal])* $(#[cfg($cfg:meta)])? $variant:ident($store:ty),)+) => {
        pub(crate) enum Backend {
            $($(#[doc = $doc])* $(#[cfg($cfg)])? $variant($store),)+
        }

        /// Runs `$call` on whichever store `$backend` is.
        macro_rules! each {
            ($d backend:expr, $d s:ident => $d call:expr) => {
                match $d backend {
                    $($(#[cfg($cfg)])? Backend::$variant($d s) => $d call,)+
                }
            };
        }
    };
}

stores! { $
    /// A standalone server, a Redis Cluster, or the master Sentinels name.
    Redis(Box<redis::RedisBackend>),
    /// Independent masters.
    Redlock(Box<redlock::Redlock>),
    Memory(MemoryStore),
    /// One Postgres database.
    #[cfg(feature = "postgres")]
    Postgres(Box<postgres::PostgresStore>),
}

impl Backend {
    /// The store for `deployment`; its writes count once `replicas` replicas acknowledged
    /// them (where the deployment has replicas to confirm with: the builder refuses the rest).
    pub(crate) fn open(
        deployment: Deployment,
        tls: &Tls,
        timeouts: Timeouts,
        replicas: u32,
    ) -> Result<Self, LockError> {
        match deployment {
            Deployment::Server(url) => Self::server(&url, tls, timeouts, replicas),
            Deployment::Cluster(seeds) => Self::cluster(seeds, tls, timeouts),
            Deployment::Redlock(nodes) => Self::redlock(nodes, tls, timeouts),
            Deployment::Sentinel { master, sentinels } => {
                Self::sentinel(&master, sentinels, tls, timeouts, replicas)
            }
            Deployment::Postgres { url, listen } => {
                Self::postgres(&url, listen.as_deref(), tls, timeouts)
            }
        }
    }

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

    /// One Postgres database.
    #[cfg(feature = "postgres")]
    fn postgres(
        url: &str,
        listen: Option<&str>,
        tls: &Tls,
        timeouts: Timeouts,
    ) -> Result<Self, LockError> {
        Ok(Self::Postgres(Box::new(postgres::PostgresStore::new(
            url, listen, timeouts, tls,
        )?)))
    }

    #[cfg(not(feature = "postgres"))]
    fn postgres(_: &str, _: Option<&str>, _: &Tls, _: Timeouts) -> Result<Self, LockError> {
        Err(LockError::config(
            "a Postgres deployment needs lock-runtime's `postgres` feature: turn it on in \
             Cargo.toml (`lock-runtime = { version = \"0.1\", features = [\"postgres\"] }`)",
        ))
    }

    fn redis(topology: Topology, timeouts: Timeouts, replicas: u32) -> Self {
        Self::Redis(Box::new(redis::RedisBackend::new(
            topology, timeouts, replicas,
        )))
    }
}

impl Store for Backend {
    fn node(&self) -> &str {
        each!(self, s => s.node())
    }

    fn hub(&self) -> &WaitHub {
        each!(self, s => s.hub())
    }

    fn home(&self) -> Home {
        each!(self, s => s.home())
    }

    fn admit(&self, key: &LockKey) -> Result<(), LockError> {
        each!(self, s => s.admit(key))
    }

    fn offers_fencing(&self) -> bool {
        each!(self, s => s.offers_fencing())
    }

    fn hands_over(&self) -> bool {
        each!(self, s => s.hands_over())
    }

    fn stands_aside(&self) -> bool {
        each!(self, s => s.stands_aside())
    }

    fn undoes_failed_attempts(&self) -> bool {
        each!(self, s => s.undoes_failed_attempts())
    }

    fn confirm_replicas(&self) -> u32 {
        each!(self, s => s.confirm_replicas())
    }

    fn checks_transactions(&self) -> bool {
        each!(self, s => s.checks_transactions())
    }

    async fn release_everywhere(
        &self,
        key: &LockKey,
        token: &str,
        share: Share,
    ) -> Result<bool, LockError> {
        each!(self, s => s.release_everywhere(key, token, share).await)
    }

    async fn acquire(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        each!(self, s => s.acquire(attempt).await)
    }

    async fn release(&self, key: &LockKey, token: &str, share: Share) -> Result<bool, LockError> {
        each!(self, s => s.release(key, token, share).await)
    }

    async fn release_to(
        &self,
        key: &LockKey,
        token: &str,
        successor: &str,
    ) -> Result<Option<bool>, LockError> {
        if key.is_multi() {
            // Elections hold one key: a lock of several has no successor to name.
            let released = self.release(key, token, Share::Exclusive).await?;
            return Ok(released.then_some(false));
        }
        each!(self, s => s.release_to(key, token, successor).await)
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
