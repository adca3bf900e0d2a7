//! Group commit: the acquisitions and releases one process sends one server at the same time
//! go out together, in one write.
//!
//! An operation that finds nothing in flight goes out at once, alone, so a single task pays
//! nothing for the batching. Operations that arrive while one is in flight queue up and go out
//! together as one pipeline: at once while fewer than [`DEPTH`] are in flight, else when one
//! returns, and so on while any are queued. Each keeps its own commands (a plain `SET NX PX` or
//! `DELIFEQ` first where the lone path sends one, the acquire and release scripts), except the
//! releases of bare tokens on a server without `DELIFEQ`: those of a batch go as one call of
//! [`RELEASE_BARE_LUA`](super::scripts::RELEASE_BARE_LUA), whose Lua costs the server once per
//! batch instead of once per release. Under load the client writes and reads once per round
//! trip, and Redis reads, and answers, a whole batch per system call.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};
use tokio::sync::oneshot;

use super::connection::SharedConnection;
use super::scripts;
use crate::io;

/// At most this many operations per write, so that one batch cannot hold the server for long.
const MOST: usize = 256;

/// Operations or batches in flight at once. With one, an operation that arrives just after
/// another went out waits a whole round trip (a release behind an acquisition that joins the
/// queue delays every handoff); with two, it goes out at once while the first is on its way,
/// and whatever arrives while both are out goes with the next.
const DEPTH: usize = 2;

/// One operation: its command, and for one that tries something cheaper first (an
/// acquisition's plain `SET NX PX`, a release's `DELIFEQ` or bare release), the script to send
/// next if it is refused (nil, or 0), as the lone path does.
pub(crate) struct Op {
    command: Command,
    if_refused: Option<Cmd>,
}

enum Command {
    /// Sent as it is.
    One(Cmd),
    /// The release of a bare token (lock key, token), sent with the batch's others in one call.
    Bare { key: String, token: String },
}

impl Op {
    /// `command`, and nothing after it.
    pub(crate) fn one(command: Cmd) -> Self {
        Self {
            command: Command::One(command),
            if_refused: None,
        }
    }

    /// `command`, then `script` if it was refused.
    pub(crate) fn first(command: Cmd, script: Cmd) -> Self {
        Self {
            command: Command::One(command),
            if_refused: Some(script),
        }
    }

    /// The release of `token` (one that waiters mark) on `key` if its value is the bare token,
    /// else `script`.
    pub(crate) fn bare_release(key: &str, token: &str, script: Cmd) -> Self {
        Self {
            command: Command::Bare {
                key: key.to_owned(),
                token: token.to_owned(),
            },
            if_refused: Some(script),
        }
    }
}

/// What the operation's last command replied (an error in it included): `Okay` for a plain
/// `SET` that took the lock.
pub(crate) type Reply = redis::RedisResult<Value>;

/// The group commit of one connection.
pub(crate) struct Coalescer {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Arc<SharedConnection>,
    state: Mutex<State>,
}

type Queued = (Op, oneshot::Sender<Reply>);

#[derive(Default)]
struct State {
    /// Operations sent alone, and senders of batches, at work (at most [`DEPTH`]).
    in_flight: usize,
    queued: Vec<Queued>,
}

/// Whether an operation goes out alone or with the next batch.
pub(crate) enum Turn {
    /// Nothing was in flight: send the operation's own commands now, and drop this when done.
    Alone(Alone),
    /// Queued behind what is in flight: the reply arrives here.
    Queued(oneshot::Receiver<Reply>),
}

impl Coalescer {
    pub(crate) fn new(connection: Arc<SharedConnection>) -> Self {
        Self {
            inner: Arc::new(Inner {
                connection,
                state: Mutex::default(),
            }),
        }
    }

    /// The caller's turn: alone when nothing is in flight, else queued with `op()` (and sent
    /// at once if fewer than [`DEPTH`] are in flight).
    pub(crate) fn enter(&self, op: impl FnOnce() -> Op) -> Turn {
        let mut state = self.inner.state();
        if state.in_flight == 0 {
            state.in_flight = 1;
            return Turn::Alone(Alone(self.inner.clone()));
        }
        let (tx, rx) = oneshot::channel();
        state.queued.push((op(), tx));
        if state.in_flight < DEPTH {
            state.in_flight += 1;
            drop(state);
            self.inner.clone().start_sender();
        }
        Turn::Queued(rx)
    }
}

/// The reply of a queued operation; a batch that ended without answering reads as an error.
pub(crate) async fn reply(queued: oneshot::Receiver<Reply>) -> Reply {
    queued.await.unwrap_or_else(|_| {
        Err((
            redis::ErrorKind::Client,
            "lock-runtime: a batch ended without its reply",
        )
            .into())
    })
}

/// An operation in flight alone. Dropped (done, failed or cancelled), it sends what queued up
/// behind it.
pub(crate) struct Alone(Arc<Inner>);

impl Drop for Alone {
    fn drop(&mut self) {
        let mut state = self.0.state();
        if state.queued.is_empty() {
            state.in_flight -= 1;
        } else {
            // Its place in flight goes to a sender of what queued up behind it.
            drop(state);
            self.0.clone().start_sender();
        }
    }
}

/// A sender of batches at work: it leaves its place in flight when dropped, however it ended.
struct Busy(Option<Arc<Inner>>);

