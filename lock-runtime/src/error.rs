//! The one error type of the crate.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Everything that can go wrong while taking, keeping or giving back a lock.
///
/// Every message names the key (and the node, for backend failures) and says what to do next.
/// The type is `Clone` so one loss can be reported to every party that watches the lease.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another owner holds the lock and it did not become free within `wait`.
    #[error(
        "lock `{}` is busy: another owner holds it{}; raise `wait` to wait for it, or retry later",
        shown(key),
        retry_hint(*retry_after)
    )]
    Busy {
        /// The key as given (without the registry prefix).
        key: String,
        /// The holder's remaining lease when last seen: the longest a retry may have to wait
        /// (`None` when the key has no expiry, e.g. a foreign lock without a TTL).
        retry_after: Option<Duration>,
    },
    /// The lease could not be kept: the lock may now be held by someone else.
    #[error(
        "lost the lock `{}`: {reason}; work done after this point may overlap the next holder's, \
         so guard writes with fencing tokens (`fencing = true`)",
        shown(key)
    )]
    Lost {
        /// The key as given.
        key: String,
        /// Why the lease ended.
        reason: LostReason,
    },
    /// The lock is not (or no longer) held with this owner's token; nothing was changed.
    #[error(
        "lock `{}` is not held by this owner (it expired or another owner took it); \
         nothing was released or extended",
        shown(key)
    )]
    NotOwner {
        /// The key as given.
        key: String,
    },
    /// The backend failed: unreachable, timed out, or answered with an error.
    #[error(
        "node {node} failed `{command}`{}: {message}; check that the server is reachable \
         and that this user may run the command",
        for_key(key.as_deref())
    )]
    Backend {
        /// Which node (`host:port`, never credentials).
        node: String,
        /// Which operation (`connect`, `acquire`, `release`, `renew`, ...).
        command: &'static str,
        /// The key concerned, when there is one.
        key: Option<String>,
        /// What the node or the client library said.
        message: String,
        /// The store's client error, when there is one.
        #[source]
        source: Option<StoreError>,
    },
    /// No registry is installed under that name and none can be built from the environment.
    #[error("{}", not_configured(registry.as_deref()))]
    NotConfigured {
        /// The registry's name, `None` for the default registry.
        registry: Option<String>,
    },
    /// The key cannot be used as a lock key.
    #[error("invalid lock key `{}`: {reason}", shown(key))]
    InvalidKey {
        /// The key as given (shown shortened and escaped in the message).
        key: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The registry was shut down ([`Registry::shutdown`](crate::Registry::shutdown)): it, and
    /// every clone of it, takes no new locks.
    #[error(
        "lock `{}` was not taken: its registry was shut down and takes no new locks; build a new \
         registry (and install it) if this process must keep locking",
        shown(key)
    )]
    ShutDown {
        /// The key as given.
        key: String,
    },
    /// The options of a lock request contradict each other or are out of range.
    #[error("invalid options for lock `{}`: {reason}", shown(key))]
    InvalidOptions {
        /// The key as given.
        key: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// An election's leader named a successor ([`Election::hand_over`](crate::Election::hand_over))
    /// that is not waiting in line: nothing changed, the leader leads on.
    #[error(
        "cannot hand the term of election `{}` to {candidate:?}: it is not waiting in line (see \
         `Election::in_line`, or `lockctl leader`); name a candidate that campaigns, or step down",
        shown(key)
    )]
    NotInLine {
        /// The election's key.
        key: String,
        /// The identity named.
        candidate: String,
    },
    /// The registry's configuration cannot be used (a bad or empty URL, a zero timeout, a
    /// Redlock of too few or duplicate nodes, an option the deployment does not have): found
    /// while building the registry, before any server is contacted.
    #[error("invalid lock registry configuration: {reason}")]
    InvalidConfig {
        /// What is wrong and how to fix it.
        reason: String,
    },
}

