//! A registry chosen by environment variables, with no code change between deployments.

use super::handle::Registry;
use crate::deployment::Deployment;
use crate::error::LockError;

impl Registry {
    /// A registry from the environment, with no code change between deployments:
    ///
    /// | variable | mode |
    /// |---|---|
    /// | `LOCK_REDIS_SENTINEL=redis://s1:26379,redis://s2:26379` with `LOCK_REDIS_SENTINEL_MASTER=mymaster` | the master these Sentinels name (see [`RegistryBuilder::sentinel`](super::builder::RegistryBuilder::sentinel)) |
    /// | `LOCK_REDIS_CLUSTER=redis://a:7000,redis://b:7001` | Redis Cluster through these seeds |
    /// | `LOCK_REDIS_URL=redis://a:6379,redis://b:6379,redis://c:6379` | Redlock over these masters |
    /// | `LOCK_REDIS_URL=redis://a:6379` (else `REDIS_URL`) | one Redis server |
    ///
    /// The grammar is [`Deployment::from_vars`]'s, which `lockctl` reads too. An empty entry in
    /// a comma list (`redis://a:6379,`) is an error naming its position, never skipped: a stray
    /// comma must not turn one server into a Redlock.
    ///
    /// `rediss://` URLs speak TLS (the `tls` feature, with the system's roots: a private CA
    /// needs [`RegistryBuilder::tls_root_cert`](super::builder::RegistryBuilder::tls_root_cert)
    /// in code); in Sentinel mode `rediss://` sentinel URLs make the master TLS too, unless
    /// `LOCK_REDIS_SENTINEL_MASTER` is a URL with a scheme of its own.
    ///
    /// `LOCK_REDIS_CONFIRM_REPLICAS=1` sets [`RegistryBuilder::confirm_replicas`](super::builder::RegistryBuilder::confirm_replicas)
    /// (one server or Sentinel; unset or `0` is off).
    ///
    /// # Errors
    /// [`LockError::NotConfigured`] when none is set; see [`RegistryBuilder::build`](super::builder::RegistryBuilder::build).
    pub fn from_env() -> Result<Self, LockError> {
        let var = |name: &str| std::env::var(name).ok();
        let confirm = var("LOCK_REDIS_CONFIRM_REPLICAS").filter(|v| !v.trim().is_empty());
        let replicas = match confirm {
            None => 0,
            Some(n) => n.trim().parse::<u32>().map_err(|_| {
                LockError::config(format!(
                    "LOCK_REDIS_CONFIRM_REPLICAS is `{}`, not a number of replicas; set it to \
                     how many replicas must acknowledge each lock write (e.g. 1), or unset it",
                    crate::error::shown(&n)
                ))
            })?,
        };
        let deployment =
            Deployment::from_vars(var)?.ok_or(LockError::NotConfigured { registry: None })?;
        Self::builder()
            .confirm_replicas(replicas)
            .deployment(deployment)
            .build()
    }
}
