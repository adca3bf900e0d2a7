//! What a registry's clones, its lock requests and its guards share: the backend, the key
//! prefix, the lease keeper, the terms its candidates hold, and whether a shutdown began.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use tokio::sync::watch;

use crate::backend::{Backend, Store};
use crate::error::LockError;
use crate::keeper::Keeper;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::timeouts::Timeouts;

pub(crate) struct RegistryInner {
    pub(crate) backend: Arc<Backend>,
    pub(crate) prefix: String,
    pub(crate) keeper: Arc<Keeper>,
    pub(crate) timeouts: Timeouts,
    /// What metrics call this registry (see `RegistryBuilder::name`).
    name: OnceLock<Arc<str>>,
    /// Who this process is in its elections (see `RegistryBuilder::identity`).
    pub(crate) identity: Option<String>,
    /// The terms its candidates won, by election key: what `Election::is_leader` and
    /// `Election::is_live` read, and the leader gauge counts.
    pub(crate) terms: Mutex<HashMap<String, HeldTerms>>,
    /// Whether its candidates in an election stand aside, by election key and identity (see
    /// `Election::stand_aside`): their campaigns follow the flag.
    aside: Mutex<HashMap<(String, String), watch::Sender<bool>>>,
    next_id: AtomicU64,
    /// Whether a shutdown began: read by every acquisition, and watched by those waiting, to
    /// end at once.
    closed: watch::Sender<bool>,
}

/// One election's terms won in a registry.
#[derive(Default)]
pub(crate) struct HeldTerms {
    /// Each until it is over and its work gone.
    pub(crate) terms: Vec<Weak<Lease>>,
    /// Those not over yet, counted down the moment each ends.
    pub(crate) leading: Arc<AtomicUsize>,
}

impl std::fmt::Debug for RegistryInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The node is `host:port`: credentials never reach Debug output.
        f.debug_struct("Registry")
            .field("node", &self.backend.node())
            .field("prefix", &self.prefix)
            .field("confirm_replicas", &self.backend.confirm_replicas())
            .finish_non_exhaustive()
    }
}

impl RegistryInner {
    pub(crate) fn new(
        backend: Backend,
        prefix: String,
        timeouts: Timeouts,
        name: Option<String>,
        identity: Option<String>,
    ) -> Self {
        let backend = Arc::new(backend);
        let named = OnceLock::new();
        if let Some(name) = name {
            let _ = named.set(name.into());
        }
        Self {
            name: named,
            identity,
            keeper: Arc::new(Keeper::new(backend.clone())),
            backend,
            prefix,
            timeouts,
            terms: Mutex::default(),
            aside: Mutex::default(),
            next_id: AtomicU64::new(1),
            closed: watch::channel(false).0,
        }
    }

    /// `key` under this registry's prefix, as its store can hold it.
    pub(crate) fn lock_key(&self, key: String) -> Result<LockKey, LockError> {
        self.lock_keys(vec![key])
    }

    /// One key, or a multi-key lock's keys (see [`LockKey::many`]), as its store can hold them.
    pub(crate) fn lock_keys(&self, keys: Vec<String>) -> Result<LockKey, LockError> {
        let key = LockKey::many(&self.prefix, keys)?;
        self.backend.admit(&key)?;
        Ok(key)
    }

    /// The registry's name: the one it was built with, else the first it was installed under
    /// before its first lock, else `default`.
    pub(crate) fn name(&self) -> &Arc<str> {
        self.name.get_or_init(|| "default".into())
    }

    /// Names an unnamed registry (installing it under `name`); a name it has stays.
    pub(crate) fn name_if_unnamed(&self, name: &str) {
        let _ = self.name.set(name.into());
    }

    /// Whether this registry's candidates in election `key` campaigning as `identity` stand
    /// aside, as they follow it.
    pub(crate) fn aside(&self, key: &str, identity: &str) -> watch::Receiver<bool> {
        self.aside_flag(key, identity, watch::Sender::subscribe)
    }

    /// Makes this registry's candidates in election `key` campaigning as `identity` stand
    /// aside, or rejoin the line.
    pub(crate) fn set_aside(&self, key: &str, identity: &str, standing: bool) {
        self.aside_flag(key, identity, |flag| flag.send_replace(standing));
    }

    /// `with` the stand-aside flag of election `key`'s candidates as `identity`.
    fn aside_flag<T>(
        &self,
        key: &str,
        identity: &str,
        with: impl FnOnce(&watch::Sender<bool>) -> T,
    ) -> T {
        let mut aside = self.aside.lock().unwrap_or_else(PoisonError::into_inner);
        with(
            aside
                .entry((key.to_owned(), identity.to_owned()))
                .or_insert_with(|| watch::channel(false).0),
        )
    }

    pub(crate) fn next_lease_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Refuses every acquisition from now on; leases already admitted are the caller's to end.
    pub(crate) fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Resolves once [`close`](Self::close) was called, for a wait to end on.
    pub(crate) async fn closing(&self) {
        let mut closed = self.closed.subscribe();
        // The sender lives as long as `self`: the wait ends only by the flag.
        let _ = closed.wait_for(|closed| *closed).await;
    }

    /// Refuses a new acquisition once [`close`](Self::close) was called.
    pub(crate) fn ensure_open(&self, key: &str) -> Result<(), LockError> {
        if *self.closed.borrow() {
            return Err(LockError::ShutDown {
                key: key.to_owned(),
            });
        }
        Ok(())
    }

    /// Hands a freshly acquired lease to the keeper, unless a shutdown began meanwhile: then the
    /// lock is given back and the acquisition refused.
    pub(crate) async fn admit(&self, lease: &Arc<Lease>) -> Result<(), LockError> {
        self.keeper.hold(lease.clone());
        // Held before reading the flag, and a shutdown sets the flag before collecting the
        // leases (the flag's lock orders the two): either the shutdown sees this lease, or this
        // reads the flag set.
        if !*self.closed.borrow() {
            return Ok(());
        }
        self.keeper.begin_release(lease.id);
        // Forgotten however this ends, also when the caller stops waiting for the release.
        let _forget = Forget(&self.keeper, lease.id);
        // A failed release leaves the lock to its ttl, as a shutdown does.
        let _ = tokio::time::timeout(self.timeouts.round(), lease.give_back(&self.backend)).await;
        Err(LockError::ShutDown {
            key: lease.key.name.clone(),
        })
    }
}

/// Takes a lease out of the keeper's table when dropped.
struct Forget<'a>(&'a Keeper, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.remove(self.1);
    }
}
