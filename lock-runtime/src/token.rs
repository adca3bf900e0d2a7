//! Owner tokens: unguessable, unique per acquisition, readable for whoever inspects a key.

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
        .filter(|c| c.is_ascii_graphic() && *c != ':')
        .take(32)
        .collect();
    let host = if host.is_empty() { "host".into() } else { host };
    format!("{host}:{}:", std::process::id())
});

/// Random bytes are drawn from the OS a page at a time: one syscall per 256 tokens instead of
/// one per acquisition. Still the OS random source, never a userspace generator.
const POOL: usize = 4096;

thread_local! {
    /// The pool, how much of it is used, and the process that drew it: a `fork()` without
    /// `exec` copies the pool, and parent and child must never hand out the same bytes.
    static RANDOM: RefCell<(Box<[u8; POOL]>, usize, u32)> =
        RefCell::new((Box::new([0; POOL]), POOL, 0));
}

/// A fresh token: the owner prefix and 128 bits from the operating system's random source.
pub(crate) fn new_token() -> String {
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
    let mut token = String::with_capacity(OWNER_PREFIX.len() + 32);
    token.push_str(&OWNER_PREFIX);
    for b in bytes {
        token.push(char::from(HEX[usize::from(b >> 4)]));
        token.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    token
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_carry_128_random_bits_after_a_readable_owner() {
        let a = new_token();
        let b = new_token();
        assert_ne!(a, b);
        let random = a.rsplit(':').next().unwrap();
        assert_eq!(random.len(), 32);
        assert!(random.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(a.contains(&format!(":{}:", std::process::id())));
    }

    #[test]
    fn tokens_stay_unique_across_pool_refills() {
        let tokens: std::collections::HashSet<String> = (0..2000).map(|_| new_token()).collect();
        assert_eq!(tokens.len(), 2000);
    }
}
