//! Building a registry: which deployment, which prefix, which timeouts.

use std::sync::Arc;
use std::time::Duration;

use super::handle::Registry;
use crate::backend::{Backend, MemoryStore, Tls};
use crate::deployment::Deployment;
use crate::error::LockError;
use crate::names;
use crate::state::RegistryInner;
use crate::timeouts::Timeouts;

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
    name: Option<String>,
    identity: Option<String>,
    connect_timeout: Option<Duration>,
    command_timeout: Option<Duration>,
    confirm_replicas: u32,
}

#[derive(Debug, Default)]
enum Mode {
    #[default]
    Unset,
    Deployment(Deployment),
    Memory(MemoryStore),
}

impl RegistryBuilder {
    /// One Redis server: `redis://[user:password@]host:port[/db]` (ACL user and password go in
    /// the URL), or `rediss://` for TLS when the `tls` feature is on.
    pub fn url(self, url: impl Into<String>) -> Self {
        self.deployment(Deployment::Server(url.into()))
    }

    /// One Postgres database (`postgres://user:password@host:5432/database`, or libpq's
    /// `key=value` form): locks are leases in the schema `distributed_lock`, created on first
    /// use if missing (or beforehand by `lockctl schema`), with deadlines on the database's
    /// clock; waiters are woken by `LISTEN/NOTIFY` on a connection of their own. Needs the
    /// `postgres` feature (without it, [`build`](Self::build) says so).
    ///
    /// **TLS** (the `postgres-tls` feature) where the connection string says `sslmode=require`
    /// (libpq's `verify-full` and `verify-ca` read as it): rustls always checks the server's
    /// certificate, against [`tls_root_cert`](Self::tls_root_cert) or the system's roots, and
    /// that it names the host; [`tls_client_cert`](Self::tls_client_cert) is presented when
    /// given. Any other `sslmode`, or none, is plain TCP: never TLS with a certificate left
    /// unchecked (libpq's default `prefer`).
    ///
    /// Waiters listen on the same database; behind PgBouncer in transaction mode, see
    /// [`postgres_pooled`](Self::postgres_pooled).
    pub fn postgres(self, url: impl Into<String>) -> Self {
        self.deployment(Deployment::Postgres {
            url: url.into(),
            listen: None,
        })
    }

    /// One Postgres database behind a pooler in transaction mode (PgBouncer): statements go to
    /// `url`, the pooler (each is one transaction, with unnamed statements, so any server
    /// connection serves it); waiters `LISTEN` on `listen_url`, which must keep a session:
    /// the database itself, or a pooler in session mode. (`LISTEN` through transaction mode
    /// would be lost when its server connection returns to the pool; waiters would then only
    /// back off and try again.)
    pub fn postgres_pooled(self, url: impl Into<String>, listen_url: impl Into<String>) -> Self {
        self.deployment(Deployment::Postgres {
            url: url.into(),
            listen: Some(listen_url.into()),
        })
    }

    /// Any [`Deployment`], as [`Deployment::from_vars`] reads one (or as the methods that name
    /// one build it).
    pub fn deployment(mut self, deployment: Deployment) -> Self {
        self.mode = Mode::Deployment(deployment);
        self
    }

    /// A Redis Cluster, found through these seed nodes (any reachable master or replica). An
    /// empty entry is refused by [`build`](Self::build), naming its position.
    pub fn cluster<S: Into<String>>(self, seeds: impl IntoIterator<Item = S>) -> Self {
        self.deployment(Deployment::Cluster(
            seeds.into_iter().map(Into::into).collect(),
        ))
    }

    /// Redlock over these independent masters (use 3 or 5): a lock is held when a majority
    /// granted it. No fencing tokens in this mode.
    ///
    /// [`build`](Self::build) refuses fewer than 3 nodes (a majority of 1 or 2 is every node,
    /// so any failure stops locking: use [`url`](Self::url) for one server), a server listed
    /// twice (also under another database: it would vote twice), and an empty entry.
    pub fn redlock<S: Into<String>>(self, nodes: impl IntoIterator<Item = S>) -> Self {
        self.deployment(Deployment::Redlock(
            nodes.into_iter().map(Into::into).collect(),
        ))
    }

