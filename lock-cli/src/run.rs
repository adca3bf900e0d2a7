//! `lockctl run KEY -- CMD`: a command run under a lock, as `etcdctl lock` and `consul lock`
//! do; the cron entry on every machine that must run once.
//!
//! CMD runs in a process group of its own, so that a loss stops the whole job (a shell and its
//! children), and each signal sent to `lockctl` reaches it once, by `lockctl` passing it on.

use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use lock_runtime::{LockError, LockGuard, Registry};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::{LockMode, RunArgs};

/// The exit statuses `lockctl run` gives of itself; otherwise it exits with CMD's status (128 +
/// the signal's number when a signal ended CMD, as shells do).
pub mod status {
    /// A bad option: the library refused the key or the options (as clap's usage errors).
    pub const USAGE: u8 = 2;
    /// Redis could not be reached, or refused a command: CMD did not run (sysexits'
    /// `EX_UNAVAILABLE`).
    pub const UNAVAILABLE: u8 = 69;
    /// The lock was held by another holder until `--wait` ran out: CMD did not run (sysexits'
    /// `EX_TEMPFAIL`, "try again later": what a cron job on another machine sees).
    pub const BUSY: u8 = 75;
    /// The lease was lost while CMD ran: CMD was sent SIGTERM, then SIGKILL after `--grace`
    /// (or it had ended, but only after the loss).
    pub const LOST: u8 = 79;
    /// CMD exists but could not be run (as shells say it).
    pub const CANNOT_EXECUTE: u8 = 126;
    /// CMD was not found (as shells say it).
    pub const NOT_FOUND: u8 = 127;
}

/// The environment CMD finds: the lock's key, as named on the command line.
pub const KEY_VAR: &str = "LOCK_KEY";
/// The environment CMD finds with `--fencing`: the lock's fencing token, for the store CMD
/// writes to to refuse a stale holder.
pub const FENCE_VAR: &str = "LOCK_FENCE";

/// The signals passed on to CMD: the ones that ask a process to stop, or that operators send
/// to jobs.
const PASSED_ON: [(SignalKind, Signal); 6] = [
    (SignalKind::terminate(), Signal::SIGTERM),
    (SignalKind::interrupt(), Signal::SIGINT),
    (SignalKind::hangup(), Signal::SIGHUP),
    (SignalKind::quit(), Signal::SIGQUIT),
    (SignalKind::user_defined1(), Signal::SIGUSR1),
    (SignalKind::user_defined2(), Signal::SIGUSR2),
];

/// Takes the lock, runs CMD under it and releases it; the status to exit with.
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
    // Listening before CMD starts: a signal that comes at once is passed on, not lost.
    let mut signals = Vec::with_capacity(PASSED_ON.len());
    for (kind, sig) in PASSED_ON {
        match signal(kind) {
            Ok(stream) => signals.push((stream, sig)),
            Err(e) => {
                eprintln!(
                    "lockctl: cannot listen for {}: {e}; the command did not run",
                    sig.as_str()
                );
                let _ = guard.release_now().await;
                return ExitCode::FAILURE;
            }
        }
    }
    let mut child = match spawn(&job, &guard) {
        Ok(child) => child,
        Err((status, message)) => {
            eprintln!("lockctl: {message}; {redis_key} released");
            let _ = guard.release_now().await;
            return ExitCode::from(status);
        }
    };
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
        .expect("a child just spawned has a pid");
    let ended = tokio::select! {
        status = child.wait() => Ok(status),
        lost = guard.lost() => Err(lost),
        () = pass_on(&mut signals, group) => unreachable!("passing signals on never ends"),
    };
    match ended {
        Ok(status) => finish(guard, &redis_key, status).await,
        Err(lost) => {
            eprintln!(
                "lockctl: {lost}; sending SIGTERM to the command (SIGKILL in {})",
                crate::render::duration(job.grace)
            );
            stop(&mut child, group, job.grace, &mut signals).await;
            ExitCode::from(status::LOST)
        }
    }
}

/// CMD, in a process group of its own, with the key (and the fencing token) in its
/// environment, and without lockctl's credentials unless asked. An error is the status to
/// exit with and what to say.
fn spawn(job: &RunArgs, guard: &LockGuard) -> Result<Child, (u8, String)> {
    let (program, args) = job.command.split_first().expect("clap requires a command");
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env(KEY_VAR, &job.key)
        .env_remove(FENCE_VAR)
        .stdin(Stdio::inherit())
        .process_group(0);
    if let Some(fence) = guard.fence() {
        command.env(FENCE_VAR, fence.to_string());
    }
    if !job.pass_credentials {
        for var in crate::target::credential_vars(|name| std::env::var(name).ok()) {
            command.env_remove(var);
        }
    }
    command.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => (status::NOT_FOUND, format!("{program}: not found")),
        _ => (status::CANNOT_EXECUTE, format!("cannot run {program}: {e}")),
    })
}

/// Sends each signal `lockctl` receives on to CMD's process group.
async fn pass_on(signals: &mut [(tokio::signal::unix::Signal, Signal)], group: Pid) {
    loop {
        let received = futures_util::future::select_all(
            signals
                .iter_mut()
                .map(|(stream, sig)| Box::pin(async move { stream.recv().await.map(|_| *sig) })),
        )
        .await
        .0;
        if let Some(sig) = received {
            // The group may be gone already (CMD exited): nothing to pass on then.
            let _ = killpg(group, sig);
        }
    }
}

/// After a loss: SIGTERM to CMD's group, SIGKILL after `grace` if CMD is still running. Signals
/// sent to `lockctl` meanwhile still reach CMD.
async fn stop(
    child: &mut Child,
    group: Pid,
    grace: Duration,
    signals: &mut [(tokio::signal::unix::Signal, Signal)],
) {
    let _ = killpg(group, Signal::SIGTERM);
    let waited = tokio::select! {
        status = tokio::time::timeout(grace, child.wait()) => status.is_ok(),
        () = pass_on(signals, group) => unreachable!("passing signals on never ends"),
    };
    if !waited {
        eprintln!("lockctl: the command outlived its grace period; sending SIGKILL");
        let _ = killpg(group, Signal::SIGKILL);
        let _ = child.wait().await;
    }
}

/// CMD ended while the lock held: released (kept until `--min-hold` if CMD succeeded), and
/// CMD's status is ours.
async fn finish(
    guard: LockGuard,
    redis_key: &str,
    status: std::io::Result<ExitStatus>,
) -> ExitCode {
    let status = match status {
        Ok(status) => status,
        Err(e) => {
            eprintln!("lockctl: lost track of the command: {e}");
            let _ = guard.release_now().await;
            return ExitCode::FAILURE;
        }
    };
    // A command that ended once its lease was over (lockctl stalled, or the loss not yet seen)
    // may have overlapped the next holder: a loss, as a guarded body's would be.
    if let Some(reason) = guard.lost_reason() {
        eprintln!(
            "lockctl: the command ended ({status}), but the lock {redis_key} was lost before it \
             did ({reason}): its work may have overlapped the next holder's"
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
        eprintln!("lockctl: the command ended but releasing {redis_key} failed: {e}");
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
    eprintln!("lockctl: {e}; the command did not run");
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
