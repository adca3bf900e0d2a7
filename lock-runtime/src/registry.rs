//! Registries: where locks are taken, and the process-wide default and named ones.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures_util::future::join_all;

use crate::backend::{Backend, LockInfo, MemoryStore, Tls};
use crate::keeper::Leases;
use crate::key::{self, LockKey};
use crate::lease::Lease;
use crate::lock::LockRequest;
use crate::timeouts::Timeouts;
use crate::{LockError, LostReason};

/// A place to take locks: one backend (a Redis server, or memory), a key prefix, and the lease
/// keeper that renews what this process holds there. Cheap to clone; clones share everything.
///
/// The connections, the keeper and the notification subscriber are started on first use. For
/// Redis they run on the library's own I/O thread, so one registry serves every Tokio runtime
/// of the process, one after the other or at the same time (one per `#[tokio::test]`).
#[derive(Clone)]
pub struct Registry {
    pub(crate) inner: Arc<RegistryInner>,
}

pub(crate) struct RegistryInner {
    pub(crate) backend: Backend,
    pub(crate) prefix: String,
    pub(crate) leases: Leases,
    next_id: AtomicU64,
    timeouts: Timeouts,
    shut_down: AtomicBool,
}

impl RegistryInner {
    /// The Redis names of `key` under this registry's prefix and deployment.
    pub(crate) fn lock_key(&self, key: String) -> Result<LockKey, LockError> {
        LockKey::new(&self.prefix, key, self.backend.is_cluster())
    }

    pub(crate) fn next_lease_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether this registry's work runs on its callers' runtime: only in memory, where leases
    /// follow that runtime's clock (which a test may pause). Redis work runs on the I/O runtime.
    pub(crate) fn on_caller_runtime(&self) -> bool {
        self.backend.home() == crate::io::Home::Caller
    }

    /// Runs background work (the keeper, renewal batches, a dropped guard's release) where it
    /// cannot die with a caller's runtime: on the I/O runtime for Redis. An in-memory registry
    /// keeps it on the calling runtime instead, because its leases follow that runtime's clock
    /// (which a test may pause); its keeper restarts on the next runtime if that one is gone.
    pub(crate) fn spawn_background<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.backend.home().spawn(task);
    }

    /// Refuses a new acquisition once [`Registry::shutdown`] has begun.
    pub(crate) fn ensure_open(&self, key: &str) -> Result<(), LockError> {
        if self.shut_down.load(Ordering::SeqCst) {
            return Err(LockError::ShutDown {
                key: key.to_owned(),
            });
        }
        Ok(())
    }

    /// Hands a freshly acquired lease to the keeper, unless a shutdown began meanwhile: then the
    /// lock is given back and the acquisition refused.
    pub(crate) async fn admit(self: &Arc<Self>, lease: &Arc<Lease>) -> Result<(), LockError> {
        self.leases.insert(lease.clone(), self);
        // Inserted before reading the flag, and `shutdown` sets the flag before collecting the
        // leases: either the shutdown sees this lease, or this reads the flag set.
        if !self.shut_down.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.leases.begin_release(lease.id);
        let bound = self.timeouts.connect + self.timeouts.command;
        // A failed release leaves the lock to its ttl, as a shutdown does.
        let _ = tokio::time::timeout(bound, self.backend.release(&lease.key, &lease.token)).await;
        self.leases.remove(lease.id);
        Err(LockError::ShutDown {
            key: lease.key.key.clone(),
        })
    }
}

