//! How locks are shown to an operator: durations, owners and tables.

use std::time::Duration;

use lock_runtime::protocol::TokenOwner;
use lock_runtime::{LockInfo, Place};

/// A remaining lease, readable at a glance: `850ms`, `4.2s`, `12m05s`, `3h20m`.
#[must_use]
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", d.as_secs_f64())
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60)
    }
}

/// An owner token as shown to an operator: enough to tell owners apart, never the whole token
/// (whoever has it can release or extend the lock): `host:pid:0123abcd…` for a lock-runtime
/// token, the first 8 characters of another client's.
#[must_use]
pub fn owner(token: &str) -> String {
    match TokenOwner::parse(token) {
        Some(owner) => owner.to_string(),
        None => {
            let start: String = token.chars().take(8).collect();
            format!("{start}… (not a lock-runtime token)")
        }
    }
}

/// Whether `token` belongs to `who`, as an operator names an owner: a candidate's identity,
/// `host:pid`, a host alone, or the owner as the tables show it (`host:pid:0123abcd`, with or
/// without its `…`).
#[must_use]
pub fn owned_by(token: &str, who: &str) -> bool {
    let Some(owner) = TokenOwner::parse(token) else {
        return false;
    };
    let who = who.trim_end_matches('…');
    let process = format!("{}:{}", owner.host, owner.pid);
    owner.identity == Some(who)
        || owner.host == who
        || process == who
        || format!("{process}:{}", owner.short) == who
        || owner.to_string().trim_end_matches('…') == who
}

/// Whether `who` (see [`owned_by`]) holds the key: as its one owner, or as one of the readers
/// or permit holders sharing it.
#[must_use]
pub fn held_by(info: &LockInfo, who: &str) -> bool {
    info.owner.as_deref().is_some_and(|t| owned_by(t, who))
        || info.holders.iter().any(|p| owned_by(&p.token, who))
}

/// Who holds the key: the owner (see [`owner`]), how many readers, or how many of a semaphore's
/// permits are held.
#[must_use]
pub fn holder(info: &LockInfo) -> Option<String> {
    match (&info.owner, info.permits, info.readers) {
        (Some(token), _, _) => Some(owner(token)),
        (None, Some(p), _) => Some(format!("{} of {} permits", p.held, p.total)),
        (None, None, Some(1)) => Some("1 reader".to_owned()),
        (None, None, Some(n)) => Some(format!("{n} readers")),
        (None, None, None) => None,
    }
}

/// The remaining lease of a held lock (of a semaphore: of its last permit to expire); a lock
/// without expiry was written by someone else.
#[must_use]
pub fn remaining(info: &LockInfo) -> String {
    match (holder(info), info.remaining) {
        (None, _) => "-".to_owned(),
        (Some(_), Some(left)) => duration(left),
        (Some(_), None) => "no expiry".to_owned(),
    }
}

/// How long the owner has held the lock, or `-` where the store does not know (see
/// [`LockInfo::held_for`]).
#[must_use]
pub fn held(info: &LockInfo) -> String {
    info.held_for.map_or_else(|| "-".to_owned(), duration)
}

/// The last fencing token, or `-` when fencing was never used on the key (or on Redlock).
#[must_use]
pub fn fence(info: &LockInfo) -> String {
    info.fence.map_or_else(|| "-".to_owned(), |f| f.to_string())
}

/// The lines of `lockctl show`.
#[must_use]
pub fn details(redis_key: &str, info: &LockInfo) -> String {
    let owner = match (info.owner.as_deref(), holder(info)) {
        (Some(token), _) => match TokenOwner::parse(token) {
            Some(parsed) => format!("{parsed} (host {}, pid {})", parsed.host, parsed.pid),
            None => owner(token),
        },
        (None, Some(permits)) => permits,
        (None, None) => "-".to_owned(),
    };
    let state = if holder(info).is_some() {
        "held"
    } else {
        "free"
    };
    let mut text = format!(
        "key:    {redis_key}\nstate:  {state}\nowner:  {owner}\nheld:   {}\nlease:  {}\n\
         fence:  {}\n",
        held(info),
        remaining(info),
        fence(info),
    );
    if !info.holders.is_empty() {
        text.push_str("held by:\n");
        text.push_str(&places(&info.holders, "lease"));
    }
    if info.waiters > 0 {
        text.push_str(&format!(
            "queue:  {} waiting, handed the lock in this order\n",
            info.waiters
        ));
        text.push_str(&places(&info.queue, "place"));
    }
    text
}

/// One indented row per place: its rank, owner and time left (`what` says of what).
fn places(places: &[Place], what: &str) -> String {
    let rows: Vec<Vec<String>> = places
        .iter()
        .enumerate()
        .map(|(i, place)| {
            vec![
                format!("  {}.", i + 1),
                owner(&place.token),
                format!("{what} {} left", duration(place.remaining)),
            ]
        })
        .collect();
    table(&rows)
}

