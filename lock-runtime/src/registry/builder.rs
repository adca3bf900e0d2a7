//! Building a registry: which deployment, which prefix, which timeouts.

use std::sync::Arc;
use std::time::Duration;

use super::handle::Registry;
use crate::backend::{Backend, MemoryStore, Tls};
use crate::key;
use crate::state::RegistryInner;
use crate::timeouts::Timeouts;
use crate::LockError;

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

    /// A registry on its own fresh [`MemoryStore`].
    #[must_use]
    pub fn in_memory() -> Self {
        Self::builder()
            .memory(MemoryStore::new())
            .build()
            .expect("the default prefix is valid")
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
            inner: Arc::new(RegistryInner::new(backend, prefix, timeouts)),
        })
    }
}