impl Drop for RegistryInner {
    fn drop(&mut self) {
        // Lets a sleeping keeper notice at once that its registry is gone.
        self.leases.wake.notify_one();
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The node is `host:port`: credentials never reach Debug output.
        f.debug_struct("Registry")
            .field("node", &self.inner.backend.node())
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Registry`].
///
/// ```
/// use std::time::Duration;
/// let registry = lock_runtime::Registry::builder()
///     .url("redis://127.0.0.1:6379/")
///     .prefix("billing-lock:")
///     .connect_timeout(Duration::from_secs(1))
///     .build()
///     .unwrap();
/// assert_eq!(registry.redis_key("invoice:9"), "billing-lock:invoice:9");
/// ```
#[derive(Debug, Default)]
#[must_use]
pub struct RegistryBuilder {
    mode: Mode,
    tls: Tls,
    prefix: Option<String>,
    connect_timeout: Option<Duration>,
    command_timeout: Option<Duration>,
}

#[derive(Debug, Default)]
enum Mode {
    #[default]
    Unset,
    Server(String),
    Cluster(Vec<String>),
    Redlock(Vec<String>),
    Sentinel {
        master: String,
        sentinels: Vec<String>,
    },
    Memory(MemoryStore),
}

impl RegistryBuilder {
    /// One Redis server: `redis://[user:password@]host:port[/db]` (ACL user and password go in
    /// the URL), or `rediss://` for TLS when the `tls` feature is on.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.mode = Mode::Server(url.into());
        self
    }

    /// A Redis Cluster, found through these seed nodes (any reachable master or replica). An
    /// empty entry is refused by [`build`](Self::build), naming its position.
    pub fn cluster<S: Into<String>>(mut self, seeds: impl IntoIterator<Item = S>) -> Self {
        self.mode = Mode::Cluster(seeds.into_iter().map(Into::into).collect());
        self
    }

    /// Redlock over these independent masters (use 3 or 5): a lock is held when a majority
    /// granted it. No fencing tokens in this mode.
    ///
    /// [`build`](Self::build) refuses fewer than 3 nodes (a majority of 1 or 2 is every node,
    /// so any failure stops locking: use [`url`](Self::url) for one server), a server listed
    /// twice (also under another database: it would vote twice), and an empty entry.
    pub fn redlock<S: Into<String>>(mut self, nodes: impl IntoIterator<Item = S>) -> Self {
        self.mode = Mode::Redlock(nodes.into_iter().map(Into::into).collect());
        self
    }

    /// The master that these Redis Sentinels name for the service `master`, followed across
    /// failovers.
    ///
    /// `master` is the service's name (`mymaster`), or a URL whose host is that name and which
    /// carries the master's login and database: `redis://user:password@mymaster/2`. Each
    /// sentinel is `redis://[user:password@]host:port` (the first one's login is used for all).
    /// TLS is not offered in this mode.
    ///
    /// ```
    /// let registry = lock_runtime::Registry::builder()
    ///     .sentinel("mymaster", ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"])
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(registry.node(), "sentinel mymaster via 10.0.0.1:26379,10.0.0.2:26379");
    /// ```
    pub fn sentinel<S: Into<String>>(
        mut self,
        master: impl Into<String>,
        sentinels: impl IntoIterator<Item = S>,
    ) -> Self {
        self.mode = Mode::Sentinel {
            master: master.into(),
            sentinels: sentinels.into_iter().map(Into::into).collect(),
        };
        self
    }

    /// An in-process store instead of Redis (see [`MemoryStore`]).
    pub fn memory(mut self, store: MemoryStore) -> Self {
        self.mode = Mode::Memory(store);
        self
    }

    /// Trust this CA (PEM) for `rediss://` connections instead of the system's roots.
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_cert(pem.into());
        self
    }