impl Busy {
    /// Sends what is queued, one batch per round trip, until nothing is.
    async fn flush(mut self) {
        let Some(inner) = self.0.clone() else { return };
        loop {
            let batch: Vec<Queued> = {
                let mut state = inner.state();
                if state.queued.is_empty() {
                    state.in_flight -= 1;
                    self.0 = None;
                    return;
                }
                let n = state.queued.len().min(MOST);
                // An operation whose caller was cancelled is not sent: nothing of it reached
                // the server, and nobody would read its reply.
                state
                    .queued
                    .drain(..n)
                    .filter(|(_, tx)| !tx.is_closed())
                    .collect()
            };
            if batch.is_empty() {
                continue;
            }
            let replies = inner.send(&batch).await;
            let mut again = Vec::new();
            for ((op, tx), reply) in batch.into_iter().zip(replies) {
                match (reply, op.if_refused) {
                    (Ok(Value::Nil | Value::Int(0)), Some(_)) if tx.is_closed() => {}
                    (Ok(Value::Nil | Value::Int(0)), Some(script)) => {
                        again.push((Op::one(script), tx));
                    }
                    (reply, _) => drop(tx.send(reply)),
                }
            }
            if !again.is_empty() {
                // Refused plain `SET`s ask the script who holds the lock, and refused
                // `DELIFEQ`s and bare releases let it release, ahead of later operations, as
                // the lone path would right away.
                let mut state = inner.state();
                again.append(&mut state.queued);
                state.queued = again;
            }
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take() {
            // Only if the flush itself panicked: nothing may stay queued with no sender left.
            let mut state = inner.state();
            state.in_flight -= 1;
            if state.in_flight == 0 {
                state.queued.clear();
            }
        }
    }
}

impl Inner {
    /// Spawns a sender of what is queued, in the place in flight the caller took for it.
    fn start_sender(self: Arc<Self>) {
        drop(io::spawn(Busy(Some(self)).flush()));
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state whole: a panic elsewhere leaves nothing half-written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One pipeline of the batch's commands: one reply per operation.
    async fn send(&self, batch: &[Queued]) -> Vec<Reply> {
        // The bare releases (operation, lock key, token), which go as one call where the first
        // of them was.
        let bare: Vec<(usize, &str, &str)> = batch
            .iter()
            .enumerate()
            .filter_map(|(i, (op, _))| match &op.command {
                Command::Bare { key, token } => Some((i, key.as_str(), token.as_str())),
                Command::One(_) => None,
            })
            .collect();
        // What goes on the wire, each command with the operation it answers (`None`: the bare
        // releases' call).
        let mut commands = Vec::new();
        for (i, (op, _)) in batch.iter().enumerate() {
            match &op.command {
                Command::One(cmd) => commands.push((cmd.clone(), Some(i))),
                Command::Bare { .. } if bare.first().is_some_and(|&(first, ..)| first == i) => {
                    let locks = bare.iter().map(|&(_, key, token)| (key, token));
                    commands.push((scripts::release::bare(locks), None));
                }
                Command::Bare { .. } => {}
            }
        }
        let replies = self.pipeline(&commands).await;
        let mut out: Vec<Reply> = batch.iter().map(|_| Ok(Value::Nil)).collect();
        for ((_, op), reply) in commands.iter().zip(replies) {
            if let Some(i) = op {
                out[*i] = reply;
                continue;
            }
            match reply.and_then(|v| scripts::release::bare_replies(v, bare.len())) {
                Ok(released) => {
                    for (&(i, ..), released) in bare.iter().zip(released) {
                        out[i] = Ok(Value::Int(released));
                    }
                }
                Err(e) => {
                    for &(i, ..) in &bare {
                        out[i] = Err(e.clone());
                    }
                }
            }
        }
        out
    }

    /// `commands` in one pipeline: one reply each.
    async fn pipeline(&self, commands: &[(Cmd, Option<usize>)]) -> Vec<Reply> {
        let failed = |e: &redis::RedisError| commands.iter().map(|_| Err(e.clone())).collect();
        let mut con = match self.connection.get("batch", None).await {
            Ok(con) => con,
            Err(e) => return failed(&super::errors::redis_error(&e)),
        };
        let mut pipe = redis::pipe();
        for (cmd, _) in commands {
            pipe.add_command(cmd.clone());
        }
        let mut replies = match con.req_packed_commands(&pipe, 0, commands.len()).await {
            Ok(replies) if replies.len() == commands.len() => replies,
            Ok(other) => {
                let e = (
                    redis::ErrorKind::Parse,
                    "a batch's replies do not match its commands",
                    format!("{} replies to {} commands", other.len(), commands.len()),
                )
                    .into();
                return failed(&e);
            }
            Err(e) => return failed(&e),
        };
        let missing: Vec<usize> = (0..commands.len())
            .filter(|&i| scripts::is_noscript(&replies[i]))
            .collect();
        let resent = if missing.is_empty() {
            Ok(Vec::new())
        } else {
            // The server lost its scripts (a restart, `SCRIPT FLUSH`): load them, and send again
            // only what did not run.
            let mut again = redis::pipe();
            for &i in &missing {
                again.add_command(commands[i].0.clone());
            }
            match scripts::load_all(&mut con).await {
                Ok(()) => con.req_packed_commands(&again, 0, missing.len()).await,
                Err(e) => Err(e),
            }
        };
        let mut out: Vec<Reply> = replies.drain(..).map(Value::extract_error).collect();
        for (n, &i) in missing.iter().enumerate() {
            out[i] = match &resent {
                Ok(values) => values
                    .get(n)
                    .cloned()
                    .map_or(Ok(Value::Nil), Value::extract_error),
                Err(e) => Err(e.clone()),
            };
        }
        out
    }
}
