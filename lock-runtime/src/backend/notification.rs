//! The release notifications the scripts publish on a lock's channel, read into the waiting
//! hub's [`Notice`]s (see `protocol` for the messages themselves).

use crate::waiting::{Grant, Notice};

/// What an elected candidate publishes on its key's channel: observers learn of a leader that
/// took a free lock, which no release announced.
pub(crate) const ELECTED: &str = "+elected";

/// Reads a message from a lock's channel: `+elected`; `<released>:<next>:<fence>[:<place>]`
/// when a release (or an acquisition that found the lock free, with `<released>` empty) handed
/// the lock to the waiter whose tenure is `<next>`; anything else frees the lock, naming the
/// released tenure where the message is one.
pub(crate) fn read(message: &str) -> Notice<'_> {
    if message == ELECTED {
        return Notice::Taken;
    }
    let parts: Vec<&str> = message.splitn(5, ':').collect();
    if let [released, next, fence, place @ ..] = parts.as_slice() {
        let place = match place {
            [] => Some(None),
            [place] => place.parse().ok().map(Some),
            _ => None,
        };
        if let (true, true, Ok(fence), Some(place)) = (
            released.is_empty() || names_a_tenure(released),
            names_a_tenure(next),
            fence.parse(),
            place,
        ) {
            return Notice::HandedOver {
                next,
                grant: Grant { fence, place },
            };
        }
    }
    Notice::Freed {
        released: names_a_tenure(message).then_some(message),
    }
}

/// Whether a message names a tenure (`waiting::tenure_name`, the scripts' `redis.sha1hex` of
/// a token): 40 lowercase hex digits. Anything else (another client's `released`, say) wakes a
/// waiter every time it arrives.
fn names_a_tenure(message: &str) -> bool {
    message.len() == 40
        && message
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::waiting::tenure_name;

    #[test]
    fn a_tenure_is_forty_lowercase_hex_digits() {
        assert!(names_a_tenure(&tenure_name("host:1:00ff")));
        assert!(!names_a_tenure("released"));
        assert!(!names_a_tenure(&tenure_name("x").to_uppercase()));
    }

    #[test]
    fn each_message_the_scripts_publish_is_read() {
        let (old, next) = (tenure_name("old"), tenure_name("chosen-token"));
        assert_eq!(read(ELECTED), Notice::Taken);
        assert_eq!(
            read(&old),
            Notice::Freed {
                released: Some(&old)
            }
        );
        assert_eq!(
            read(&format!("{old}:{next}:42:7")),
            Notice::HandedOver {
                next: &next,
                grant: Grant {
                    fence: 42,
                    place: Some(7)
                }
            }
        );
        // An acquisition that found the lock free and handed it to the oldest waiter names no
        // released tenure; an older releaser names no place.
        assert_eq!(
            read(&format!(":{next}:0")),
            Notice::HandedOver {
                next: &next,
                grant: Grant {
                    fence: 0,
                    place: None
                }
            }
        );
    }

    #[test]
    fn a_message_that_is_not_ours_frees_the_lock_naming_nobody() {
        let next = tenure_name("n");
        for other in [
            "released".to_owned(),
            String::new(),
            format!("{next}:{next}:not-a-fence"),
            format!("{next}:{next}:1:not-a-place"),
            format!("{next}:NOT-A-TENURE:1"),
            format!("{next}:{next}:1:2:3"),
        ] {
            assert_eq!(read(&other), Notice::Freed { released: None }, "{other:?}");
        }
    }
}
