//! Redis errors: telling a silent server from one that refused, and what callers are told.

use std::time::Duration;

use crate::error::{LockError, StoreError};

/// Whether `e` means the server gave no answer at all (a timeout, a broken or dropped
/// connection), as opposed to an answer that refused.
pub(crate) fn unanswered(e: &redis::RedisError) -> bool {
    e.is_timeout() || e.is_io_error() || e.is_connection_dropped()
}

/// What to add to a failed connect, for two mistakes its error would hide: a server (or
/// sentinel) that listens only for TLS drops a plain connection as soon as its first bytes fail
/// the handshake, which reads as a mere reset; and a TLS client that does not trust the server's
/// CA (a private one, as a rule) gets rustls' bare "invalid peer certificate".
pub(crate) fn connect_hint(e: &redis::RedisError, tls: bool) -> &'static str {
    // Either side of a Sentinel deployment may be the TLS one: the certificate's error is
    // looked for whatever the first hop speaks.
    if e.to_string().contains("invalid peer certificate") {
        " (the server's certificate did not verify: if a private CA signed it, give that CA \
         with RegistryBuilder::tls_root_cert, or point SSL_CERT_FILE at its PEM)"
    } else if !tls && e.is_connection_dropped() && !e.is_connection_refusal() && !e.is_timeout() {
        " (a server that listens only for TLS drops plain connections like this: if it does, \
         use rediss:// URLs)"
    } else {
        ""
    }
}

/// The error of a call that got no answer within `budget`.
pub(crate) fn timed_out(budget: Duration) -> redis::RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer within {budget:?}"),
    )
    .into()
}

/// The error `command` on `node` ended with, for the caller.
pub(crate) fn lock_error(
    node: &str,
    command: &'static str,
    key: Option<&str>,
    e: redis::RedisError,
) -> LockError {
    if let Some(refused) = corrupt_key(node, key, &e) {
        return refused;
    }
    LockError::Backend {
        node: node.to_owned(),
        command,
        key: key.map(str::to_owned),
        message: e.to_string(),
        source: Some(store_error(e)),
    }
}

/// A script's refusal of a key beside the lock that holds what no script wrote there
/// (`corrupt` in the scripts' prelude: `CORRUPTKEY <role> <type found> <Redis key>`), made
/// before the script wrote anything: an [`LockError::InvalidKey`] that names the key and says
/// to delete it, which is always safe.
fn corrupt_key(node: &str, key: Option<&str>, e: &redis::RedisError) -> Option<LockError> {
    if e.code() != Some("CORRUPTKEY") {
        return None;
    }
    let mut parts = e.detail()?.splitn(3, ' ');
    let (role, found, name) = (parts.next()?, parts.next()?, parts.next()?);
    let (should, after) = match role {
        "counter" => (
            "the lock's fencing counter (a fencing token: digits, below 2^53 - 1)",
            "the next fencing token then starts from the server's clock, above every earlier one",
        ),
        "queue" => (
            "the lock's waiters' queue (a sorted set)",
            "waiters take their places again at their next attempt",
        ),
        _ => (
            "the lock's waiters' places (a hash)",
            "waiters take their places again at their next attempt",
        ),
    };
    let name = crate::error::shown(name);
    if (role, found) == ("counter", "exhausted") {
        return Some(LockError::InvalidKey {
            key: key.unwrap_or_default().to_owned(),
            reason: format!(
                "Redis key `{name}` on {node} holds the last fencing token of the range \
                 (2^53 - 1): no later token can be issued for this lock, and nothing was \
                 changed. Only another writer brings a counter there (the library's tokens \
                 follow the clock in microseconds); lock another key, or delete it \
                 (`DEL {name}`), after which tokens restart from the server's clock, below it"
            ),
        });
    }
    let found = match (role, found) {
        ("counter", "string") => "a string that is not a fencing token".to_owned(),
        (_, kind) => format!("a {kind}"),
    };
    Some(LockError::InvalidKey {
        key: key.unwrap_or_default().to_owned(),
        reason: format!(
            "Redis key `{name}` on {node} should hold {should} but holds {found}, which the \
             library never writes; nothing was changed. Delete it (`DEL {name}`) and try again: \
             {after}"
        ),
    })
}

/// `e` as the source of a [`LockError`], read for whether a retry may get past it.
pub(crate) fn store_error(e: redis::RedisError) -> StoreError {
    let (transient, never_sent) = (transient(&e), e.is_connection_refusal());
    StoreError::new(e, transient, never_sent)
}

/// Whether the server or the connection may answer otherwise next time: everything but a
/// refusal that stands (permissions, credentials, the type under a key, a command or syntax
/// the server does not have, a client set up wrongly).
fn transient(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    let lasting_code = matches!(
        e.code(),
        Some("NOPERM" | "WRONGPASS" | "NOAUTH" | "WRONGTYPE" | "CROSSSLOT")
    );
    let lasting_answer = e.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
        && e.detail().is_some_and(|detail| {
            let detail = detail.to_ascii_lowercase();
            [
                "unknown command",
                "unknown subcommand",
                "wrong number of arguments",
                "syntax error",
                // An ACL refusal of a command a script runs (Redis 7, Valkey).
                "the user executing the script can't run",
                "acl failure in script",
            ]
            .iter()
            .any(|cause| detail.starts_with(cause))
        });
    let lasting_kind = matches!(
        e.kind(),
        ErrorKind::AuthenticationFailed
            | ErrorKind::InvalidClientConfig
            | ErrorKind::Server(ServerErrorKind::NoPerm | ServerErrorKind::CrossSlot)
    );
    !(lasting_code || lasting_answer || lasting_kind)
}

/// A failure already told as a [`LockError`], back as the client's error (for a renewal round,
/// a batch).
pub(crate) fn redis_error(e: &LockError) -> redis::RedisError {
    match e {
        LockError::Backend {
            source: Some(source),
            ..
        } if source.get_ref().is::<redis::RedisError>() => source
            .get_ref()
            .downcast_ref::<redis::RedisError>()
            .expect("checked")
            .clone(),
        other => (redis::ErrorKind::Client, "lock-runtime", other.to_string()).into(),
    }
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;

    /// The hint keys on rustls' wording: this fails if a rustls upgrade changes it.
    #[test]
    fn an_unverified_certificate_gets_the_ca_hint_on_either_first_hop() {
        let untrusted = || -> redis::RedisError {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
            )
            .into()
        };
        assert!(connect_hint(&untrusted(), true).contains("tls_root_cert"));
        assert!(connect_hint(&untrusted(), false).contains("SSL_CERT_FILE"));
    }
}
