//! `lockctl run KEY -- CMD`: a command run under a lock, as `etcdctl lock` and `consul lock`
//! do; the cron entry on every machine that must run once.
//!
//! The job is CMD and every process it starts (see [`crate::job`]): the lock is held until the
//! last of them has ended, and a loss stops them all. CMD runs in a process group of its own,
//! and each signal sent to `lockctl` reaches that group once, by `lockctl` passing it on.

use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use lock_runtime::{LockError, LockGuard, Registry};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::cli::{LockMode, RunArgs};
use crate::job::{self, Event};
use crate::status;

/// The environment CMD finds: the lock's key, as named on the command line.
pub const KEY_VAR: &str = "LOCK_KEY";
/// The environment CMD finds with `--fencing`: the lock's fencing token, for the store CMD
/// writes to to refuse a stale holder.
pub const FENCE_VAR: &str = "LOCK_FENCE";

/// What `lockctl` does with a signal it receives while the job runs.
#[derive(Debug, Clone, Copy)]
enum Received {
    /// Passed on to CMD's process group: the signals that ask a process to stop, or that
    /// operators send to jobs.
    PassOn(Signal),
    /// Refused, with a word on stderr: Ctrl-Z would stop lockctl's renewals while the job
    /// runs on past its lease.
    Refuse(Signal),
}

const HANDLED: [(SignalKind, Received); 7] = [
    (SignalKind::terminate(), Received::PassOn(Signal::SIGTERM)),
    (SignalKind::interrupt(), Received::PassOn(Signal::SIGINT)),
    (SignalKind::hangup(), Received::PassOn(Signal::SIGHUP)),
    (SignalKind::quit(), Received::PassOn(Signal::SIGQUIT)),
    (
        SignalKind::user_defined1(),
        Received::PassOn(Signal::SIGUSR1),
    ),
    (
        SignalKind::user_defined2(),
        Received::PassOn(Signal::SIGUSR2),
    ),
    (
        SignalKind::from_raw(Signal::SIGTSTP as i32),
        Received::Refuse(Signal::SIGTSTP),
    ),
];

type Signals = Vec<(tokio::signal::unix::Signal, Received)>;

/// How long the job's processes have after each round of SIGKILL before the next round (for
/// those forked meanwhile).
const KILL_ROUND: Duration = Duration::from_millis(100);

/// How the supervision of a job came to an end.
enum Outcome {
    /// Every process of the job ended; CMD's own status.
    Ended(std::io::Result<ExitStatus>),
    /// The lease was lost while the job ran.
    Lost(LockError),
    /// A process of the job stopped on SIGTTIN or SIGTTOU: it used the terminal.
    Terminal(Pid, Signal),
}