    /// The master that these Redis Sentinels name for the service `master`, followed across
    /// failovers.
    ///
    /// `master` is the service's name (`mymaster`), or a URL whose host is that name and which
    /// carries the master's login and database: `redis://user:password@mymaster/2`. Each
    /// sentinel is `redis://[user:password@]host:port` (the first one's login is used for all).
    ///
    /// **TLS** (the `tls` feature; without it a `rediss://` URL is refused by
    /// [`build`](Self::build), naming the feature):
    /// - the sentinels are reached over TLS when their URLs are `rediss://`: all of them or
    ///   none (a mix is refused);
    /// - the master (and so every server the registry locks on, across failovers) follows the
    ///   sentinels when `master` is a plain name. A master URL decides for itself:
    ///   `rediss://user:password@mymaster` for TLS, `redis://..` for plain TCP, whatever the
    ///   sentinels speak;
    /// - [`tls_root_cert`](Self::tls_root_cert) and [`tls_client_cert`](Self::tls_client_cert)
    ///   apply to both, as a deployment shares one CA (without them, the system's roots).
    ///
    /// The master's certificate is checked against the address the sentinels announce for it:
    /// an IP address unless the sentinels run with `sentinel announce-hostnames yes`, so the
    /// certificate must name that address. A server configured with `tls-replication yes` is
    /// what makes its replicas and sentinels talk TLS to it.
    ///
    /// ```
    /// let registry = lock_runtime::Registry::builder()
    ///     .sentinel("mymaster", ["rediss://10.0.0.1:26379", "rediss://10.0.0.2:26379"])
    ///     // .tls_root_cert(ca_pem) for a private CA
    ///     .build();
    /// # #[cfg(feature = "tls")]
    /// # assert!(registry.is_ok());
    /// # #[cfg(not(feature = "tls"))]
    /// # assert!(registry.unwrap_err().to_string().contains("`tls` feature"));
    /// ```
    ///
    /// ```
    /// let registry = lock_runtime::Registry::builder()
    ///     .sentinel("mymaster", ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"])
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(registry.node(), "sentinel mymaster via 10.0.0.1:26379,10.0.0.2:26379");
    /// ```
    pub fn sentinel<S: Into<String>>(
        self,
        master: impl Into<String>,
        sentinels: impl IntoIterator<Item = S>,
    ) -> Self {
        self.deployment(Deployment::Sentinel {
            master: master.into(),
            sentinels: sentinels.into_iter().map(Into::into).collect(),
        })
    }

    /// An in-process store instead of Redis (see [`MemoryStore`]).
    pub fn memory(mut self, store: MemoryStore) -> Self {
        self.mode = Mode::Memory(store);
        self
    }

