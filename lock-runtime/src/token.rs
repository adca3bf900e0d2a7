//! Owner tokens: unguessable, unique per acquisition, readable for whoever inspects a key; a
//! candidate's (see `election`) also carries the identity its leader shows observers.

use std::cell::RefCell;
use std::sync::LazyLock;

/// `host:pid:` — only for people reading keys in redis-cli; uniqueness comes from the random part.
static OWNER_PREFIX: LazyLock<String> = LazyLock::new(|| {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        // No `@`: a candidate's token ends its identity at the last one.
        .filter(|c| c.is_ascii_graphic() && *c != ':' && *c != '@')
        .take(32)
        .collect();
    let host = if host.is_empty() { "host".into() } else { host };
    format!("{host}:{}:", std::process::id())
});

/// Who a candidate says it is unless told otherwise (see `election`): `host:pid`.
pub(crate) fn default_identity() -> String {
    OWNER_PREFIX.trim_end_matches(':').to_owned()
}

/// Random bytes are drawn from the OS a page at a time: one syscall per 256 tokens instead of
/// one per acquisition. Still the OS random source, never a userspace generator.
const POOL: usize = 4096;

thread_local! {
    /// The pool, how much of it is used, and the process that drew it: a `fork()` without
    /// `exec` copies the pool, and parent and child must never hand out the same bytes.
    static RANDOM: RefCell<(Box<[u8; POOL]>, usize, u32)> =
        RefCell::new((Box::new([0; POOL]), POOL, 0));
}

/// A fresh token: the owner prefix and 128 bits from the operating system's random source,
/// after `identity` where one is given (a candidate's, see `election`), as
/// `identity@host:pid:random`: whoever reads the key learns who holds it, and the scripts still
/// know the token for one of ours by its end.
pub(crate) fn new_token(identity: Option<&str>) -> String {
    let mut bytes = [0u8; 16];
    RANDOM.with_borrow_mut(|(pool, used, drawn_by)| {
        let pid = std::process::id();
        if *used + bytes.len() > POOL || *drawn_by != pid {
            // Without OS randomness a token could be guessed or repeated; no lock is safer.
            getrandom::fill(&mut pool[..])
                .expect("the OS random source failed; refusing to mint a guessable lock token");
            *used = 0;
            *drawn_by = pid;
        }
        bytes.copy_from_slice(&pool[*used..*used + 16]);
        // Each token's bytes are used once; overwrite them so they never linger in memory.
        pool[*used..*used + 16].fill(0);
        *used += 16;
    });
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let identity_len = identity.map_or(0, |i| i.len() + 1);
    let mut token = String::with_capacity(identity_len + OWNER_PREFIX.len() + 32);
    if let Some(identity) = identity {
        token.push_str(identity);
        token.push('@');
    }
    token.push_str(&OWNER_PREFIX);
    for b in bytes {
        token.push(char::from(HEX[usize::from(b >> 4)]));
        token.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    token
}

/// Who holds a lock, as a token of ours says it (`host:pid:` and 128 random bits in hex, after
/// a candidate's `identity@`): what `lockctl` and other tools show instead of the token, which
/// must stay secret (whoever has it can release or extend the lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TokenOwner<'a> {
    /// A candidate's identity (see [`Registry::election`](crate::Registry::election)).
    pub identity: Option<&'a str>,
    /// The host name of the process that took the lock.
    pub host: &'a str,
    /// Its process id.
    pub pid: u32,
    /// The first 8 hex digits of the random part: enough to tell owners apart.
    pub short: &'a str,
}

impl<'a> TokenOwner<'a> {
    /// Reads `token`; `None` when it is not of our form (another client's: redis-py, redsync..).
    #[must_use]
    pub fn parse(token: &'a str) -> Option<Self> {
        let mut parts = token.rsplitn(3, ':');
        let (random, pid, owner) = (parts.next()?, parts.next()?, parts.next()?);
        let random_ok = random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit());
        let pid_ok = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
        if !(random_ok && pid_ok) {
            return None;
        }
        let (identity, host) = match owner.rsplit_once('@') {
            Some((identity, host)) => ((!identity.is_empty()).then_some(identity), host),
            None => (None, owner),
        };
        Some(Self {
            identity,
            host,
            pid: pid.parse().ok()?,
            short: &random[..8],
        })
    }
}

impl std::fmt::Display for TokenOwner<'_> {
    /// `identity@host:pid:0123abcd…`: the token without the rest of its secret part.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(identity) = self.identity {
            write!(f, "{identity}@")?;
        }
        write!(f, "{}:{}:{}…", self.host, self.pid, self.short)
    }
}

/// Whether `token` is of our form: `host:pid:` and 32 hex digits, after a candidate's identity.
pub(crate) fn is_ours(token: &str) -> bool {
    TokenOwner::parse(token).is_some()
}

/// The identity a candidate's token shows (see [`new_token`]); `None` for any other token.
pub(crate) fn identity_of(token: &str) -> Option<&str> {
    TokenOwner::parse(token)?.identity
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_carry_128_random_bits_after_a_readable_owner() {
        let a = new_token(None);
        let b = new_token(None);
        assert_ne!(a, b);
        let random = a.rsplit(':').next().unwrap();
        assert_eq!(random.len(), 32);
        assert!(random.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(a.contains(&format!(":{}:", std::process::id())));
    }

    #[test]
    fn a_candidates_token_shows_its_identity_and_no_other_token_does() {
        let token = new_token(Some("10.0.0.5:8080@eu"));
        assert!(token.starts_with("10.0.0.5:8080@eu@"));
        assert_eq!(identity_of(&token), Some("10.0.0.5:8080@eu"));
        assert_eq!(identity_of(&new_token(None)), None);
        assert_eq!(identity_of("someone@python-worker"), None);
    }

    #[test]
    fn an_owner_is_read_from_our_tokens_only() {
        let random = "0123456789abcdef0123456789abcdef";
        let owner = TokenOwner::parse(&format!("web-1:4242:{random}")).map(|o| o.to_string());
        assert_eq!(owner.as_deref(), Some("web-1:4242:01234567…"));
        // Hosts may contain colons (IPv6); the last two fields are pid and random.
        let token = format!("::1:7:{random}");
        let owner = TokenOwner::parse(&token).unwrap();
        assert_eq!((owner.host, owner.pid, owner.identity), ("::1", 7, None));
        let token = format!("10.0.0.5:8080@eu@web-1:9:{random}");
        let owner = TokenOwner::parse(&token).unwrap();
        assert_eq!(owner.identity, Some("10.0.0.5:8080@eu"));
        assert_eq!(owner.to_string(), "10.0.0.5:8080@eu@web-1:9:01234567…");
        // redis-py writes a bare uuid hex; a pid must be digits.
        assert_eq!(TokenOwner::parse(random), None);
        assert_eq!(TokenOwner::parse(&format!("web:x1:{random}")), None);
    }

    #[test]
    fn tokens_stay_unique_across_pool_refills() {
        let tokens: std::collections::HashSet<String> =
            (0..2000).map(|_| new_token(None)).collect();
        assert_eq!(tokens.len(), 2000);
    }
}
