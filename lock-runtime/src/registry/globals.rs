//! The process-wide default registry and the named ones that attributes refer to.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use super::handle::Registry;
use crate::error::LockError;

impl Registry {
    /// Makes this the default registry, used by `#[distributed_lock]` without `registry = ..`
    /// and by [`registry()`]. Replaces any earlier default.
    pub fn install_default(&self) {
        *DEFAULT.write().unwrap_or_else(PoisonError::into_inner) = Some(self.clone());
    }

    /// Makes this the registry named `name` (`#[distributed_lock(registry = "name")]`).
    pub fn install_as(&self, name: &str) {
        self.inner.name_if_unnamed(name);
        NAMED
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(HashMap::new)
            .insert(name.to_owned(), self.clone());
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