/// Takes the lock, runs CMD under it and releases it once CMD and every process it started
/// have ended; the status to exit with.
pub async fn run(registry: &Registry, job: RunArgs) -> ExitCode {
    let redis_key = registry.redis_key(&job.key);
    let mut request = registry
        .lock(job.key.clone())
        .wait(job.wait)
        .fencing(job.fencing);
    if let Some(ttl) = job.ttl {
        request = request.ttl(ttl);
    }
    if let Some(min_hold) = job.min_hold {
        request = request.min_hold(min_hold);
    }
    if let Some(permits) = job.permits {
        request = request.permits(permits);
    }
    if job.mode == LockMode::Read {
        request = request.mode(lock_runtime::Mode::Read);
    }
    let guard = match request.acquire().await {
        Ok(guard) => guard,
        Err(e) => return not_run(&e),
    };
    if let Err(e) = job::become_subreaper() {
        say!(
            "lockctl: cannot become the subreaper of the command's processes: {e}; the command \
             did not run"
        );
        let _ = guard.release_now().await;
        return ExitCode::FAILURE;
    }
    // Listening before CMD starts: a signal that comes at once is passed on, not lost.
    let mut signals = Vec::with_capacity(HANDLED.len());
    for (kind, action) in HANDLED {
        match signal(kind) {
            Ok(stream) => signals.push((stream, action)),
            Err(e) => {
                say!("lockctl: cannot listen for signals: {e}; the command did not run");
                let _ = guard.release_now().await;
                return ExitCode::FAILURE;
            }
        }
    }
    let child = match spawn(&job, &guard) {
        Ok(child) => child,
        Err(message) => {
            say!("lockctl: {message}; {redis_key} released");
            let _ = guard.release_now().await;
            return ExitCode::from(status::CANNOT_EXECUTE);
        }
    };
    // CMD's process group is its own pid (`process_group(0)`).
    let group = Pid::from_raw(i32::try_from(child.id()).expect("a pid fits in an i32"));
    let mut events = job::watch(child);
    let outcome = supervise(&guard, &redis_key, &mut events, &mut signals, group).await;
    match outcome {
        Outcome::Ended(status) => finish(guard, &redis_key, status).await,
        Outcome::Lost(lost) => {
            say!(
                "lockctl: {lost}; sending SIGTERM to every process of the job (SIGKILL in {})",
                crate::render::duration(job.grace)
            );
            stop(&mut events, group, job.grace, &mut signals).await;
            ExitCode::from(status::LOST)
        }
        Outcome::Terminal(pid, sig) => {
            let (cannot, instead) = if sig == Signal::SIGTTIN {
                (
                    "read from the terminal",
                    "redirect its input (`< /dev/null`, or a file)",
                )
            } else {
                (
                    "change the terminal's settings, nor write to it under `stty tostop`",
                    "redirect its output, and leave the terminal's settings alone",
                )
            };
            say!(
                "lockctl: the job's process {pid} stopped on {}: a command under `lockctl run` \
                 runs outside the terminal's foreground and cannot {cannot}; {instead}. Ending \
                 the job (SIGTERM, SIGKILL in {}) and releasing {redis_key}",
                sig.as_str(),
                crate::render::duration(job.grace)
            );
            stop(&mut events, group, job.grace, &mut signals).await;
            let _ = guard.release_now().await;
            ExitCode::from(status::TERMINAL)
        }
    }
}

/// CMD through `lockctl exec-job`, in a process group of its own, with the key (and the
/// fencing token) in its environment, and without lockctl's credentials unless asked. An error
/// is what to say.
fn spawn(job: &RunArgs, guard: &LockGuard) -> Result<std::process::Child, String> {
    let mut command = job::command(&job.command);
    command
        .env(KEY_VAR, &job.key)
        .env_remove(FENCE_VAR)
        .stdin(Stdio::inherit());
    if let Some(fence) = guard.fence() {
        command.env(FENCE_VAR, fence.to_string());
    }
    if !job.pass_credentials {
        for var in crate::target::credential_vars(|name| std::env::var(name).ok()) {
            command.env_remove(var);
        }
    }
    command
        .spawn()
        .map_err(|e| format!("cannot start the command: {e}"))
}

/// Follows the job until every process of it has ended, the lease is lost, or the job stops
/// on the terminal; passing signals on meanwhile.
async fn supervise(
    guard: &LockGuard,
    redis_key: &str,
    events: &mut UnboundedReceiver<Event>,
    signals: &mut Signals,
    group: Pid,
) -> Outcome {
    let relaying = relay(signals, group);
    tokio::pin!(relaying);
    let lost = guard.lost();
    tokio::pin!(lost);
    let mut command = None;
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Some(Event::CommandEnded(status)) => {
                    let left = job::members();
                    if !left.is_empty() {
                        say!(
                            "lockctl: the command ended ({}), but left {} process(es) running \
                             (pid {}): {redis_key} is held until they end",
                            describe(&status),
                            left.len(),
                            job::listed(&left)
                        );
                    }
                    command = Some(status);
                }
                Some(Event::Stopped(pid, sig @ (Signal::SIGTTIN | Signal::SIGTTOU))) => {
                    return Outcome::Terminal(pid, sig);
                }
                // Stopped by SIGSTOP or SIGTSTP: someone paused it on purpose; it still holds.
                Some(Event::Stopped(..)) => {}
                Some(Event::Ended) | None => {
                    return Outcome::Ended(command.unwrap_or_else(|| {
                        Err(std::io::Error::other("the command's end went unreported"))
                    }));
                }
            },
            lost = &mut lost => return Outcome::Lost(lost),
            () = &mut relaying => unreachable!("relaying signals never ends"),
        }
    }
}