    /// Present this client certificate and key (PEM) for mutual TLS.
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client_cert(cert_pem.into(), key_pem.into());
        self
    }

    /// The prefix of every lock key (default `lock:`), which keeps locks apart from application
    /// data. A service in another language locking the same resource uses the prefixed key.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// How long connecting to Redis may take before the operation fails (default 2 s).
    ///
    /// Zero is refused by [`build`](Self::build) (every connection would fail at once). Longer
    /// than a day is taken as one day, so `Duration::MAX` reads as "as long as it takes" and the
    /// deadlines derived from it never overflow.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// How long one command may take before it fails (default 2 s).
    ///
    /// Zero is refused and more than a day is taken as one day, as for
    /// [`connect_timeout`](Self::connect_timeout).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = Some(timeout);
        self
    }

    /// Builds the registry. Nothing connects yet: the first lock does.
    ///
    /// # Errors
    /// [`LockError::NotConfigured`] when no backend was chosen; [`LockError::Backend`] when a
    /// URL cannot be parsed (the message never repeats the URL, which may hold a password), a
    /// node list has an empty entry, or a Redlock has fewer than 3 distinct servers;
    /// [`LockError::InvalidKey`] for a prefix that could collide with fencing counters;
    /// [`LockError::Backend`] (command `configure`) for a zero timeout.
    pub fn build(self) -> Result<Registry, LockError> {
        let prefix = self.prefix.unwrap_or_else(|| "lock:".to_owned());
        key::validate_prefix(&prefix)?;
        let timeouts = Timeouts::new(self.connect_timeout, self.command_timeout)?;
        let backend = match self.mode {
            Mode::Unset => return Err(LockError::NotConfigured { registry: None }),
            Mode::Memory(store) => Backend::Memory(store),
            Mode::Server(url) => Backend::server(&url, &self.tls, timeouts)?,
            Mode::Cluster(seeds) => Backend::cluster(seeds, &self.tls, timeouts)?,
            Mode::Redlock(nodes) => Backend::redlock(nodes, &self.tls, timeouts)?,
            Mode::Sentinel { master, sentinels } => {
                Backend::sentinel(&master, sentinels, timeouts)?
            }
        };
        Ok(Registry {
            inner: Arc::new(RegistryInner {
                backend,
                prefix,
                leases: Leases::default(),
                next_id: AtomicU64::new(1),
                timeouts,
                shut_down: AtomicBool::new(false),
            }),
        })
    }
}

/// A lock this process holds, as listed by [`Registry::held`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    /// The key as given.
    pub key: String,
    /// The fencing token, if taken with fencing.
    pub fence: Option<u64>,
    /// How long it has been held.
    pub held_for: Duration,
    /// Whether the lease is lost.
    pub lost: bool,
}

