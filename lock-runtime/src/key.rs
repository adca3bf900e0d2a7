//! Lock keys: validation, the Redis names derived from a key, and escaping of interpolated values.

use std::fmt::{self, Write as _};
use std::sync::Arc;

use crate::error::LockError;

/// The longest key accepted. Redis would take more, but every lock key travels in every
/// renewal and release; a key this long is a bug in the caller.
pub const MAX_KEY_BYTES: usize = 4096;

/// The most keys one lock takes together ([`Registry::lock_all`](crate::Registry::lock_all)):
/// one script takes them all in one step, and the server serves nobody else meanwhile.
pub const MAX_KEYS_PER_LOCK: usize = 64;

/// The Redis names that belong to one lock key; cloned by reference, as every acquisition,
/// lease and background release keeps it.
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
    /// `prefix + key`: the string that holds the owner's token.
    pub redis_key: String,
    /// The fencing counter, in a namespace no lock key can reach.
    pub fence_key: String,
    /// The waiters' queue: their tokens in order of arrival, and each one's deadline, ttl,
    /// fencing choice and place (see the Redis scripts' `queue.lua`).
    pub queue_key: String,
    pub queued_key: String,
    /// A multi-key lock's keys, sorted by Redis name (the names above are the first one's);
    /// empty for a single key. Read through [`LockKey::keys`] and [`LockKey::is_multi`].
    members: Vec<LockKey>,
}

impl LockKey {
    /// The fencing counter has one name in every deployment, so tokens carry on when a service
    /// moves between a single server and a Cluster: it shares the lock's hash slot. A key with
    /// a hash tag keeps it (`fence:lock:{tenant}:job`); one without gets its whole name as the
    /// counter's tag (`fence:{lock:deploy:1}`), which hashes exactly like the untagged lock key.
    /// The lock key itself is never rewritten, so other clients see the same name everywhere.
    ///
    /// `cluster`: a stray brace, which would put the counter in another slot, is refused.
    pub(crate) fn new(prefix: &str, key: String, cluster: bool) -> Result<Self, LockError> {
        validate(&key)?;
        let redis_key = format!("{prefix}{key}");
        let tagged = hash_tag(&redis_key).is_some();
        if cluster && !tagged && redis_key.contains(['{', '}']) {
            return Err(LockError::InvalidKey {
                key,
                reason: "in Redis Cluster a key's braces must form a hash tag like `{tenant}` \
                         (so the lock, its fencing counter and its waiters' queue share a \
                         slot); this key has a stray or empty brace"
                    .to_owned(),
            });
        }
        let [fence_key, queue_key, queued_key] =
            NAMESPACES.map(|namespace| companion(namespace, &redis_key));
        Ok(Self(Arc::new(Names {
            name: key,
            redis_key,
            fence_key,
            queue_key,
            queued_key,
            members: Vec::new(),
        })))
    }

