//! Who holds a key, for how long, its last fencing token and who queues for it: `inspect.lua`.

use std::time::Duration;

use super::call::{Call, Script};
use crate::backend::contract::{LockInfo, Permits, Place, Share};
use crate::key::LockKey;
use crate::names::Companions;

/// `KEYS[1]` lock, `KEYS[2]` fencing counter, `KEYS[3..4]` the waiters' queue. Returns `{token
/// or false, pttl, fence or false, tag or false, queue, holders, aside, held or false}` (tag for
/// readers or a semaphore: `#read` or `#permits=N`; queue: each live waiter's token and its
/// place's ms left, oldest first; holders: each live reader's or permit holder's token and its
/// ms left, longest first; aside: the queued waiters standing aside; held: how long the holder
/// has held the lock, in ms, where its renewals noted it).
pub const INSPECT_LUA: &str = concat!(
    include_str!("prelude.lua"),
    include_str!("queue.lua"),
    include_str!("inspect.lua")
);

static SCRIPT: Script = Script::new(INSPECT_LUA);

/// The script's call for `key`.
pub(crate) fn call(key: &LockKey) -> Call {
    let c = Companions::of(key);
    Call::new(&SCRIPT, &[&key.stored, &c.fence, &c.queue, &c.queued])
}

/// The script's reply.
pub(crate) type Reply = (
    Option<String>,
    i64,
    Option<u64>,
    Option<String>,
    Vec<(String, u64)>,
    Vec<(String, u64)>,
    Vec<String>,
    Option<u64>,
);

/// What the reply says. A set whose every place ran out is free, though its key has not
/// expired yet.
pub(crate) fn read((owner, pttl, fence, tag, queue, holders, aside, held_ms): Reply) -> LockInfo {
    let held = u32::try_from(holders.len()).unwrap_or(u32::MAX);
    let shared = tag
        .as_deref()
        .and_then(Share::from_tag)
        .filter(|_| held > 0)
        .map(|share| (held, share));
    let places = |places: Vec<(String, u64)>| -> Vec<Place> {
        places
            .into_iter()
            .map(|(token, ms)| Place::new(token, Duration::from_millis(ms)))
            .collect()
    };
    LockInfo {
        owner,
        remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
        held_for: held_ms.map(Duration::from_millis),
        fence,
        permits: match shared {
            Some((held, Share::Permits(total))) => Some(Permits { held, total }),
            _ => None,
        },
        readers: match shared {
            Some((held, Share::Read)) => Some(held),
            _ => None,
        },
        waiters: u32::try_from(queue.len()).unwrap_or(u32::MAX),
        queue: places(queue)
            .into_iter()
            .map(|place| {
                let standing = aside.contains(&place.token);
                place.standing_aside(standing)
            })
            .collect(),
        holders: if shared.is_some() {
            places(holders)
        } else {
            Vec::new()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places(of: &[(&str, u64)]) -> Vec<(String, u64)> {
        of.iter().map(|(t, ms)| ((*t).to_owned(), *ms)).collect()
    }

    #[test]
    fn an_exclusive_holder_its_lease_fence_and_queue_are_read_in_order_with_who_stands_aside() {
        let info = read((
            Some("h:1:aa".to_owned()),
            900,
            Some(7),
            None,
            places(&[("w:1:01", 800), ("w:2:02", 600)]),
            Vec::new(),
            vec!["w:2:02".to_owned()],
            Some(4_000),
        ));
        assert_eq!(info.owner.as_deref(), Some("h:1:aa"));
        assert_eq!(info.remaining, Some(Duration::from_millis(900)));
        assert_eq!(info.held_for, Some(Duration::from_millis(4_000)));
        assert_eq!(info.fence, Some(7));
        assert_eq!((info.permits, info.readers), (None, None));
        assert_eq!(info.waiters, 2);
        assert_eq!(
            info.queue,
            vec![
                Place::new("w:1:01", Duration::from_millis(800)),
                Place::new("w:2:02", Duration::from_millis(600)).standing_aside(true)
            ]
        );
        assert!(info.holders.is_empty());
    }

    #[test]
    fn a_semaphore_and_readers_are_read_from_their_tag_and_live_holders() {
        let holders = places(&[("p:1:01", 500), ("p:2:02", 300)]);
        let semaphore = read((
            None,
            500,
            None,
            Some("#permits=3".to_owned()),
            Vec::new(),
            holders.clone(),
            Vec::new(),
            None,
        ));
        assert_eq!(semaphore.permits, Some(Permits { held: 2, total: 3 }));
        assert_eq!(semaphore.readers, None);
        assert_eq!(semaphore.holders.len(), 2);
        let readers = read((
            None,
            500,
            None,
            Some("#read".to_owned()),
            Vec::new(),
            holders,
            Vec::new(),
            None,
        ));
        assert_eq!((readers.readers, readers.permits), (Some(2), None));
        // A set whose every place ran out is free, though its key has not expired yet.
        let spent = read((
            None,
            5,
            None,
            Some("#read".to_owned()),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            None,
        ));
        assert_eq!((spent.readers, spent.permits), (None, None));
        assert!(spent.holders.is_empty());
    }

    #[test]
    fn a_free_key_has_no_owner_and_no_lease() {
        let free = read((
            None,
            -2,
            None,
            None,
            Vec::new(),
            Vec::new(),
            Vec::new(),
            None,
        ));
        assert_eq!(free, LockInfo::default());
    }
}