/// Left-aligned columns, two spaces apart; the last column is not padded.
#[must_use]
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_two_significant_units() {
        assert_eq!(duration(Duration::from_millis(850)), "850ms");
        assert_eq!(duration(Duration::from_millis(4_240)), "4.2s");
        assert_eq!(duration(Duration::from_secs(725)), "12m05s");
        assert_eq!(duration(Duration::from_secs(12_000)), "3h20m");
    }

    #[test]
    fn an_owner_is_shown_without_its_whole_token() {
        let token = "web-1:4242:0123456789abcdef0123456789abcdef";
        assert_eq!(owner(token), "web-1:4242:01234567…");
        assert_eq!(
            owner("9f0c2a4e-uuid-of-redis-py"),
            "9f0c2a4e… (not a lock-runtime token)"
        );
    }

    #[test]
    fn show_names_the_owners_host_and_pid() {
        let mut info = LockInfo::default();
        info.owner = Some("web-1:4242:0123456789abcdef0123456789abcdef".to_owned());
        let text = details("lock:deploy", &info);
        assert!(
            text.contains("owner:  web-1:4242:01234567… (host web-1, pid 4242)"),
            "{text}"
        );
    }

    #[test]
    fn show_says_how_long_the_owner_has_held_the_lock_where_it_is_known() {
        let mut info = LockInfo::default();
        info.owner = Some("web-1:4242:0123456789abcdef0123456789abcdef".to_owned());
        assert!(details("lock:x", &info).contains("held:   -\n"));
        info.held_for = Some(Duration::from_secs(725));
        let text = details("lock:x", &info);
        assert!(text.contains("held:   12m05s\n"), "{text}");
    }

    #[test]
    fn a_free_lock_shows_its_last_fence() {
        let mut info = LockInfo::default();
        info.fence = Some(17);
        let text = details("lock:x", &info);
        assert!(text.contains("state:  free"), "{text}");
        assert!(text.contains("fence:  17"), "{text}");
    }

    #[test]
    fn a_semaphore_shows_its_permits_held() {
        let mut info = LockInfo::default();
        info.remaining = Some(Duration::from_millis(4_240));
        info.permits = Some(lock_runtime::Permits { held: 2, total: 4 });
        let text = details("lock:gpu-pool", &info);
        assert!(text.contains("state:  held"), "{text}");
        assert!(text.contains("owner:  2 of 4 permits"), "{text}");
        assert!(text.contains("lease:  4.2s"), "{text}");
        assert!(!text.contains("queue:"), "nobody waits: {text}");
    }

    #[test]
    fn queued_waiters_are_listed_in_order_with_their_places() {
        let mut info = LockInfo::default();
        info.owner = Some(format!("web-1:42:{}", "ab".repeat(16)));
        info.queue = vec![
            Place::new(
                format!("web-2:7:{}", "cd".repeat(16)),
                Duration::from_millis(900),
            ),
            Place::new(
                format!("web-3:8:{}", "ef".repeat(16)),
                Duration::from_secs(5),
            ),
        ];
        info.waiters = 2;
        let text = details("lock:deploy", &info);
        assert!(
            text.ends_with(
                "queue:  2 waiting, handed the lock in this order\n  \
                 1.  web-2:7:cdcdcdcd…  place 900ms left\n  \
                 2.  web-3:8:efefefef…  place 5.0s left\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn shared_holders_are_listed_with_their_leases() {
        let mut info = LockInfo::default();
        info.remaining = Some(Duration::from_secs(3));
        info.readers = Some(2);
        info.holders = vec![
            Place::new(
                format!("web-1:1:{}", "12".repeat(16)),
                Duration::from_secs(3),
            ),
            Place::new(
                format!("web-2:2:{}", "34".repeat(16)),
                Duration::from_millis(20),
            ),
        ];
        let text = details("lock:catalog", &info);
        assert!(
            text.contains(
                "held by:\n  1.  web-1:1:12121212…  lease 3.0s left\n  \
                 2.  web-2:2:34343434…  lease 20ms left\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn readers_show_as_a_count() {
        let mut info = LockInfo::default();
        info.remaining = Some(Duration::from_secs(3));
        info.readers = Some(3);
        assert_eq!(holder(&info).as_deref(), Some("3 readers"));
        assert!(details("lock:catalog", &info).contains("state:  held"));
    }

    #[test]
    fn an_owner_is_named_by_identity_process_host_or_as_shown() {
        let token = format!("eu@web-1:4242:{}", "ab".repeat(16));
        for who in [
            "eu",
            "web-1",
            "web-1:4242",
            "web-1:4242:abababab",
            "web-1:4242:abababab…",
            "eu@web-1:4242:abababab…",
        ] {
            assert!(owned_by(&token, who), "{who}");
        }
        for who in [
            "e",
            "web",
            "web-1:424",
            "web-1:42420",
            "web-1:4242:abab",
            "",
        ] {
            assert!(!owned_by(&token, who), "{who}");
        }
        assert!(!owned_by("9f0c2a4e-uuid-of-redis-py", "9f0c2a4e"));
        let mut info = LockInfo::default();
        info.holders = vec![Place::new(token, Duration::from_secs(1))];
        assert!(held_by(&info, "web-1:4242") && !held_by(&info, "web-2"));
    }

    #[test]
    fn table_aligns_columns() {
        let rows = vec![
            vec!["KEY".to_owned(), "TTL".to_owned()],
            vec!["deploy:1".to_owned(), "4.2s".to_owned()],
        ];
        assert_eq!(table(&rows), "KEY       TTL\ndeploy:1  4.2s\n");
    }
}
