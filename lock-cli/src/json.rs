//! How `--json` writes locks and elections for scripts: the same facts as the tables, with
//! durations in milliseconds and owners both as shown and taken apart (identity, host, pid).
//! A token is never written whole: whoever has it can release or extend the lock.

use lock_runtime::protocol::TokenOwner;
use lock_runtime::{Leader, LockInfo, Place};
use serde_json::{json, Value};

use crate::render;

/// An owner token: `shown` as the tables show it, and its parts where it is one of ours.
#[must_use]
pub fn owner(token: &str) -> Value {
    let parsed = TokenOwner::parse(token);
    json!({
        "shown": render::owner(token),
        "identity": parsed.and_then(|o| o.identity),
        "host": parsed.map(|o| o.host),
        "pid": parsed.map(|o| o.pid),
    })
}

fn places(places: &[Place]) -> Value {
    places
        .iter()
        .map(|p| {
            json!({
                "owner": owner(&p.token),
                "remaining_ms": millis(p.remaining),
                "aside": p.aside,
            })
        })
        .collect()
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One lock, as `show` and each of `list`'s rows describe it.
#[must_use]
pub fn lock(key: &str, store_key: &str, info: &LockInfo) -> Value {
    let held = render::holder(info);
    json!({
        "key": key,
        "store_key": store_key,
        "state": if held.is_some() { "held" } else { "free" },
        "holder": held,
        "owner": info.owner.as_deref().map(owner),
        "held_for_ms": info.held_for.map(millis),
        "remaining_ms": info.remaining.map(millis),
        "fence": info.fence,
        "permits": info.permits.map(|p| json!({ "held": p.held, "total": p.total })),
        "readers": info.readers,
        "holders": places(&info.holders),
        "waiters": info.waiters,
        "queue": places(&info.queue),
    })
}

/// Who leads an election, who is in line after it, and who stands aside in its place.
#[must_use]
pub fn leader(key: &str, leader: Option<&Leader>, in_line: &[String], aside: &[String]) -> Value {
    json!({
        "key": key,
        "leader": leader.map(|l| json!({
            "identity": l.identity,
            "term": l.term,
            "led_for_ms": l.led_for.map(millis),
            "remaining_ms": l.remaining.map(millis),
        })),
        "in_line": in_line,
        "standing_aside": aside,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_lock_is_written_with_its_owner_taken_apart_and_never_its_whole_token() {
        let token = format!("eu@web-1:4242:{}", "ab".repeat(16));
        let mut info = LockInfo::default();
        info.owner = Some(token.clone());
        info.remaining = Some(Duration::from_millis(4_240));
        info.held_for = Some(Duration::from_millis(61_000));
        info.fence = Some(17);
        info.queue = vec![Place::new(
            format!("web-2:7:{}", "cd".repeat(16)),
            Duration::from_millis(900),
        )];
        info.waiters = 1;
        let written = lock("deploy:1", "lock:deploy:1", &info);
        assert_eq!(
            written["owner"],
            json!({ "shown": "eu@web-1:4242:abababab…", "identity": "eu", "host": "web-1", "pid": 4242 })
        );
        assert_eq!(written["state"], "held");
        assert_eq!(written["remaining_ms"], 4240);
        assert_eq!(written["held_for_ms"], 61_000);
        assert_eq!(written["fence"], 17);
        assert_eq!(written["queue"][0]["owner"]["host"], "web-2");
        assert_eq!(written["queue"][0]["remaining_ms"], 900);
        assert!(!written.to_string().contains(&"ab".repeat(16)));
    }

    #[test]
    fn a_foreign_owner_is_shown_without_parts() {
        let written = owner("9f0c2a4e-uuid-of-redis-py");
        assert_eq!(written["shown"], "9f0c2a4e… (not a lock-runtime token)");
        assert!(written["host"].is_null() && written["pid"].is_null());
    }
}