    /// Trust this CA (PEM) for `rediss://` connections instead of the system's roots: the
    /// server, every cluster node or Redlock node, and in Sentinel mode the sentinels and the
    /// master they name (see [`sentinel`](Self::sentinel)). `redis://` URLs stay plain. On
    /// Postgres, for connection strings with `sslmode=require` (see [`postgres`](Self::postgres)).
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_cert(pem.into());
        self
    }

    /// Present this client certificate and key (PEM) for mutual TLS, on every `rediss://`
    /// connection (in Sentinel mode, to the sentinels and the master alike), and on Postgres
    /// connections with `sslmode=require`.
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

    /// What metrics (the `metrics` feature) call this registry: their `registry` label. Without
    /// it, a registry is called by the name it was first installed under with
    /// [`Registry::install_as`] before its first lock, else `default`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Who this process is in the elections it campaigns in through this registry (its
    /// address, say), as observers see it: the default of
    /// [`Election::identity`](crate::Election::identity), and the identity of every
    /// `#[distributed_lock(leader = true)]` fn on the registry. Without it, `host:pid`.
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
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

    /// Counts an acquisition or a renewal only once `replicas` replicas of the master
    /// acknowledged it (Redis `WAIT`), so that a failover cannot promote a replica that lets a
    /// lock go while its holder still believes it holds it. `0` (the default) turns it off. For
    /// one server with replicas ([`url`](Self::url)) and Sentinel ([`sentinel`](Self::sentinel));
    /// [`build`](Self::build) refuses it for other modes.
    ///
    /// **What it closes.** Replication is asynchronous. When a master is cut off from the
    /// sentinels and its replicas but not from a lock holder, the sentinels promote a replica,
    /// which lets the key expire and grants the lock to a second client, while the first renews
    /// on the old master with success and never learns it (shown by
    /// `deployments::sentinel::a_holder_cut_off_with_its_old_master_renews_there_unaware_while_the_promoted_replica_grants_the_lock_again`).
    /// With this option such renewals are not confirmed, so the holder's lease runs out at its
    /// deadline (with `on_lost = "cancel"` its body is dropped) before the replica's copy of the
    /// key expires: Redis 7 replicates expiries as absolute times (`SET .. PX` as `PXAT`,
    /// `PEXPIRE` as `PEXPIREAT`), and the deadline counts only confirmed writes. Shown by
    /// `deployments::sentinel::a_holder_that_confirms_with_the_replica_is_lost_before_the_promoted_replica_grants_the_lock_again`.
    ///
    /// **What it needs.** The replica that is promoted must be one that acknowledged: ask for
    /// every replica that may be promoted (with fewer, a replica that missed the write can still
    /// win the election). The replicas' clocks must not run ahead of the master's by more than
    /// the drift allowance (1 % of the ttl + 2 ms). The ACL needs `+wait`.
    ///
    /// **What it costs.** Each acquisition and each renewal batch waits for the replicas' round
    /// trip, on a connection of its own (a `WAIT` blocks its connection; writes asked for while
    /// one is pending share the next one). Locking stops while fewer than `replicas` replicas
    /// answer, right after a failover too, until a replica has joined the new master. An
    /// acquisition that is not acknowledged within ttl/5 is released and retried within
    /// `wait`, then fails naming the key, the node and the count; a renewal that is not
    /// acknowledged within ttl/6 is retried, never turned into a delete, and the lease is lost
    /// at its deadline (both waits at most half the command timeout).
    ///
    /// **Or on the server: `min-replicas-to-write`.** A master configured with
    /// `min-replicas-to-write 1` and `min-replicas-max-lag 10` refuses writes once no replica
    /// has acknowledged for 10 s: that bounds the time a cut-off master goes on renewing, for
    /// every client and at no cost per command, but the lag is counted in whole seconds from
    /// replica pings, so a second holder can still get in for up to about that long. Use the
    /// server setting to bound the window for all clients; use `confirm_replicas` when the lock
    /// must never be held twice across a failover (fencing tokens remain the way to make a late
    /// write harmless).
    ///
    /// ```
    /// let registry = lock_runtime::Registry::builder()
    ///     .sentinel("mymaster", ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"])
    ///     .confirm_replicas(1)
    ///     .build()
    ///     .unwrap();
    /// # let _ = registry;
    /// // A cluster is refused: its renewals go straight to each master, unconfirmed.
    /// let refused = lock_runtime::Registry::builder()
    ///     .cluster(["redis://10.0.0.1:7000"])
    ///     .confirm_replicas(1)
    ///     .build()
    ///     .unwrap_err();
    /// assert!(refused.to_string().contains("confirm_replicas"));
    /// ```
    ///
    /// From the environment: `LOCK_REDIS_CONFIRM_REPLICAS=1` (see [`Registry::from_env`]).
    pub fn confirm_replicas(mut self, replicas: u32) -> Self {
        self.confirm_replicas = replicas;
        self
    }

    /// Builds the registry. Nothing connects yet: the first lock does.
    ///
    /// # Errors
    /// [`LockError::NotConfigured`] when no backend was chosen; [`LockError::Backend`] when a
    /// URL cannot be parsed (the message never repeats the URL, which may hold a password), a
    /// node list has an empty entry, or a Redlock has fewer than 3 distinct servers;
    /// [`LockError::InvalidKey`] for a prefix that could collide with fencing counters;
    /// [`LockError::Backend`] (command `configure`) for a zero timeout, and for
    /// [`confirm_replicas`](Self::confirm_replicas) in a mode other than one server or Sentinel.
    pub fn build(self) -> Result<Registry, LockError> {
        let prefix = self.prefix.unwrap_or_else(|| "lock:".to_owned());
        names::validate_prefix(&prefix)?;
        let timeouts = Timeouts::new(self.connect_timeout, self.command_timeout)?;
        let replicas = self.confirm_replicas;
        if replicas > 0 {
            let why = match &self.mode {
                Mode::Deployment(Deployment::Cluster(_)) => Some(
                    "a Redis Cluster's renewals go straight to each master and are not \
                     confirmed yet; use `min-replicas-to-write` on its masters instead",
                ),
                Mode::Deployment(Deployment::Redlock(_)) => Some(
                    "Redlock's nodes are independent masters without failover: a node that \
                     restarts without persistence must stay down for one max ttl instead",
                ),
                Mode::Memory(_) => Some("an in-memory store has no replicas"),
                Mode::Deployment(Deployment::Postgres { .. }) => Some(
                    "Postgres confirms its own writes to replicas: set `synchronous_commit` and \
                     `synchronous_standby_names` on the server",
                ),
                _ => None,
            };
            if let Some(why) = why {
                return Err(LockError::config(format!(
                    "`confirm_replicas({replicas})` applies to a single server with replicas or \
                     to Sentinel: {why}; remove the option (or LOCK_REDIS_CONFIRM_REPLICAS)"
                )));
            }
        }
        let backend = match self.mode {
            Mode::Unset => return Err(LockError::NotConfigured { registry: None }),
            Mode::Memory(store) => Backend::Memory(store),
            Mode::Deployment(deployment) => {
                Backend::open(deployment, &self.tls, timeouts, replicas)?
            }
        };
        Ok(Registry {
            inner: Arc::new(RegistryInner::new(
                backend,
                prefix,
                timeouts,
                self.name,
                self.identity,
            )),
        })
    }
}
