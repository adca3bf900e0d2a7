//! A connection to one server that tasks of any runtime send on, with the lock scripts loaded.
//!
//! redis-rs's multiplexed connection is a channel into a driver task that owns the socket, so a
//! caller's task can send on it from any runtime, as long as the driver itself lives where no
//! caller's runtime can take it down. Here the driver is made, and made again after the
//! connection broke, by a task on the library's I/O runtime; callers send straight into it,
//! with no hop to another thread on the way. (redis-rs's `ConnectionManager` would reconnect
//! from inside the failed request, on the caller's runtime, leaving the new driver there.)

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, Value};

use super::scripts;
use crate::io;
use crate::timeouts::Timeouts;

/// Connection attempts per reconnection before the callers are told (they retry beyond it).
const TRIES: u32 = 3;

/// A connection to one server, made again on the I/O runtime whenever it broke.
#[derive(Clone)]
pub(crate) struct ServerConnection(Arc<Inner>);

struct Inner {
    client: redis::Client,
    timeouts: Timeouts,
    current: Mutex<Current>,
}

/// The connection in use (with its generation, so that only the failure of the current one
/// replaces it), the attempt to make one, awaited by every caller meanwhile, or neither (before
/// the first attempt): the next caller starts one.
enum Current {
    Ready(MultiplexedConnection, u64),
    Connecting(Attempt, u64),
    None(u64),
}

type Attempt = Shared<BoxFuture<'static, redis::RedisResult<MultiplexedConnection>>>;

/// Connects to `client`'s server, with the lock scripts loaded: from any runtime, the connection
/// is made on the I/O runtime.
pub(crate) async fn manager(
    client: redis::Client,
    timeouts: Timeouts,
) -> redis::RedisResult<ServerConnection> {
    let inner = Arc::new(Inner {
        client,
        timeouts,
        current: Mutex::new(Current::None(0)),
    });
    let con = ServerConnection(inner);
    con.connection().await?;
    Ok(con)
}

/// Starts making the connection of generation `generation` on the I/O runtime; once made, it
/// becomes the current one (unless the whole connection was dropped meanwhile).
fn connect(inner: Weak<Inner>, generation: u64) -> Attempt {
    let task = io::spawn(async move {
        let Some((client, timeouts)) = inner.upgrade().map(|i| (i.client.clone(), i.timeouts))
        else {
            return Err(dropped());
        };
        let mut pause = Duration::from_millis(50);
        let mut made = open(&client, timeouts).await;
        for _ in 1..TRIES {
            if made.is_ok() {
                break;
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
            made = open(&client, timeouts).await;
        }
        if let (Ok(con), Some(inner)) = (&made, inner.upgrade()) {
            let mut current = inner.current();
            if matches!(*current, Current::Connecting(_, g) if g == generation) {
                *current = Current::Ready(con.clone(), generation);
            }
        }
        made
    });
    async move { task.await.unwrap_or_else(|_| Err(dropped())) }
        .boxed()
        .shared()
}

/// One connection with the scripts loaded; runs on the I/O runtime, so its driver lives there.
async fn open(
    client: &redis::Client,
    timeouts: Timeouts,
) -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeouts.connect))
        .set_response_timeout(Some(timeouts.command));
    let mut con = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    // Loaded up front so no first use pays a NOSCRIPT round trip; after a SCRIPT FLUSH (or on a
    // cluster node) the invocation reloads on its own.
    scripts::load_all(&mut con).await?;
    Ok(con)
}

fn dropped() -> redis::RedisError {
    std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        "lock-runtime: the connection was dropped while it was being made",
    )
    .into()
}

impl Inner {
    fn current(&self) -> MutexGuard<'_, Current> {
        // Every update replaces it whole: a panic elsewhere leaves nothing half-written.
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ServerConnection {
    /// The current connection and its generation, waiting for one being made (at most the
    /// connect timeout: the attempt goes on without this caller). A failed attempt is not kept:
    /// the next caller starts another.
    async fn connection(&self) -> redis::RedisResult<(MultiplexedConnection, u64)> {
        let (attempt, generation) = {
            let mut current = self.0.current();
            match &*current {
                Current::Ready(con, generation) => return Ok((con.clone(), *generation)),
                Current::Connecting(attempt, generation)
                    if !matches!(attempt.peek(), Some(Err(_))) =>
                {
                    (attempt.clone(), *generation)
                }
                Current::Connecting(_, generation) | Current::None(generation) => {
                    let generation = generation + 1;
                    (self.start(&mut current, generation), generation)
                }
            }
        };
        let bound = self.0.timeouts.connect;
        match tokio::time::timeout(bound, attempt).await {
            Ok(made) => made.map(|con| (con, generation)),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("could not connect within {bound:?}"),
            )
            .into()),
        }
    }

    /// Starts making connection `generation` and makes it the current attempt.
    fn start(&self, current: &mut Current, generation: u64) -> Attempt {
        let attempt = connect(Arc::downgrade(&self.0), generation);
        *current = Current::Connecting(attempt.clone(), generation);
        attempt
    }

    /// After a request failed: a connection that can no longer be used (dropped, or out of step
    /// with the server) is made again at once, unless a newer one replaced it already.
    fn failed<T>(&self, generation: u64, result: redis::RedisResult<T>) -> redis::RedisResult<T> {
        if let Err(e) = &result {
            if e.is_unrecoverable_error() {
                let mut current = self.0.current();
                if matches!(*current, Current::Ready(_, g) if g == generation) {
                    // Kept as the current attempt; its task runs on the I/O runtime.
                    drop(self.start(&mut current, generation + 1));
                }
            }
        }
        result
    }
}

impl ConnectionLike for ServerConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (mut con, generation) = self.connection().await?;
            let result = con.req_packed_command(cmd).await;
            self.failed(generation, result)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (mut con, generation) = self.connection().await?;
            let result = con.req_packed_commands(pipeline, offset, count).await;
            self.failed(generation, result)
        })
    }

    fn get_db(&self) -> i64 {
        self.0.client.get_connection_info().redis_settings().db()
    }
}
