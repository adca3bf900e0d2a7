//! What the library's background work (the I/O thread; a registry's keeper, wherever it runs)
//! has to tell the application (its `tracing` events and `metrics`) is told from a thread of its
//! own. The application's subscriber and recorder are its own code: a slow layer or exporter
//! there then slows this reporting thread, never the I/O thread whose connections every lock of
//! the process shares, nor a keeper's renewals. Elsewhere (a caller's task) it is told at once,
//! as any library does, and never while the library holds a lock of its own.
//!
//! The queue is bounded: when the subscriber or recorder falls that far behind (or blocks),
//! what the I/O thread has to tell is dropped and counted, never waited for, and the count is
//! told once the queue has room again. What a dropped report held that must not end on the I/O
//! thread (a span, whose closing calls the subscriber) is a [`Parting`]: it is handed to the
//! reporting thread to end there instead.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::io;

type Job = Box<dyn FnOnce() + Send>;

/// Reports the queue holds at most: far more than a healthy subscriber ever lets pile up.
const QUEUED: usize = 4096;

/// Reports dropped since the last one that went through.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// What background work let go of and the reporting thread drops (see [`Parting`]).
static PARTED: Mutex<Vec<Box<dyn Send>>> = Mutex::new(Vec::new());

/// A value whose drop calls the application's code (a span: its last handle closes it), held by
/// a report: dropped where it is let go of, unless that is the library's background work, which
/// hands it to the reporting thread instead (a report dropped on a full queue included).
pub(crate) struct Parting<T: Send + 'static>(Option<T>);

impl<T: Send + 'static> Parting<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(Some(value))
    }
}

impl<T: Send + 'static> std::ops::Deref for Parting<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.0.as_ref().expect("only taken by drop")
    }
}

impl<T: Send + 'static> Drop for Parting<T> {
    fn drop(&mut self) {
        let Some(value) = self.0.take() else { return };
        if io::in_background() {
            PARTED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Box::new(value));
        }
    }
}

/// Drops what background work let go of (see [`Parting`]), on the reporting thread.
fn drop_parted() {
    let parted = std::mem::take(&mut *PARTED.lock().unwrap_or_else(PoisonError::into_inner));
    drop(parted);
}

/// Runs `tell` (which records a metric, or emits an event) now, or on the reporting thread if
/// the caller is the library's background work (see [`io::in_background`]), under the
/// `tracing` subscriber the caller has now.
pub(crate) fn tell(tell: impl FnOnce() + Send + 'static) {
    if !io::in_background() {
        return tell();
    }
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    let job: Job = Box::new(move || tracing::dispatcher::with_default(&dispatch, tell));
    match sender().try_send(job) {
        Ok(()) => {
            let dropped = DROPPED.swap(0, Ordering::Relaxed);
            if dropped > 0 {
                let job: Job = Box::new(move || {
                    tracing::warn!(
                        dropped,
                        "lock-runtime dropped reports (events, metrics) that its I/O thread had \
                         to tell: the tracing subscriber or metrics recorder fell behind or blocked"
                    );
                });
                if sender().try_send(job).is_err() {
                    DROPPED.fetch_add(dropped, Ordering::Relaxed);
                }
            }
        }
        // Full: the subscriber or recorder is stuck or slow; the I/O thread does not wait for
        // it. Disconnected: starting the thread failed. Either way the report is lost, never
        // the lock.
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The reporting thread's queue; the thread starts on first use and lives as long as the
/// process.
fn sender() -> &'static SyncSender<Job> {
    static SENDER: OnceLock<SyncSender<Job>> = OnceLock::new();
    SENDER.get_or_init(|| {
        let (sender, jobs) = mpsc::sync_channel::<Job>(QUEUED);
        let started = std::thread::Builder::new()
            .name("lock-runtime-report".into())
            .spawn(move || {
                for job in jobs {
                    // A panicking layer or recorder loses its own report, not the thread.
                    drop(std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)));
                    drop(std::panic::catch_unwind(drop_parted));
                }
            });
        if let Err(error) = started {
            tracing::error!(%error, "lock-runtime could not start its reporting thread");
        }
        sender
    })
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// A subscriber or recorder that blocks the reporting thread never blocks the I/O thread:
    /// once the queue is full, reports are dropped and counted, and the count is told when
    /// the queue has room again.
    #[test]
    fn a_blocked_reporter_never_blocks_the_io_thread() {
        let (unblock, blocked) = mpsc::channel::<()>();
        let (told_tx, told) = mpsc::channel::<usize>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dropped = runtime.block_on(io::spawn(async move {
            let started = told_tx.clone();
            tell(move || {
                started.send(usize::MAX).unwrap();
                blocked.recv().unwrap();
            });
            // The reporting thread has taken the blocking report: the queue is empty.
            assert_eq!(told.recv().unwrap(), usize::MAX);
            for i in 0..QUEUED * 2 {
                let told = told_tx.clone();
                tell(move || told.send(i).unwrap_or_default());
            }
            (DROPPED.load(Ordering::Relaxed), told)
        }));
        let (dropped, told) = dropped.expect("the I/O thread went through without waiting");
        assert!(
            dropped >= QUEUED as u64,
            "{dropped} dropped of {} sent to a full queue",
            QUEUED * 2
        );
        unblock.send(()).unwrap();
        let ran: Vec<usize> = told.iter().collect();
        assert!(
            ran.len() <= QUEUED && ran.windows(2).all(|w| w[0] < w[1]),
            "the queued reports ran in order, at most a queue's worth: {}",
            ran.len()
        );
        // A report sent once there is room again carries the count; the count restarts.
        runtime.block_on(io::spawn(async { tell(|| {}) })).unwrap();
        assert_eq!(DROPPED.load(Ordering::Relaxed), 0);
    }
}
