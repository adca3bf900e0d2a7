//! The names a lock's companions take beside it in a key-value store: its fencing counter and
//! its waiters' queue, in namespaces no lock key can reach, and in the lock's Redis Cluster
//! hash slot. Part of the wire protocol (a client in another language finds them by these
//! rules), shared by the Redis stores, the in-memory store that mirrors them, and
//! [`FencedKey`](crate::FencedKey)'s records.

use crate::error::LockError;
use crate::key::LockKey;

/// The names of one lock key's companions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Companions {
    /// The fencing counter.
    pub fence: String,
    /// The waiters' queue: their tokens in order of arrival, and each one's deadline, ttl,
    /// fencing choice and place (see the Redis scripts' `queue.lua`).
    pub queue: String,
    pub queued: String,
}

impl Companions {
    /// The companions of `key` (a multi-key lock's: of its first key).
    pub(crate) fn of(key: &LockKey) -> Self {
        let [fence, queue, queued] = NAMESPACES.map(|namespace| companion(namespace, &key.stored));
        Self {
            fence,
            queue,
            queued,
        }
    }
}

/// The fencing counter of `key` (see [`Companions`]).
pub(crate) fn fence(key: &LockKey) -> String {
    companion(FENCE_NAMESPACE, &key.stored)
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

/// Where a [`FencedKey`](crate::FencedKey) keeps the highest token written to its data key:
/// `fenced:{key}` (`fenced:key` when the key has a hash tag), in its Cluster slot.
pub(crate) const RECORD_NAMESPACE: &str = "fenced:";

/// Where a lock's renewals note since when its holder has held it: `since:{<prefix><key>}`
/// (`since:<prefix><key>` when the key has a hash tag; see `held_key` in the Redis scripts'
/// prelude, which names it alike).
pub(crate) const HELD_NAMESPACE: &str = "since:";

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
    let mut reserved = NAMESPACES
        .iter()
        .chain([&RECORD_NAMESPACE, &HELD_NAMESPACE]);
    let collides =
        reserved.any(|namespace| prefix.starts_with(namespace) || namespace.starts_with(prefix));
    if prefix.is_empty() || collides {
        return Err(LockError::InvalidKey {
            key: prefix.to_owned(),
            reason: format!(
                "the registry prefix must be non-empty and must not start one of the namespaces \
                 of fencing counters, waiters' queues, fenced writes' records and notes of how \
                 long locks are held ({}, `{RECORD_NAMESPACE}`, `{HELD_NAMESPACE}`); pick one \
                 like `lock:`",
                NAMESPACES.map(|n| format!("`{n}`")).join(", ")
            ),
        });
    }
    // Lock `b` would keep its companions at `<namespace>{{b}` (untagged: wrapped whole), where
    // lock `{b}` (tagged) keeps its own. Only such a prefix lets a tagged key be an untagged
    // one wrapped in braces.
    if prefix.bytes().all(|b| b == b'{') {
        return Err(LockError::InvalidKey {
            key: prefix.to_owned(),
            reason: "a registry prefix made only of `{` would let two locks (`b` and `{b}`) \
                     share a fencing counter and a waiters' queue; pick one like `lock:` (or \
                     `{app}:` to keep every lock in one cluster slot)"
                .to_owned(),
        });
    }
    Ok(())
}

/// Refuses `key` where a Redis Cluster could not keep it in one hash slot with its companions:
/// a stray or empty brace would put the counter in another slot than the lock, and the keys of
/// one multi-key lock must share a hash tag, so one script on one node takes them all.
pub(crate) fn in_one_slot(key: &LockKey) -> Result<(), LockError> {
    for member in key.keys() {
        let stored = &member.stored;
        if hash_tag(stored).is_none() && stored.contains(['{', '}']) {
            return Err(LockError::InvalidKey {
                key: member.name.clone(),
                reason: "in Redis Cluster a key's braces must form a hash tag like `{tenant}` \
                         (so the lock, its fencing counter and its waiters' queue share a \
                         slot); this key has a stray or empty brace"
                    .to_owned(),
            });
        }
    }
    let tags: Vec<Option<&str>> = key.keys().iter().map(|k| hash_tag(&k.stored)).collect();
    if key.is_multi() && (tags[0].is_none() || tags.iter().any(|t| *t != tags[0])) {
        return Err(LockError::InvalidKey {
            key: key.name.clone(),
            reason: "in Redis Cluster the keys of one lock must share a hash slot, so one \
                     script on one node takes them all: give them a common hash tag, e.g. \
                     `{accounts}:<from>` and `{accounts}:<to>` (every key with that tag \
                     lives on one node)"
                .to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> LockKey {
        LockKey::new("lock:", name.into()).unwrap()
    }

    #[test]
    fn fence_counters_live_apart_from_lock_keys() {
        let k = Companions::of(&key("deploy:1"));
        assert_eq!(k.fence, "fence:{lock:deploy:1}");
        assert_eq!(fence(&key("deploy:1")), k.fence);
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
        assert!(validate_prefix("fenced:").is_err(), "FencedKey records");
        assert_eq!(k.queue, "queue:{lock:deploy:1}");
        assert_eq!(k.queued, "queued:{lock:deploy:1}");
    }

    #[test]
    fn in_a_cluster_the_fence_counter_shares_the_locks_hash_slot() {
        let plain = key("deploy:1");
        assert_eq!(
            plain.stored, "lock:deploy:1",
            "lock keys are never rewritten"
        );
        let names = Companions::of(&plain);
        assert_eq!(names.fence, "fence:{lock:deploy:1}");
        assert_eq!(hash_tag(&names.fence), Some(plain.stored.as_str()));
        assert_eq!(hash_tag(&names.queue), Some(plain.stored.as_str()));
        let tagged = key("{tenant:7}:job");
        let names = Companions::of(&tagged);
        assert_eq!(names.fence, "fence:lock:{tenant:7}:job");
        assert_eq!(hash_tag(&names.fence), hash_tag(&tagged.stored));
        assert_eq!(hash_tag(&names.queued), hash_tag(&tagged.stored));
        assert!(in_one_slot(&plain).is_ok() && in_one_slot(&tagged).is_ok());
        assert!(in_one_slot(&key("a}b")).is_err());
        assert!(in_one_slot(&key("{}b")).is_err());
        assert_eq!(hash_tag("a{}b{c}"), None, "an empty first tag means no tag");
    }

    #[test]
    fn in_a_cluster_the_keys_of_one_lock_share_a_hash_tag() {
        let many = |keys: &[&str]| {
            LockKey::many("lock:", keys.iter().map(|k| (*k).to_owned()).collect()).unwrap()
        };
        assert!(in_one_slot(&many(&["{a}:1", "{a}:2"])).is_ok());
        let err = in_one_slot(&many(&["{a}:1", "{b}:2"])).unwrap_err();
        assert!(err.to_string().contains("common hash tag"), "{err}");
        assert!(in_one_slot(&many(&["x", "y"])).is_err());
        assert!(
            in_one_slot(&many(&["{a}:1", "a}"])).is_err(),
            "a stray brace"
        );
    }

    #[test]
    fn a_single_server_also_takes_keys_whose_braces_form_no_tag() {
        // Moving a service between a server and a cluster must not restart its tokens under
        // another name: the names do not depend on the deployment. The counter stays unique.
        assert_eq!(fence(&key("a}b")), "fence:{lock:a}b}");
    }
}
