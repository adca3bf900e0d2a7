//! Which native commands a server takes, learned from its replies: `SET .. IFEQ` for renewals
//! (Valkey 8.1+) and `DELIFEQ` for releases (Valkey 9+). Each stands in for a script call where
//! the server has it, and costs the server no Lua.

use std::sync::atomic::{AtomicU8, Ordering};

use redis::ServerErrorKind;

use crate::report;

/// Whether one server takes one native command (one per backend and command: per server, per
/// Redlock node, per cluster master).
///
/// Unknown until the server answers one; a reply turns it on; `ERR` (a server without the
/// command: unknown command or a syntax error) or `NOPERM` (an ACL without it) turns it off for
/// the life of the registry. Any other error reply (`WRONGTYPE`, `OOM`, `MOVED`, `LOADING`)
/// says nothing. Wherever it is used, the script answers instead when the command is off or
/// got an error reply, exactly as it would have without it.
#[derive(Debug, Default)]
pub(crate) struct Native {
    /// [`UNKNOWN`], [`ON`] or [`OFF`].
    state: AtomicU8,
}

pub(crate) const UNKNOWN: u8 = 0;
pub(crate) const ON: u8 = 1;
pub(crate) const OFF: u8 = 2;

impl Native {
    /// [`UNKNOWN`], [`ON`] or [`OFF`].
    pub(crate) fn state(&self) -> u8 {
        self.state.load(Ordering::Relaxed)
    }

    /// Whether the server took the command.
    #[cfg(test)]
    pub(crate) fn on(&self) -> bool {
        self.state() == ON
    }

    /// Whether the command is worth sending: the server took it, or has not answered one yet.
    pub(crate) fn worth_trying(&self) -> bool {
        self.state() != OFF
    }

    /// Learns from one reply of `command`: `Ok` means the server takes it; `ERR` or `NOPERM`
    /// that it does not.
    pub(crate) fn learn(&self, command: &str, reply: Result<(), &redis::ServerError>) {
        match reply {
            Ok(()) => {
                if self.state() == UNKNOWN {
                    self.state.store(ON, Ordering::Relaxed);
                }
            }
            Err(e) if refuses(e.kind()) => self.turn_off(command, e),
            Err(_) => {}
        }
    }

    /// [`Self::learn`] from the error of a command sent on its own; whether it was a server's
    /// reply (the script may answer instead), not a failure to reach the server.
    pub(crate) fn learn_error(&self, command: &str, e: &redis::RedisError) -> bool {
        match e.kind() {
            // `Extension`: a server error code the client has no name for.
            redis::ErrorKind::Extension => true,
            redis::ErrorKind::Server(kind) => {
                if refuses(Some(kind)) {
                    self.turn_off(command, e);
                }
                true
            }
            _ => false,
        }
    }

    /// The server refused `command` (`error`): the script stands in for it from now on.
    fn turn_off(&self, command: &str, error: &dyn std::fmt::Display) {
        if self.state.swap(OFF, Ordering::Relaxed) != OFF {
            let (command, error) = (command.to_owned(), error.to_string());
            report::tell(move || {
                tracing::debug!(
                    %error,
                    "this server does not take {command}: the script stands in for it"
                );
            });
        }
    }
}

/// `ERR` (no such command, a syntax error) or `NOPERM`.
fn refuses(kind: Option<ServerErrorKind>) -> bool {
    matches!(
        kind,
        Some(ServerErrorKind::ResponseError | ServerErrorKind::NoPerm)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_turns_it_on_err_or_noperm_off_other_errors_teach_nothing() {
        let native = Native::default();
        assert!(native.worth_trying() && !native.on());
        native.learn("DELIFEQ", Ok(()));
        assert!(native.on());
        for other in [
            "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
            "-MOVED 3999 127.0.0.1:6381\r\n",
        ] {
            let e = redis::parse_redis_value(other.as_bytes()).expect("valid RESP");
            let e: redis::RedisError = e.extract_error().expect_err("an error reply");
            assert!(native.learn_error("DELIFEQ", &e), "{other}");
            assert!(native.on(), "{other}");
        }
        let e = redis::parse_redis_value(b"-ERR unknown command 'DELIFEQ'\r\n").expect("RESP");
        let e: redis::RedisError = e.extract_error().expect_err("an error reply");
        assert!(native.learn_error("DELIFEQ", &e));
        assert!(!native.worth_trying());
    }
}
