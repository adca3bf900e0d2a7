//! Group commit: the acquisitions and releases one process sends one server at the same time
//! go out together, in one write.
//!
//! An operation that finds nothing in flight goes out at once, alone, so a single task pays
//! nothing for the batching. Operations that arrive while one is in flight queue up and go out
//! together as one pipeline: at once while fewer than [`DEPTH`] are in flight, else when one
//! returns, and so on while any are queued. Each operation is one command (a plain `SET NX PX`,
//! `DELIFEQ`, a script call), except the releases of bare tokens on a server without `DELIFEQ`:
//! those of a batch go as one call of [`RELEASE_BARE_LUA`](super::scripts::RELEASE_BARE_LUA),
//! whose Lua costs the server once per batch instead of once per release. A caller whose cheap
//! command was refused builds its script only then, and sends it as an operation of its own.
//! Under load the client writes and reads once per round trip, and Redis reads, and answers, a
//! whole batch per system call.
//!
//! A release never overtakes an acquisition of its token that a batch still has on its way: a
//! batch may be sent again (the server lost its scripts) or wait for a new connection, and a
//! release that went out meanwhile beside it (one that lets go of a cancelled acquisition) would
//! find nothing and leave the acquisition's lock behind. Such a release is held back until that
//! batch is answered. An acquisition sent alone needs no such care: it is its caller's own
//! future, so a release that follows its cancelling is written after whatever of it was.

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

/// One operation: a command sent as it is, or the release of a bare token, sent with the
/// batch's others in one call.
pub(crate) enum Op {
    One(Cmd),
    /// Lock key, token.
    Bare {
        key: String,
        token: String,
    },
}

impl Op {
    /// The release of `token` (one that waiters mark) on `key` if its value is the bare token;
    /// 0 when it is not, and the caller sends the release script.
    pub(crate) fn bare_release(key: &str, token: &str) -> Self {
        Self::Bare {
            key: key.to_owned(),
            token: token.to_owned(),
        }
    }
}

/// What the operation's command replied (an error in it included): `Okay` for a plain `SET`
/// that took the lock, nil for one refused.
pub(crate) type Reply = redis::RedisResult<Value>;

/// The group commit of one connection.
pub(crate) struct Coalescer {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Arc<SharedConnection>,
    state: Mutex<State>,
}

