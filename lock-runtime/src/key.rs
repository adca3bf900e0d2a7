//! Lock keys: validation, the name a store keeps a lock under, and escaping of interpolated
//! values. What a store derives from that name (Redis's counter and queue names, its hash
//! slots) is the store's own (`names`, `backend::redis`).

use std::fmt::{self, Write as _};
use std::sync::Arc;

use crate::error::LockError;

/// The longest key accepted. Redis would take more, but every lock key travels in every
/// renewal and release; a key this long is a bug in the caller.
pub const MAX_KEY_BYTES: usize = 4096;

/// The most keys one lock takes together ([`Registry::lock_all`](crate::Registry::lock_all)):
/// one script takes them all in one step, and the server serves nobody else meanwhile.
pub const MAX_KEYS_PER_LOCK: usize = 64;

/// One lock key under a registry's prefix; cloned by reference, as every acquisition, lease
/// and background release keeps it.
#[derive(Debug, Clone)]
pub(crate) struct LockKey(Arc<Names>);

impl std::ops::Deref for LockKey {
    type Target = Names;

    fn deref(&self) -> &Names {
        &self.0
    }
}

/// A lock key's names.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    /// The lock's name as the user gave it (without the prefix); a multi-key lock's keys joined
    /// with ` + `. Errors and logs show it.
    pub name: String,
    /// `prefix + key`: the name the store keeps the lock under (on Redis, the key that holds
    /// the owner's token).
    pub stored: String,
    /// A multi-key lock's keys, sorted by stored name (the name above is the first one's);
    /// empty for a single key. Read through [`LockKey::keys`] and [`LockKey::is_multi`].
    members: Vec<LockKey>,
}

impl LockKey {
    /// `key` under `prefix`, if it is a key at all (not empty, not oversized). Whether a store
    /// can hold it as it is, its store says (`Store::admit`).
    pub(crate) fn new(prefix: &str, key: String) -> Result<Self, LockError> {
        validate(&key)?;
        Ok(Self(Arc::new(Names {
            stored: format!("{prefix}{key}"),
            name: key,
            members: Vec::new(),
        })))
    }

    /// The keys of a multi-key lock, taken together: sorted (so every caller names them in one
    /// order) and without repeats; a single key is a plain lock. Shown as `a + b`.
    pub(crate) fn many(prefix: &str, mut keys: Vec<String>) -> Result<Self, LockError> {
        if keys.len() == 1 {
            return Self::new(prefix, keys.remove(0));
        }
        let mut all = keys
            .into_iter()
            .map(|key| Self::new(prefix, key))
            .collect::<Result<Vec<_>, _>>()?;
        all.sort_by(|a, b| a.stored.cmp(&b.stored));
        all.dedup_by(|a, b| a.stored == b.stored);
        let shown = all
            .iter()
            .map(|k| k.name.as_str())
            .collect::<Vec<_>>()
            .join(" + ");
        if all.is_empty() {
            return Err(LockError::InvalidKey {
                key: shown,
                reason: "a multi-key lock needs at least one key".to_owned(),
            });
        }
        if all.len() == 1 {
            return Ok(all.remove(0));
        }
        if all.len() > MAX_KEYS_PER_LOCK {
            return Err(LockError::InvalidKey {
                key: format!("{} + … ({} keys)", all[0].name, all.len()),
                reason: format!(
                    "a lock over {} keys: one lock takes at most {MAX_KEYS_PER_LOCK} keys, in one \
                     script that holds up the server while it runs; lock a coarser key (the \
                     batch, the account group) instead",
                    all.len()
                ),
            });
        }
        let first = Names::clone(&all[0]);
        Ok(Self(Arc::new(Names {
            name: shown,
            members: all,
            ..first
        })))
    }

    /// Every key this lock holds: itself, or a multi-key lock's keys.
    pub(crate) fn keys(&self) -> &[LockKey] {
        if self.members.is_empty() {
            std::slice::from_ref(self)
        } else {
            &self.members
        }
    }

    /// Whether this is a lock over several keys, taken together.
    pub(crate) fn is_multi(&self) -> bool {
        !self.members.is_empty()
    }

