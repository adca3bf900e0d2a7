//! What the I/O thread has to tell the application (its `tracing` events and `metrics`) is
//! told from a thread of its own. The application's subscriber and recorder are its own code: a
//! slow layer or exporter there then slows this reporting thread, never the I/O thread whose
//! connections every lock of the process shares. Elsewhere (a caller's task) it is told at once,
//! as any library does.

use std::sync::mpsc::{self, Sender};
use std::sync::OnceLock;

use crate::io;

type Job = Box<dyn FnOnce() + Send>;

/// Runs `tell` (which records a metric, or emits an event) now, or on the reporting thread if
/// the caller is the I/O thread, under the `tracing` subscriber the caller has now.
pub(crate) fn tell(tell: impl FnOnce() + Send + 'static) {
    if !io::on_io_thread() {
        return tell();
    }
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    let job: Job = Box::new(move || tracing::dispatcher::with_default(&dispatch, tell));
    // The thread never ends on its own, so a send fails only if starting it failed: what is
    // told is then lost, never the lock.
    drop(sender().send(job));
}

/// The reporting thread's queue; the thread starts on first use and lives as long as the
/// process.
fn sender() -> &'static Sender<Job> {
    static SENDER: OnceLock<Sender<Job>> = OnceLock::new();
    SENDER.get_or_init(|| {
        let (sender, jobs) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name("lock-runtime-report".into())
            .spawn(move || {
                for job in jobs {
                    // A panicking layer or recorder loses its own report, not the thread.
                    drop(std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)));
                }
            });
        if let Err(error) = started {
            tracing::error!(%error, "lock-runtime could not start its reporting thread");
        }
        sender
    })
}