/// What an operation does with its token, for the order of a release behind an acquisition.
#[derive(Clone, Copy)]
pub(crate) enum Order<'a> {
    Takes(&'a str),
    Frees(&'a str),
}

struct Queued {
    op: Op,
    reply: oneshot::Sender<Reply>,
    /// An acquisition (else a release) of `token`.
    takes: bool,
    token: String,
}

impl Queued {
    fn frees(&self) -> Option<&str> {
        (!self.takes).then_some(self.token.as_str())
    }

    fn takes(&self) -> Option<&str> {
        self.takes.then_some(self.token.as_str())
    }
}

#[derive(Default)]
struct State {
    /// Operations sent alone, and senders of batches, at work (at most [`DEPTH`]).
    in_flight: usize,
    queued: Vec<Queued>,
    /// The tokens of the acquisitions that batches have on their way.
    taking: Vec<String>,
    /// Releases held back until their token's acquisition is answered, in arrival order.
    held_back: Vec<Queued>,
}

impl State {
    /// The next batch: at most [`MOST`] queued operations whose callers still wait, less the
    /// releases held back behind an acquisition on its way, whose tokens it records.
    fn next_batch(&mut self) -> Vec<Queued> {
        let n = self.queued.len().min(MOST);
        let mut batch = Vec::with_capacity(n);
        for queued in self.queued.drain(..n).collect::<Vec<_>>() {
            // An operation whose caller was cancelled is not sent: nothing of it reached the
            // server, and nobody would read its reply.
            if queued.reply.is_closed() {
                continue;
            }
            if queued
                .frees()
                .is_some_and(|t| self.taking.iter().any(|o| o == t))
            {
                self.held_back.push(queued);
                continue;
            }
            if let Some(token) = queued.takes() {
                self.taking.push(token.to_owned());
            }
            batch.push(queued);
        }
        batch
    }

    /// A batch was answered: its acquisitions are no longer on their way, and the releases
    /// held back behind them go first in the queue.
    fn answered(&mut self, tokens: &[String]) {
        for token in tokens {
            if let Some(i) = self.taking.iter().position(|t| t == token) {
                self.taking.swap_remove(i);
            }
        }
        let taking = &self.taking;
        let (ready, still): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held_back)
            .into_iter()
            .partition(|q| !q.frees().is_some_and(|t| taking.iter().any(|o| o == t)));
        self.held_back = still;
        self.queued.splice(0..0, ready);
    }
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
    pub(crate) fn enter(&self, order: Order<'_>, op: impl FnOnce() -> Op) -> Turn {
        let mut state = self.inner.state();
        if state.in_flight == 0 {
            state.in_flight = 1;
            return Turn::Alone(Alone(self.inner.clone()));
        }
        let (reply, rx) = oneshot::channel();
        let (takes, token) = match order {
            Order::Takes(token) => (true, token.to_owned()),
            Order::Frees(token) => (false, token.to_owned()),
        };
        state.queued.push(Queued {
            op: op(),
            reply,
            takes,
            token,
        });
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

/// A sender of batches at work: it leaves its place in flight when dropped, however it ended,
/// and its batch's acquisitions no longer hold releases back.
struct Busy {
    inner: Option<Arc<Inner>>,
    /// The tokens of the acquisitions in the batch on its way.
    taking: Vec<String>,
}

impl Busy {
    /// Sends what is queued, one batch per round trip, until nothing is.
    async fn flush(mut self) {
        let Some(inner) = self.inner.clone() else {
            return;
        };
        loop {
            let batch = {
                let mut state = inner.state();
                if state.queued.is_empty() {
                    state.in_flight -= 1;
                    self.inner = None;
                    return;
                }
                state.next_batch()
            };
            if batch.is_empty() {
                continue;
            }
            let mut ops = Vec::with_capacity(batch.len());
            let mut answers = Vec::with_capacity(batch.len());
            for queued in batch {
                if let Some(token) = queued.takes() {
                    self.taking.push(token.to_owned());
                }
                ops.push(queued.op);
                answers.push(queued.reply);
            }
            let replies = inner.send(ops).await;
            // Before the replies: a caller that reads its grant and releases at once finds
            // nothing in its way.
            inner.state().answered(&std::mem::take(&mut self.taking));
            for (tx, reply) in answers.into_iter().zip(replies) {
                drop(tx.send(reply));
            }
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            // Only if the flush itself panicked: nothing may stay queued with no sender left.
            let mut state = inner.state();
            state.answered(&self.taking);
            state.in_flight -= 1;
            if state.in_flight == 0 {
                state.queued.clear();
                state.held_back.clear();
                state.taking.clear();
            }
        }
    }
}

impl Inner {
    /// Spawns a sender of what is queued, in the place in flight the caller took for it.
    fn start_sender(self: Arc<Self>) {
        let busy = Busy {
            inner: Some(self),
            taking: Vec::new(),
        };
        drop(io::spawn(busy.flush()));
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state whole: a panic elsewhere leaves nothing half-written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One pipeline of the batch's commands: one reply per operation.
    async fn send(&self, ops: Vec<Op>) -> Vec<Reply> {
        // The bare releases (operation, lock key, token), which go as one call where the first
        // of them was.
        let bare: Vec<(usize, &str, &str)> = ops
            .iter()
            .enumerate()
            .filter_map(|(i, op)| match op {
                Op::Bare { key, token } => Some((i, key.as_str(), token.as_str())),
                Op::One(_) => None,
            })
            .collect();
        let mut bare_call = (!bare.is_empty())
            .then(|| scripts::release::bare(bare.iter().map(|&(_, key, token)| (key, token))));
        let bare: Vec<usize> = bare.into_iter().map(|(i, ..)| i).collect();
        let count = ops.len();
        // What goes on the wire, in the order the operations arrived; each command's operation
        // (`None`: the bare releases' call).
        let mut pipe = redis::pipe();
        let mut answers = Vec::with_capacity(ops.len());
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::One(cmd) => {
                    pipe.add_command(cmd);
                    answers.push(Some(i));
                }
                Op::Bare { .. } => {
                    if let Some(call) = bare_call.take() {
                        pipe.add_command(call);
                        answers.push(None);
                    }
                }
            }
        }
        let replies = self.pipeline(&pipe, answers.len()).await;
        let mut out: Vec<Reply> = (0..count).map(|_| Ok(Value::Nil)).collect();
        for (op, reply) in answers.into_iter().zip(replies) {
            if let Some(i) = op {
                out[i] = reply;
                continue;
            }
            match reply.and_then(|v| scripts::release::bare_replies(v, bare.len())) {
                Ok(released) => {
                    for (&i, released) in bare.iter().zip(released) {
                        out[i] = Ok(Value::Int(released));
                    }
                }
                Err(e) => {
                    for &i in &bare {
                        out[i] = Err(e.clone());
                    }
                }
            }
        }
        out
    }

    /// `pipe`'s `count` commands: one reply each.
    async fn pipeline(&self, pipe: &redis::Pipeline, count: usize) -> Vec<Reply> {
        let failed = |e: &redis::RedisError| (0..count).map(|_| Err(e.clone())).collect();
        let mut con = match self.connection.get("batch", None).await {
            Ok(con) => con,
            Err(e) => return failed(&super::errors::redis_error(&e)),
        };
        let mut replies = match con.req_packed_commands(pipe, 0, count).await {
            Ok(replies) if replies.len() == count => replies,
            Ok(other) => {
                let e = (
                    redis::ErrorKind::Parse,
                    "a batch's replies do not match its commands",
                    format!("{} replies to {count} commands", other.len()),
                )
                    .into();
                return failed(&e);
            }
            Err(e) => return failed(&e),
        };
        let missing: Vec<usize> = (0..count)
            .filter(|&i| scripts::is_noscript(&replies[i]))
            .collect();
        let resent = if missing.is_empty() {
            Ok(Vec::new())
        } else {
            // The server lost its scripts (a restart, `SCRIPT FLUSH`): load them, and send again
            // only what did not run.
            let mut again = redis::pipe();
            for (i, cmd) in pipe.cmd_iter().enumerate() {
                if missing.contains(&i) {
                    again.add_command(cmd.clone());
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(takes: bool, token: &str) -> (Queued, oneshot::Receiver<Reply>) {
        let (reply, rx) = oneshot::channel();
        let op = Op::One(Cmd::new());
        let token = token.to_owned();
        (
            Queued {
                op,
                reply,
                takes,
                token,
            },
            rx,
        )
    }

    fn tokens(batch: &[Queued]) -> Vec<(bool, &str)> {
        batch.iter().map(|q| (q.takes, q.token.as_str())).collect()
    }

    #[test]
    fn a_release_waits_for_the_batch_that_takes_its_token() {
        let mut state = State::default();
        let (take_a, _a) = queued(true, "a");
        let (take_b, _b) = queued(true, "b");
        state.queued.extend([take_a, take_b]);
        let first = state.next_batch();
        assert_eq!(tokens(&first), [(true, "a"), (true, "b")]);
        let (free_a, _fa) = queued(false, "a");
        let (free_c, _fc) = queued(false, "c");
        state.queued.extend([free_a, free_c]);
        // "a" is on its way: its release waits; "c"'s goes.
        assert_eq!(tokens(&state.next_batch()), [(false, "c")]);
        let (free_d, _fd) = queued(false, "d");
        state.queued.push(free_d);
        state.answered(&["a".to_owned(), "b".to_owned()]);
        assert!(state.taking.is_empty() && state.held_back.is_empty());
        // The held-back release goes first, ahead of what queued after it.
        assert_eq!(tokens(&state.next_batch()), [(false, "a"), (false, "d")]);
    }

    #[test]
    fn a_release_in_the_same_batch_as_its_acquisition_waits_for_its_answer() {
        let mut state = State::default();
        let (take, _t) = queued(true, "a");
        let (free, _f) = queued(false, "a");
        state.queued.extend([take, free]);
        assert_eq!(tokens(&state.next_batch()), [(true, "a")]);
        state.answered(&["a".to_owned()]);
        assert_eq!(tokens(&state.next_batch()), [(false, "a")]);
    }

    #[test]
    fn an_operation_whose_caller_left_is_not_sent() {
        let mut state = State::default();
        let (gone, rx) = queued(true, "a");
        drop(rx);
        let (kept, _k) = queued(false, "b");
        state.queued.extend([gone, kept]);
        assert_eq!(tokens(&state.next_batch()), [(false, "b")]);
        assert!(state.taking.is_empty());
    }
}