    /// The keys of a multi-key lock, taken together: sorted (so every caller names them in one
    /// order) and without repeats; a single key is a plain lock. Shown as `a + b`. In a cluster
    /// they must share a hash tag, so one script on one node can take them all.
    pub(crate) fn many(
        prefix: &str,
        mut keys: Vec<String>,
        cluster: bool,
    ) -> Result<Self, LockError> {
        if keys.len() == 1 {
            return Self::new(prefix, keys.remove(0), cluster);
        }
        let mut all = keys
            .into_iter()
            .map(|key| Self::new(prefix, key, cluster))
            .collect::<Result<Vec<_>, _>>()?;
        all.sort_by(|a, b| a.redis_key.cmp(&b.redis_key));
        all.dedup_by(|a, b| a.redis_key == b.redis_key);
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
        let tags: Vec<Option<&str>> = all.iter().map(|k| hash_tag(&k.redis_key)).collect();
        if cluster && (tags[0].is_none() || tags.iter().any(|t| *t != tags[0])) {
            return Err(LockError::InvalidKey {
                key: shown,
                reason: "in Redis Cluster the keys of one lock must share a hash slot, so one \
                         script on one node takes them all: give them a common hash tag, e.g. \
                         `{accounts}:<from>` and `{accounts}:<to>` (every key with that tag \
                         lives on one node)"
                    .to_owned(),
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

    /// Waiters subscribe to the lock key's own name: channels and keys are separate namespaces,
    /// and the same name lands in the same slot for sharded pub/sub.
    pub(crate) fn channel(&self) -> &str {
        &self.redis_key
    }
}

/// The part of `key` Redis Cluster hashes, when the key has a hash tag: the text between the
/// first `{` and the first `}` after it, if not empty.
pub(crate) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// Fencing counters live at `fence:{<prefix><key>}` (`fence:<prefix><key>` when the key has a
/// hash tag), waiters' queues at `queue:…` and `queued:…` alike. The registry builder rejects
/// prefixes that would let a lock key and one of these share a name.
pub(crate) const FENCE_NAMESPACE: &str = "fence:";
const NAMESPACES: [&str; 3] = [FENCE_NAMESPACE, "queue:", "queued:"];

/// The name of a key that belongs to the lock `redis_key`, in `namespace` and in the lock's
/// cluster slot: a key with a hash tag keeps it, one without gets its whole name as the tag
/// (which hashes exactly like the untagged lock key).
pub(crate) fn companion(namespace: &str, redis_key: &str) -> String {
    let tagged = hash_tag(redis_key).is_some();
    let mut name = String::with_capacity(namespace.len() + redis_key.len() + 2);
    name.push_str(namespace);
    if tagged {
        name.push_str(redis_key);
    } else {
        name.push('{');
        name.push_str(redis_key);
        name.push('}');
    }
    name
}

pub(crate) fn validate_prefix(prefix: &str) -> Result<(), LockError> {
    // A lock key (the prefix, then any key) must never be a name in those namespaces, of this
    // registry or of one with another prefix.
    let collides = NAMESPACES
        .iter()
        .any(|namespace| prefix.starts_with(namespace) || namespace.starts_with(prefix));
    if prefix.is_empty() || collides {
        return Err(LockError::InvalidKey {
            key: prefix.to_owned(),
            reason: format!(
                "the registry prefix must be non-empty and must not start one of the namespaces \
                 of fencing counters and waiters' queues ({}); pick one like `lock:`",
                NAMESPACES.map(|n| format!("`{n}`")).join(", ")
            ),
        });
    }
    Ok(())
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
        let err = LockKey::new("lock:", String::new(), false).unwrap_err();
        assert!(err.to_string().contains("the key is empty"), "{err}");
        let err = LockKey::new("lock:", "x".repeat(MAX_KEY_BYTES + 1), false).unwrap_err();
        assert!(err.to_string().contains("4097 bytes"), "{err}");
        assert!(
            err.to_string().len() < 400,
            "the message must not echo the whole key"
        );
    }

    #[test]
    fn fence_counters_live_apart_from_lock_keys() {
        let k = LockKey::new("lock:", "deploy:1".into(), false).unwrap();
        assert_eq!(k.redis_key, "lock:deploy:1");
        assert_eq!(k.fence_key, "fence:{lock:deploy:1}");
        assert!(validate_prefix("lock:").is_ok());
        assert!(validate_prefix("").is_err());
        assert!(validate_prefix("fence:").is_err());
        assert!(validate_prefix("f").is_err());
        assert!(validate_prefix("queue").is_err());
        // Inside a namespace, a lock key could be another registry's counter or queue:
        // `fence:{` + `lock:a}` is the counter of `lock:a`.
        assert!(validate_prefix("fence:{").is_err());
        assert!(validate_prefix("queued:x").is_err());
        assert!(validate_prefix("fencing:").is_ok());
        assert_eq!(k.queue_key, "queue:{lock:deploy:1}");
        assert_eq!(k.queued_key, "queued:{lock:deploy:1}");
    }

    #[test]
    fn in_a_cluster_the_fence_counter_shares_the_locks_hash_slot() {
        let plain = LockKey::new("lock:", "deploy:1".into(), true).unwrap();
        assert_eq!(
            plain.redis_key, "lock:deploy:1",
            "lock keys are never rewritten"
        );
        assert_eq!(plain.fence_key, "fence:{lock:deploy:1}");
        assert_eq!(hash_tag(&plain.fence_key), Some(plain.redis_key.as_str()));
        let tagged = LockKey::new("lock:", "{tenant:7}:job".into(), true).unwrap();
        assert_eq!(tagged.fence_key, "fence:lock:{tenant:7}:job");
        assert_eq!(hash_tag(&tagged.fence_key), hash_tag(&tagged.redis_key));
        assert_eq!(hash_tag(&tagged.queued_key), hash_tag(&tagged.redis_key));
        assert_eq!(hash_tag(&plain.queue_key), Some(plain.redis_key.as_str()));
        assert!(LockKey::new("lock:", "a}b".into(), true).is_err());
        assert!(LockKey::new("lock:", "{}b".into(), true).is_err());
        assert_eq!(hash_tag("a{}b{c}"), None, "an empty first tag means no tag");
    }

    #[test]
    fn a_single_server_and_a_cluster_name_the_fence_counter_alike() {
        // Moving a service between them must not restart its tokens under another name.
        for key in ["deploy:1", "{tenant:7}:job", "job:%7Btag%7D"] {
            let single = LockKey::new("lock:", key.into(), false).unwrap();
            let cluster = LockKey::new("lock:", key.into(), true).unwrap();
            assert_eq!(single.fence_key, cluster.fence_key, "{key}");
        }
        // A single server also takes keys whose braces form no tag; the counter stays unique.
        let stray = LockKey::new("lock:", "a}b".into(), false).unwrap();
        assert_eq!(stray.fence_key, "fence:{lock:a}b}");
    }
}