/// Why a lease ended before its owner released it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// No renewal was confirmed before the local deadline (last confirmed renewal + ttl - drift):
    /// Redis was unreachable or too slow, so the key may expire on the server.
    Expired,
    /// Another owner's token (or another kind of value) is under the key: it was overwritten,
    /// or it expired or was deleted and someone else has taken it since.
    Stolen,
    /// The lock was gone from the store: it expired on the server before a renewal reached it (a
    /// process or network pause, a server clock jump), or it was deleted (a force-unlock, a
    /// restart without persistence, a failover to a replica that never received it).
    Gone,
    /// `max_hold` elapsed, so renewals stopped and the lease ran out.
    MaxHold,
    /// `renew = false` and the lease's `ttl` ran out.
    NotRenewed,
    /// The registry was shut down and released every lock it held.
    Shutdown,
    /// Not a loss: this side ended the lease (released it, dropped its guard, resigned the
    /// term, or the guarded body or the term's work returned). What every clone of the lease
    /// (a [`Term`](crate::Term), a [`CurrentLock`](crate::CurrentLock)) sees from the moment it
    /// ended, before the release lets the next holder in.
    Released,
}

impl LostReason {
    /// The reason in one word, as metrics label it: `expired`, `stolen`, `gone`, `max_hold`,
    /// `not_renewed`, `shutdown`, `released`.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::Stolen => "stolen",
            Self::Gone => "gone",
            Self::MaxHold => "max_hold",
            Self::NotRenewed => "not_renewed",
            Self::Shutdown => "shutdown",
            Self::Released => "released",
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Expired => {
                "no renewal was confirmed before the lease's local deadline (Redis unreachable or too slow)"
            }
            Self::Stolen => "another owner's token is under the key (it was overwritten, or taken after it expired or was deleted)",
            Self::Gone => "the lock was gone from the store (it expired on the server, or was deleted or force-unlocked)",
            Self::MaxHold => "`max_hold` elapsed, so renewal stopped and the lease ran out",
            Self::NotRenewed => "`renew` is off and the lease's `ttl` ran out",
            Self::Shutdown => "the registry was shut down",
            Self::Released => {
                "its holder ended it (released, resigned, or the body or work it guarded returned)"
            }
        })
    }
}

impl LockError {
    /// The key concerned, when the error is about one key.
    #[must_use]
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Busy { key, .. }
            | Self::Lost { key, .. }
            | Self::NotOwner { key }
            | Self::ShutDown { key }
            | Self::InvalidKey { key, .. }
            | Self::InvalidOptions { key, .. }
            | Self::NotInLine { key, .. } => Some(key),
            Self::Backend { key, .. } => key.as_deref(),
            Self::NotConfigured { .. } | Self::InvalidConfig { .. } => None,
        }
    }

    /// `true` for [`LockError::Busy`]: the lock exists and someone else has it.
    #[must_use]
    pub fn is_busy(&self) -> bool {
        matches!(self, Self::Busy { .. })
    }

    /// `true` for [`LockError::Lost`].
    #[must_use]
    pub fn is_lost(&self) -> bool {
        matches!(self, Self::Lost { .. })
    }

    /// Whether trying again later may succeed: a busy or lost lock, and backend failures that
    /// pass (an unreachable or slow node, a failover, a server loading its data, memory that
    /// may be freed). `false` for what no retry changes: bad keys and options, a key holding
    /// application data, a refusal by the server's ACL or password, a command the server does
    /// not know, a registry that was shut down or never configured. Waiting (`wait`) retries
    /// only transient failures; any other is returned at once.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Busy { .. } | Self::Lost { .. } => true,
            Self::Backend { source, .. } => source.as_ref().is_none_or(|e| e.transient),
            Self::NotOwner { .. }
            | Self::NotConfigured { .. }
            | Self::InvalidConfig { .. }
            | Self::InvalidKey { .. }
            | Self::ShutDown { .. }
            | Self::InvalidOptions { .. }
            | Self::NotInLine { .. } => false,
        }
    }

    /// The error's kind in one word, as traces show it (`error.type`).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Busy { .. } => "busy",
            Self::Lost { .. } => "lost",
            Self::NotOwner { .. } => "not_owner",
            Self::Backend { .. } => "backend",
            Self::NotConfigured { .. } => "not_configured",
            Self::InvalidKey { .. } => "invalid_key",
            Self::ShutDown { .. } => "shut_down",
            Self::InvalidOptions { .. } => "invalid_options",
            Self::InvalidConfig { .. } => "invalid_config",
            Self::NotInLine { .. } => "not_in_line",
        }
    }

    /// Whether the operation certainly reached no server: no connection could be made to send
    /// it on.
    pub(crate) fn never_sent(&self) -> bool {
        matches!(self, Self::Backend { source: Some(e), .. } if e.never_sent)
    }

    /// A configuration that cannot be used; `reason` says what to change.
    pub(crate) fn config(reason: impl Into<String>) -> Self {
        Self::InvalidConfig {
            reason: reason.into(),
        }
    }
}

