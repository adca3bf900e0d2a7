//! The library's own I/O runtime: one thread that runs every Redis connection's driver, the
//! subscribers and the Redis lease keepers, whichever runtime the callers use; and where each
//! registry's background work runs.
//!
//! redis-rs spawns each connection's driver (and each reconnection) with `tokio::spawn` on the
//! runtime that happens to be current. A registry is process-wide while runtimes come and go
//! (one per `#[tokio::test]`; a current-thread runtime runs its tasks only inside `block_on`),
//! so a connection made from one runtime would die with it, or stall while it idles. Here every
//! connection is made, and made again, by a task on this runtime. Callers send on those
//! connections from their own tasks (a channel into the driver, and the reply back), so a
//! command costs the caller no hop to this thread beyond the driver's own wake-up.

use std::cell::Cell;
use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tracing::instrument::WithSubscriber;

/// The runtime's handle; the thread is started on first use and lives as long as the process.
fn handle() -> &'static Handle {
    static HANDLE: OnceLock<Handle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("lock-runtime: could not build its I/O runtime");
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("lock-runtime-io".into())
            .spawn(move || {
                ON_IO_THREAD.set(true);
                runtime.block_on(std::future::pending::<()>());
            })
            .expect("lock-runtime: could not start its I/O thread");
        handle
    })
}

thread_local! {
    static ON_IO_THREAD: Cell<bool> = const { Cell::new(false) };
}

tokio::task_local! {
    /// Set in the background work a registry runs on its callers' runtime ([`Home::Caller`]).
    static BACKGROUND: ();
}

/// Whether the caller already runs on the I/O runtime (which has a single thread).
pub(crate) fn on_io_thread() -> bool {
    ON_IO_THREAD.get()
}

/// Whether the caller is the library's own background work (on the I/O thread, or a
/// registry's work on its callers' runtime), rather than a caller's task.
pub(crate) fn in_background() -> bool {
    on_io_thread() || BACKGROUND.try_with(|()| ()).is_ok()
}

/// Spawns `task` on the I/O runtime.
pub(crate) fn spawn<F>(task: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    // Its events go to the subscriber of the code that started it, as they would on the
    // caller's own runtime (a test's `set_default` subscriber included).
    handle().spawn(task.with_current_subscriber())
}

/// Runs `task` on the I/O runtime and awaits its output from the calling runtime. Dropping the
/// returned future does not cancel `task`: a command once started is sent and its reply read.
/// Already on the I/O runtime, `task` simply runs in place (no hop, and no thread to wake).
pub(crate) async fn run<F>(task: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    if on_io_thread() {
        return task.await;
    }
    match spawn(task).await {
        Ok(output) => output,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        // The runtime is never shut down and its tasks are never aborted.
        Err(error) => unreachable!("lock-runtime I/O task cancelled: {error}"),
    }
}

/// Where a registry's background work (its keeper, renewal batches, a dropped guard's release)
/// runs, so that it cannot die with a caller's runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Home {
    /// The I/O runtime: everything that talks to Redis.
    Io,
    /// The calling runtime: the in-memory store, whose leases follow that runtime's clock
    /// (which a test may pause). Its keeper restarts on the next runtime if that one is gone.
    Caller,
}

impl Home {
    pub(crate) fn spawn<F>(self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match self {
            Self::Io => drop(spawn(task)),
            Self::Caller => {
                let task = BACKGROUND.scope((), task);
                match Handle::try_current() {
                    Ok(runtime) => drop(runtime.spawn(task.with_current_subscriber())),
                    // Dropped outside every runtime (a request or guard that outlived the
                    // runtime it ran on): the in-memory store's work finishes without waiting,
                    // so it runs here, once; anything that would have to wait is dropped.
                    Err(_) => drop(futures_util::FutureExt::now_or_never(task)),
                }
            }
        }
    }

    /// Spawns a release of a lock nobody holds any more. On the caller's runtime it first runs
    /// here, as far as it goes without waiting (the in-memory store's release never has to):
    /// that runtime may be ending (a test's), and a task spawned on it now would never run,
    /// leaving the lock taken until its ttl.
    pub(crate) fn spawn_release<F>(self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match self {
            Self::Io => drop(spawn(task)),
            Self::Caller => {
                let mut task = Box::pin(task);
                if futures_util::FutureExt::now_or_never(task.as_mut()).is_none() {
                    self.spawn(task);
                }
            }
        }
    }
}