impl Registry {
    /// Starts a [`RegistryBuilder`].
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// A registry on one Redis server, with the default prefix and timeouts.
    ///
    /// # Errors
    /// See [`RegistryBuilder::build`].
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Self::builder().url(url).build()
    }

    /// A registry from the environment, with no code change between deployments:
    ///
    /// | variable | mode |
    /// |---|---|
    /// | `LOCK_REDIS_SENTINEL=redis://s1:26379,redis://s2:26379` with `LOCK_REDIS_SENTINEL_MASTER=mymaster` | the master these Sentinels name (see [`RegistryBuilder::sentinel`]) |
    /// | `LOCK_REDIS_CLUSTER=redis://a:7000,redis://b:7001` | Redis Cluster through these seeds |
    /// | `LOCK_REDIS_URL=redis://a:6379,redis://b:6379,redis://c:6379` | Redlock over these masters |
    /// | `LOCK_REDIS_URL=redis://a:6379` (else `REDIS_URL`) | one Redis server |
    ///
    /// An empty entry in a comma list (`redis://a:6379,`) is an error naming its position, never
    /// skipped: a stray comma must not turn one server into a Redlock.
    ///
    /// # Errors
    /// [`LockError::NotConfigured`] when none is set; see [`RegistryBuilder::build`].
    pub fn from_env() -> Result<Self, LockError> {
        let var = |name| {
            std::env::var(name)
                .ok()
                .filter(|v: &String| !v.trim().is_empty())
        };
        let list = |v: String| v.split(',').map(str::to_owned).collect::<Vec<_>>();
        if let Some(sentinels) = var("LOCK_REDIS_SENTINEL") {
            let master = var("LOCK_REDIS_SENTINEL_MASTER").ok_or_else(|| {
                LockError::configure(
                    "LOCK_REDIS_SENTINEL is set but LOCK_REDIS_SENTINEL_MASTER is not; set it \
                     to the service name the sentinels monitor (`mymaster`)"
                        .into(),
                )
            })?;
            return Self::builder().sentinel(master, list(sentinels)).build();
        }
        if let Some(seeds) = var("LOCK_REDIS_CLUSTER") {
            return Self::builder().cluster(list(seeds)).build();
        }
        let url = var("LOCK_REDIS_URL")
            .or_else(|| var("REDIS_URL"))
            .ok_or(LockError::NotConfigured { registry: None })?;
        if url.contains(',') {
            Self::builder().redlock(list(url)).build()
        } else {
            Self::from_url(&url)
        }
    }

    /// A registry on its own fresh [`MemoryStore`].
    #[must_use]
    pub fn in_memory() -> Self {
        Self::builder()
            .memory(MemoryStore::new())
            .build()
            .expect("the default prefix is valid")
    }

    /// Makes this the default registry, used by `#[distributed_lock]` without `registry = ..`
    /// and by [`registry()`]. Replaces any earlier default.
    pub fn install_default(&self) {
        *DEFAULT.write().unwrap_or_else(PoisonError::into_inner) = Some(self.clone());
    }

    /// Makes this the registry named `name` (`#[distributed_lock(registry = "name")]`).
    pub fn install_as(&self, name: &str) {
        NAMED
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(HashMap::new)
            .insert(name.to_owned(), self.clone());
    }

    /// Starts a lock request for `key` (the prefix is added for you).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// let registry = lock_runtime::Registry::in_memory();
    /// let guard = registry
    ///     .lock("deploy:42")
    ///     .ttl(Duration::from_secs(60))
    ///     .wait(Duration::from_secs(5))
    ///     .acquire()
    ///     .await?;
    /// assert_eq!(guard.redis_key(), "lock:deploy:42");
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.clone(), key.into())
    }

    /// The Redis key that holds `key`'s lock.
    #[must_use]
    pub fn redis_key(&self, key: &str) -> String {
        format!("{}{key}", self.inner.prefix)
    }

    /// The key prefix.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The node this registry talks to, as `host:port` (or `memory`).
    #[must_use]
    pub fn node(&self) -> &str {
        self.inner.backend.node()
    }

    /// Who holds `key` now, for how much longer, and its last fencing token.
    ///
    /// # Errors
    /// [`LockError::Backend`] when Redis fails; [`LockError::InvalidKey`] for a bad key.
    pub async fn inspect(&self, key: &str) -> Result<LockInfo, LockError> {
        let key = self.inner.lock_key(key.to_owned())?;
        self.inner.backend.inspect(&key).await
    }

    /// Deletes `key`'s lock whoever holds it, and wakes its waiters. For operators: the holder
    /// notices at its next renewal and, with `on_lost = "cancel"`, stops. Returns whether a lock
    /// was there.
    ///
    /// # Errors
    /// [`LockError::Backend`] when Redis fails; [`LockError::InvalidKey`] for a bad key.
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let key = self.inner.lock_key(key.to_owned())?;
        let existed = self.inner.backend.force_unlock(&key).await?;
        tracing::warn!(key = %crate::error::shown(&key.key), existed, "lock force-unlocked");
        Ok(existed)
    }

    /// Deletes `key`'s lock only if `owner` (a token as shown by [`inspect`](Self::inspect))
    /// still holds it, and wakes its waiters: an operator's force-unlock that cannot remove a
    /// lock that changed hands after they looked. Returns whether it deleted.
    ///
    /// # Errors
    /// [`LockError::Backend`] when Redis fails; [`LockError::InvalidKey`] for a bad key.
    pub async fn force_unlock_owned_by(&self, key: &str, owner: &str) -> Result<bool, LockError> {
        let key = self.inner.lock_key(key.to_owned())?;
        let deleted = self.inner.backend.release(&key, owner).await?;
        tracing::warn!(key = %crate::error::shown(&key.key), deleted, "lock force-unlocked (owner-checked)");
        Ok(deleted)
    }

    /// The locks this process holds through this registry.
    #[must_use]
    pub fn held(&self) -> Vec<HeldLock> {
        self.inner
            .leases
            .snapshot()
            .into_iter()
            .map(|lease| HeldLock {
                key: lease.key.key.clone(),
                fence: lease.fence,
                held_for: lease.confirmed_at.elapsed(),
                lost: lease.lost_reason().is_some(),
            })
            .collect()
    }

    /// Graceful shutdown: marks every held lease lost (guarded bodies with `on_lost = "cancel"`
    /// stop) and releases every lock on the server, all at once, waiting at most the connect
    /// timeout plus the command timeout for the whole (enough for one reconnection and one
    /// round of releases). Returns how many held locks are no longer held on the server
    /// afterwards (released here, or by their own body as it stopped); a lock whose release
    /// failed or did not finish in time is left to expire by its ttl and not counted.
    ///
    /// Afterwards this registry and all its clones take no new locks: acquisitions fail with
    /// [`LockError::ShutDown`] (one already waiting for a busy lock fails when it would have
    /// taken it, and gives it back). [`inspect`](Self::inspect) and the force-unlocks still
    /// work. A process that must keep locking builds a new registry.
    pub async fn shutdown(&self) -> usize {
        self.inner.shut_down.store(true, Ordering::SeqCst);
        let leases = self.inner.leases.stop_all();
        for lease in &leases {
            lease.mark_lost(LostReason::Shutdown);
        }
        let released = AtomicUsize::new(0);
        let releases = leases.iter().map(|lease| async {
            // `Ok(false)`: not ours any more, which is what shutdown wants too.
            if self
                .inner
                .backend
                .release(&lease.key, &lease.token)
                .await
                .is_ok()
            {
                released.fetch_add(1, Ordering::Relaxed);
            }
        });
        let bound = self.inner.timeouts.connect + self.inner.timeouts.command;
        if tokio::time::timeout(bound, join_all(releases))
            .await
            .is_err()
        {
            tracing::warn!(
                node = %self.node(),
                locks = leases.len(),
                released = released.load(Ordering::Relaxed),
                "shutdown gave up waiting for releases after {bound:?}; the rest expire by their ttl"
            );
        }
        for lease in &leases {
            self.inner.leases.remove(lease.id);
        }
        released.into_inner()
    }
}

static DEFAULT: RwLock<Option<Registry>> = RwLock::new(None);
static NAMED: RwLock<Option<HashMap<String, Registry>>> = RwLock::new(None);

/// The default registry: the one installed with [`Registry::install_default`], else one built
/// from `LOCK_REDIS_URL` (or `REDIS_URL`) on first use.
///
/// # Errors
/// [`LockError::NotConfigured`], saying what to set, when there is neither.
pub fn registry() -> Result<Registry, LockError> {
    if let Some(r) = DEFAULT
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
    {
        return Ok(r.clone());
    }
    let mut slot = DEFAULT.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(r) = slot.as_ref() {
        return Ok(r.clone());
    }
    let built = Registry::from_env()?;
    *slot = Some(built.clone());
    Ok(built)
}

/// The registry installed as `name` with [`Registry::install_as`].
///
/// # Errors
/// [`LockError::NotConfigured`] when none is installed under that name.
pub fn named(name: &str) -> Result<Registry, LockError> {
    NAMED
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .and_then(|m| m.get(name).cloned())
        .ok_or_else(|| LockError::NotConfigured {
            registry: Some(name.to_owned()),
        })
}
