//! How long to wait for Redis: connecting, and each command.

use std::time::Duration;

use crate::error::LockError;

/// A registry's two timeouts, validated by its builder.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub connect: Duration,
    pub command: Duration,
}

/// Used for a timeout the builder was not given.
const DEFAULT: Duration = Duration::from_secs(2);

/// The longest timeout taken as given. The runtime adds and doubles timeouts to bound its
/// background work; a day keeps that arithmetic far from overflowing, and no Redis command is
/// worth waiting longer for.
const MAX: Duration = Duration::from_secs(24 * 3600);

impl Timeouts {
    /// The builder's settings: 2 s when unset, refused when zero, clamped to a day.
    pub(crate) fn new(
        connect: Option<Duration>,
        command: Option<Duration>,
    ) -> Result<Self, LockError> {
        Ok(Self {
            connect: given(connect, "connect_timeout")?,
            command: given(command, "command_timeout")?,
        })
    }

    /// Enough for one reconnection and one round of commands.
    pub(crate) fn round(self) -> Duration {
        self.connect + self.command
    }
}

fn given(timeout: Option<Duration>, option: &str) -> Result<Duration, LockError> {
    match timeout {
        None => Ok(DEFAULT),
        Some(d) if d.is_zero() => Err(LockError::config(format!(
            "`{option}` is zero, so every operation would time out at once; give it at least \
             1 ms (the default is 2 s, and anything beyond a day counts as a day)"
        ))),
        Some(d) => Ok(d.min(MAX)),
    }
}