fn describe(status: &std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => status.to_string(),
        Err(e) => e.to_string(),
    }
}

/// Passes each signal `lockctl` receives on to CMD's process group, or refuses it.
async fn relay(signals: &mut Signals, group: Pid) {
    loop {
        let received =
            futures_util::future::select_all(signals.iter_mut().map(|(stream, action)| {
                Box::pin(async move { stream.recv().await.map(|_| *action) })
            }))
            .await
            .0;
        match received {
            // The group may be gone already (CMD exited): nothing to pass on then.
            Some(Received::PassOn(sig)) => job::signal_group(group, sig),
            Some(Received::Refuse(sig)) => say!(
                "lockctl: not stopping on {}: the lock is renewed only while lockctl runs, and \
                 the command would run on past its lease; to end the command, send SIGINT \
                 (Ctrl-C) or SIGTERM",
                sig.as_str()
            ),
            None => {}
        }
    }
}

/// SIGTERM to every process of the job, then SIGKILL after `grace` to every one still alive,
/// round after round until none is left. Signals sent to `lockctl` meanwhile still reach CMD's
/// group during the grace period.
async fn stop(
    events: &mut UnboundedReceiver<Event>,
    group: Pid,
    grace: Duration,
    signals: &mut Signals,
) {
    job::signal(group, Signal::SIGTERM);
    // A stopped process acts on SIGTERM only once continued.
    job::signal(group, Signal::SIGCONT);
    let ended = tokio::select! {
        ended = tokio::time::timeout(grace, all_ended(events)) => ended.is_ok(),
        () = relay(signals, group) => unreachable!("relaying signals never ends"),
    };
    if ended {
        return;
    }
    say!("lockctl: the job outlived its grace period; sending SIGKILL to its processes");
    loop {
        job::signal(group, Signal::SIGKILL);
        if tokio::time::timeout(KILL_ROUND, all_ended(events))
            .await
            .is_ok()
        {
            return;
        }
    }
}

/// Until the reaper finds no process of the job left.
async fn all_ended(events: &mut UnboundedReceiver<Event>) {
    while let Some(event) = events.recv().await {
        if matches!(event, Event::Ended) {
            return;
        }
    }
}

/// The job ended while the lock held: released (kept until `--min-hold` if CMD succeeded),
/// and CMD's status is ours.
async fn finish(
    guard: LockGuard,
    redis_key: &str,
    status: std::io::Result<ExitStatus>,
) -> ExitCode {
    let status = match status {
        Ok(status) => status,
        Err(e) => {
            say!("lockctl: lost track of the command: {e}");
            let _ = guard.release_now().await;
            return ExitCode::FAILURE;
        }
    };
    // A command that ended once its lease was over (lockctl stalled, or the loss not yet seen)
    // may have overlapped the next holder: a loss, as a guarded body's would be.
    if let Some(reason) = guard.lost_reason() {
        say!(
            "lockctl: the job ended (the command: {status}), but the lock {redis_key} was lost \
             before it did ({reason}): its work may have overlapped the next holder's"
        );
        return ExitCode::from(status::LOST);
    }
    let released = if status.success() {
        guard.release().await
    } else {
        guard.release_now().await
    };
    if let Err(e) = released {
        // The key expires with its lease in any case.
        say!("lockctl: the command ended but releasing {redis_key} failed: {e}");
    }
    ExitCode::from(exit_code(status))
}

/// CMD's exit code, or 128 + the signal's number when a signal ended it.
fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|sig| 128 + sig))
        .and_then(|code| u8::try_from(code).ok())
        .unwrap_or(1)
}

/// The lock was not taken: why, and the status that says so.
fn not_run(e: &LockError) -> ExitCode {
    let status = match e {
        LockError::Busy { .. } => status::BUSY,
        LockError::Backend { .. } | LockError::NotConfigured { .. } => status::UNAVAILABLE,
        LockError::InvalidKey { .. } | LockError::InvalidOptions { .. } => status::USAGE,
        _ => 1,
    };
    say!("lockctl: {e}; the command did not run");
    ExitCode::from(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    #[test]
    fn a_signal_that_ended_the_command_is_128_plus_its_number() {
        assert_eq!(exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 128 + 15);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 128 + 9);
    }
}
