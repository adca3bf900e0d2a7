//! The marks waiters leave on a lock's value, as the client reads them: what the scripts mark
//! (`WAITED`, `ours` in `prelude.lua`) and how a value shows it.

/// What a lock's value has after its holder's token once someone waited for it (`WAITED` in
/// `prelude.lua`, which spells it too; a test holds the two equal).
const WAITED: &str = "+w";

/// Whether `token` is one the scripts mark once someone waits for it (`ours` in
/// `prelude.lua`: `host:pid:` and 32 hex digits, as `token::new_token` makes them). Another
/// client's token is never marked, so only the release script can tell whether its lock was
/// waited for.
pub(crate) fn marked_when_waited(token: &str) -> bool {
    crate::token::is_ours(token)
}

/// Whether a release of `token` may end in silence when it finds the bare token (nobody
/// waited): one the scripts mark, and not a candidate's (see `election`), whose end is news for
/// its observers, whom no mark counts.
pub(crate) fn silent_when_bare(token: &str) -> bool {
    marked_when_waited(token) && crate::token::identity_of(token).is_none()
}

/// Whether `value` is `token` marked as waited for.
pub(crate) fn waited_for(value: &[u8], token: &str) -> bool {
    value.strip_suffix(WAITED.as_bytes()) == Some(token.as_bytes())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_prelude_marks_a_waited_for_lock_as_the_client_reads_it() {
        let prelude = include_str!("prelude.lua");
        assert!(prelude.contains(&format!("local WAITED = '{}'", super::WAITED)));
        assert!(super::waited_for(b"h:1:ab+w", "h:1:ab"));
        assert!(!super::waited_for(b"h:1:ab", "h:1:ab"));
        assert!(!super::waited_for(b"h:2:ab+w", "h:1:ab"));
        let ours = "host:12:0123456789abcdef0123456789abcdef";
        assert!(super::marked_when_waited(ours));
        assert!(super::marked_when_waited(&crate::token::new_token(None)));
        let candidate = crate::token::new_token(Some("10.0.0.5:8080"));
        assert!(super::marked_when_waited(&candidate), "{candidate}");
        assert!(
            !super::silent_when_bare(&candidate),
            "a leader's end is always news"
        );
        assert!(super::silent_when_bare(ours));
        for foreign in [
            "python-worker",
            "h:1:ab",
            "host:x:0123456789abcdef0123456789abcdef",
        ] {
            assert!(!super::marked_when_waited(foreign), "{foreign}");
        }
    }
}
