//! Noticing a client that has stopped answering altogether, so it can be replaced.
//!
//! redis-rs 1.8's cluster client can hang for good in its own recovery after a node dies: its
//! slot refresh waits for a lock that a node-repair task holds but is never polled while the
//! refresh runs (seen here in about one run in four of the killed-master test under load: after
//! "beginning slot refresh", no request to any node, live masters included, was answered
//! again, and every lease of the process expired). A `Stall` watches the requests on such a
//! connection: once the oldest request still waiting is older than the limit and nothing has
//! been answered since it was sent, the client is stuck rather than one node slow, and the
//! backend replaces it with a fresh one.
//!
//! A single slow or paused node does not trip it while any other node answers; with one
//! paused node and no other traffic it trips once per limit, and the replacement costs one
//! reconnection.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::errors::unanswered;

#[derive(Debug)]
pub(crate) struct Stall {
    limit: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    in_flight: usize,
    /// When the oldest request that has seen no answer since was sent.
    waiting_since: Option<Instant>,
}

/// One request on the watched connection; dropping it unanswered (cancelled) forgets it.
pub(crate) struct Request<'a> {
    stall: &'a Stall,
    done: bool,
}

impl Stall {
    pub(crate) fn new(limit: Duration) -> Self {
        Self {
            limit,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn start(&self) -> Request<'_> {
        let mut state = self.state();
        state.in_flight += 1;
        state.waiting_since.get_or_insert_with(Instant::now);
        Request {
            stall: self,
            done: false,
        }
    }

    /// `reply`, watched from now until it ends.
    pub(crate) fn watch<'a, T: Send + 'a>(
        &'a self,
        reply: redis::RedisFuture<'a, T>,
    ) -> redis::RedisFuture<'a, T> {
        let request = self.start();
        Box::pin(async move {
            let result = reply.await;
            request.finish(&result);
            result
        })
    }

    /// Whether the client has answered nothing for longer than the limit while asked.
    pub(crate) fn is_stuck(&self) -> bool {
        self.state()
            .waiting_since
            .is_some_and(|since| since.elapsed() > self.limit)
    }
}

impl Request<'_> {
    /// The request ended: any reply from a server (an error reply too) proves the client
    /// works; a timeout or a broken connection does not.
    fn finish<T>(mut self, result: &redis::RedisResult<T>) {
        self.done = true;
        let answered = result.as_ref().err().is_none_or(|e| !unanswered(e));
        let mut state = self.stall.state();
        state.in_flight -= 1;
        if answered {
            // Requests still in flight were sent before this answer: start their clock anew.
            state.waiting_since = (state.in_flight > 0).then(Instant::now);
        }
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut state = self.stall.state();
            state.in_flight -= 1;
            if state.in_flight == 0 {
                // Cancelled by its caller: no evidence either way.
                state.waiting_since = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout() -> redis::RedisResult<()> {
        Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer").into())
    }

    #[test]
    fn only_a_client_that_answers_nothing_for_the_whole_limit_is_stuck() {
        let stall = Stall::new(Duration::from_millis(20));
        // Timeouts alone, across several requests, add up.
        stall.start().finish(&timeout());
        assert!(!stall.is_stuck());
        std::thread::sleep(Duration::from_millis(25));
        stall.start().finish(&timeout());
        assert!(stall.is_stuck());
        // Any answer, an error reply too, clears it.
        let refused: redis::RedisResult<()> =
            Err((redis::ErrorKind::Client, "WRONGTYPE stand-in").into());
        stall.start().finish(&refused);
        assert!(!stall.is_stuck());
    }

    #[test]
    fn a_cancelled_request_leaves_no_evidence_and_a_slow_one_is_timed_from_the_last_answer() {
        let stall = Stall::new(Duration::from_millis(20));
        drop(stall.start());
        std::thread::sleep(Duration::from_millis(25));
        assert!(!stall.is_stuck());
        let slow = stall.start();
        std::thread::sleep(Duration::from_millis(25));
        stall.start().finish(&Ok(()));
        assert!(!stall.is_stuck(), "another request was answered meanwhile");
        std::thread::sleep(Duration::from_millis(25));
        assert!(
            stall.is_stuck(),
            "the slow one has waited a whole limit since"
        );
        slow.finish(&timeout());
    }
}