    /// What waiters for this lock follow: its stored name (on Redis, channels and keys are
    /// separate namespaces, and the same name lands in the same slot for sharded pub/sub).
    pub(crate) fn channel(&self) -> &str {
        &self.stored
    }
}

fn validate(key: &str) -> Result<(), LockError> {
    let reason = if key.is_empty() {
        "the key is empty; render something that names the resource, e.g. `deploy:42`".to_owned()
    } else if key.len() > MAX_KEY_BYTES {
        format!(
            "the key is {} bytes long, more than the {MAX_KEY_BYTES} allowed; lock on an id or a \
             hash of the resource instead",
            key.len()
        )
    } else {
        return Ok(());
    };
    Err(LockError::InvalidKey {
        key: key.to_owned(),
        reason,
    })
}

/// Builds a key from a template's literal parts and interpolated values.
///
/// Values are percent-escaped (`%`, `:`, `/`, `{`, `}` and ASCII control bytes), so a value can
/// never contain a separator: as long as the template puts a separator between placeholders (the
/// attribute checks that), two different argument lists can never render the same key, and a
/// value can never open or close a Redis Cluster hash tag.
///
/// ```
/// let mut key = lock_runtime::KeyBuilder::new(16);
/// key.literal("deploy:");
/// key.value("eu:west");
/// key.literal(":");
/// key.value(&7);
/// assert_eq!(key.finish(), "deploy:eu%3Awest:7");
/// ```
#[derive(Debug, Default)]
pub struct KeyBuilder {
    buf: String,
}

impl KeyBuilder {
    /// An empty key with room for `capacity_hint` bytes.
    #[must_use]
    pub fn new(capacity_hint: usize) -> Self {
        Self {
            buf: String::with_capacity(capacity_hint),
        }
    }

    /// Appends template text verbatim.
    pub fn literal(&mut self, text: &str) {
        self.buf.push_str(text);
    }

    /// Appends a value through its `Display`, escaped.
    pub fn value<T: ?Sized + fmt::Display>(&mut self, value: &T) {
        // Writing into a String through our escaper cannot fail unless Display itself errs,
        // which is a bug in that Display impl; the key then just stops there.
        let _ = write!(Escaper(&mut self.buf), "{value}");
    }

    /// The rendered key.
    #[must_use]
    pub fn finish(self) -> String {
        self.buf
    }
}

struct Escaper<'a>(&'a mut String);

impl fmt::Write for Escaper<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '%' | ':' | '/' | '{' | '}' | '\u{0}'..='\u{1f}' | '\u{7f}' => {
                    write!(self.0, "%{:02X}", c as u32)?;
                }
                _ => self.0.push(c),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(parts: &[(&str, &str)]) -> String {
        let mut k = KeyBuilder::new(0);
        for (lit, val) in parts {
            k.literal(lit);
            k.value(val);
        }
        k.finish()
    }

    #[test]
    fn separators_in_values_cannot_merge_two_argument_lists() {
        let a = render(&[("", "1:2"), (":", "3")]);
        let b = render(&[("", "1"), (":", "2:3")]);
        assert_ne!(a, b);
        assert_eq!(a, "1%3A2:3");
        assert_eq!(b, "1:2%3A3");
    }

    #[test]
    fn values_cannot_open_a_hash_tag_or_hide_control_bytes() {
        assert_eq!(render(&[("{t:", "}x{"), ("}:job", "")]), "{t:%7Dx%7B}:job");
        assert_eq!(render(&[("", "a\nb%\u{7f}")]), "a%0Ab%25%7F");
        assert_eq!(render(&[("", "naïve/π")]), "naïve%2Fπ");
    }

    #[test]
    fn empty_and_oversized_keys_are_rejected_with_the_reason() {
        let err = LockKey::new("lock:", String::new()).unwrap_err();
        assert!(err.to_string().contains("the key is empty"), "{err}");
        let err = LockKey::new("lock:", "x".repeat(MAX_KEY_BYTES + 1)).unwrap_err();
        assert!(err.to_string().contains("4097 bytes"), "{err}");
        assert!(
            err.to_string().len() < 400,
            "the message must not echo the whole key"
        );
    }
}
