//! What a script call is: `EVALSHA` of a script's text, by its SHA-1, with the keys and
//! arguments its module gives.

use std::sync::OnceLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, ServerErrorKind, ToRedisArgs};

use crate::key::LockKey;
use crate::names::{self, Companions};

/// A script's text and its SHA-1, which `EVALSHA` names it by (worked out once).
pub(super) struct Script {
    lua: &'static str,
    sha: OnceLock<String>,
}

impl Script {
    pub(super) const fn new(lua: &'static str) -> Self {
        Self {
            lua,
            sha: OnceLock::new(),
        }
    }

    fn sha(&self) -> &str {
        self.sha
            .get_or_init(|| sha1_smol::Sha1::from(self.lua).digest().to_string())
    }
}

/// One call of a script: `EVALSHA` with its keys and arguments, sent in a pipeline as it is
/// ([`cmd`](Self::cmd)), or alone ([`run`](Self::run)), which loads the script when the server
/// lost it.
pub(crate) struct Call {
    script: &'static Script,
    cmd: Cmd,
}

impl Call {
    pub(super) fn new(script: &'static Script, keys: &[&str]) -> Self {
        // Sized for the keys and a dozen short arguments, so that adding them does not grow it.
        let names: usize = keys.iter().map(|k| k.len()).sum();
        let mut cmd = Cmd::with_capacity(keys.len() + 16, names + 192);
        cmd.arg("EVALSHA");
        cmd.arg(script.sha()).arg(keys.len()).arg(keys);
        Self { script, cmd }
    }

    pub(super) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// The command, for a pipeline (which deals with `NOSCRIPT` itself).
    pub(crate) fn cmd(self) -> Cmd {
        self.cmd
    }

    /// Sends the call on its own; after a `NOSCRIPT` (a restart, `SCRIPT FLUSH`, a new master)
    /// loads the script and sends it once more.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        con: &mut (impl ConnectionLike + Send),
    ) -> redis::RedisResult<T> {
        match self.cmd.query_async(con).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(self.script.lua)
                    .query_async::<()>(con)
                    .await?;
                self.cmd.query_async(con).await
            }
            reply => reply,
        }
    }
}

/// The keys the acquire and release scripts name: the lock, then with `queued` its fencing
/// counter and waiters' queue, else the counter only when `fencing` (during a slot migration
/// Redis refuses a script whose keys are not all on one node, and a lock without fencing may
/// have no counter at all).
pub(super) fn locking(script: &'static Script, key: &LockKey, queued: bool, fencing: bool) -> Call {
    let lock = key.stored.as_str();
    if queued {
        let c = Companions::of(key);
        Call::new(script, &[lock, &c.fence, &c.queue, &c.queued])
    } else if fencing {
        Call::new(script, &[lock, &names::fence(key)])
    } else {
        Call::new(script, &[lock])
    }
}