/// What a store's client library reported (on Redis, a `redis::RedisError`), with the store's
/// reading of it: whether trying again may succeed ([`LockError::is_transient`]). Its message is
/// the client's; [`get_ref`](Self::get_ref) gives the client's error itself, to downcast.
#[derive(Debug, Clone)]
pub struct StoreError {
    error: Arc<dyn std::error::Error + Send + Sync>,
    transient: bool,
    never_sent: bool,
}

impl StoreError {
    /// `error`, which a retry may get past when `transient`; `never_sent`: the operation
    /// certainly reached no server (no connection could be made to send it on).
    pub(crate) fn new(
        error: impl std::error::Error + Send + Sync + 'static,
        transient: bool,
        never_sent: bool,
    ) -> Self {
        Self {
            error: Arc::new(error),
            transient,
            never_sent,
        }
    }

    /// The client library's own error.
    ///
    /// ```
    /// # fn f(e: &lock_runtime::LockError) {
    /// use std::error::Error as _;
    /// let redis = e
    ///     .source()
    ///     .and_then(|s| s.downcast_ref::<lock_runtime::StoreError>())
    ///     .and_then(|s| s.get_ref().downcast_ref::<redis::RedisError>());
    /// # let _ = redis;
    /// # }
    /// ```
    #[must_use]
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

/// As `std::io::Error` with a custom error: its message is the inner error's, so the chain
/// goes on with that error's own source.
impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// Keys can be megabytes long and hold control bytes: messages show them shortened and escaped.
pub(crate) fn shown(key: &str) -> String {
    const MAX: usize = 120;
    let mut out: String = key.chars().take(MAX).flat_map(char::escape_debug).collect();
    if key.chars().nth(MAX).is_some() {
        out.push_str(&format!("… ({} bytes)", key.len()));
    }
    out
}

fn retry_hint(retry_after: Option<Duration>) -> String {
    match retry_after {
        Some(d) => format!(" for at most {} ms more", d.as_millis()),
        None => " with no expiry set".to_owned(),
    }
}

fn for_key(key: Option<&str>) -> String {
    key.map(|k| format!(" for lock `{}`", shown(k)))
        .unwrap_or_default()
}

fn not_configured(registry: Option<&str>) -> String {
    match registry {
        None => "no default lock registry: set LOCK_REDIS_URL (or REDIS_URL) to a redis:// URL \
                 (or LOCK_POSTGRES_URL to a postgres:// URL), or install one in code with \
                 `Registry::from_url(..)?.install_default()`"
            .to_owned(),
        Some(name) => format!(
            "no lock registry named `{name}`: install one with `registry.install_as(\"{name}\")` \
             before the first lock that uses it"
        ),
    }
}
