//! The job of `lockctl run`: CMD and every process it starts, in its process group or out of
//! it (`setsid`, a daemon's double fork).
//!
//! `lockctl` is the job's child subreaper: a process of the job whose parent dies becomes
//! lockctl's child, and lockctl reaps every child it has. The job has ended when lockctl has no
//! child left. CMD is started through `lockctl exec-job`, which ties CMD's life to lockctl's
//! (`PR_SET_PDEATHSIG`) before it executes CMD: the workspace forbids the unsafe `pre_exec`.

use std::collections::HashMap;
use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, ExitCode, ExitStatus};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::prctl;
use nix::sys::signal::{kill, killpg, SigSet, Signal};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::{getppid, Pid};
use tokio::sync::mpsc;

use crate::cli::ExecJobArgs;
use crate::status;

/// What the reaper reports of the job.
#[derive(Debug)]
pub enum Event {
    /// CMD itself ended; processes it started may still run.
    CommandEnded(io::Result<ExitStatus>),
    /// A child of lockctl (CMD, or a process of the job it adopted) stopped on this signal.
    Stopped(Pid, Signal),
    /// No process of the job is left.
    Ended,
}

/// Makes this process the subreaper of the processes it starts, so that none of them escapes
/// its `waitpid` when its own parent dies.
pub fn become_subreaper() -> nix::Result<()> {
    prctl::set_child_subreaper(true)
}

/// `lockctl run` never reads from the terminal; blocked, SIGTTIN and SIGTTOU cannot stop it
/// (a stopped lockctl renews nothing while its job runs on), and its messages reach a terminal
/// whose `tostop` is set. Caught instead, SIGTTOU would restart each such write forever.
/// Called before any other thread starts: a signal mask is per thread, inherited by new
/// threads. `lockctl exec-job` clears it before it becomes CMD.
pub fn block_terminal_signals() -> nix::Result<()> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTTIN);
    set.add(Signal::SIGTTOU);
    set.thread_block()
}

/// `lockctl exec-job --parent <this lockctl> -- CMD`, in a process group of its own. It must be
/// spawned from the thread that lives as long as lockctl (the main thread): the parent-death
/// signal follows the thread that forked, not the process.
pub fn command(cmd: &[String]) -> std::process::Command {
    // Not `current_exe()`'s path: that names a file that an upgrade may have replaced since.
    let mut command = std::process::Command::new("/proc/self/exe");
    command
        .arg0("lockctl")
        .args([
            "exec-job",
            "--parent",
            &std::process::id().to_string(),
            "--",
        ])
        .args(cmd)
        .process_group(0);
    command
}

/// `lockctl exec-job`: dies with the lockctl that started it, then becomes CMD. Returns only
/// when CMD could not be run, with the status a shell would give.
pub fn exec(args: &ExecJobArgs) -> ExitCode {
    if let Err(e) = prctl::set_pdeathsig(Signal::SIGKILL) {
        say!("lockctl: cannot tie the command's life to lockctl's: {e}");
        return ExitCode::from(status::CANNOT_EXECUTE);
    }
    // lockctl may have died before the line above, and then nothing would stop CMD.
    if getppid() != Pid::from_raw(args.parent) {
        say!("lockctl: lockctl run ended before the command started; not running it");
        return ExitCode::FAILURE;
    }
    // A mask survives fork and exec, and `Command` leaves it as it is: CMD would find SIGTTIN
    // and SIGTTOU blocked (and a read from the terminal fail instead of stopping it).
    if let Err(e) = SigSet::empty().thread_set_mask() {
        say!("lockctl: cannot unblock the command's signals: {e}");
        return ExitCode::from(status::CANNOT_EXECUTE);
    }
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    // `exec` (execvp) also restores the SIGPIPE disposition that Rust programs start with
    // ignored, so that CMD starts as a shell would start it.
    let error = std::process::Command::new(program).args(rest).exec();
    if error.kind() == io::ErrorKind::NotFound {
        say!("lockctl: {program}: not found");
        ExitCode::from(status::NOT_FOUND)
    } else {
        say!("lockctl: cannot run {program}: {error}");
        ExitCode::from(status::CANNOT_EXECUTE)
    }
}

/// Reaps every child of lockctl on a thread of its own, until none is left, reporting CMD's
/// end, stops, and the job's end. Nothing else in lockctl waits for children (tokio's process
/// support is not used), so no other reaper races this one.
pub fn watch(command: Child) -> mpsc::UnboundedReceiver<Event> {
    let (events, receiver) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("reaper".into())
        .spawn(move || reap(command, &events))
        .expect("start the reaper thread");
    receiver
}

fn reap(mut command: Child, events: &mpsc::UnboundedSender<Event>) {
    let command_pid = pid_of(&command);
    let mut command_ended = false;
    let consume = WaitPidFlag::WUNTRACED | WaitPidFlag::WNOHANG;
    loop {
        // A look first, without reaping: CMD itself is reaped through std, which reports every
        // signal that can end it (nix names only the standard ones).
        let peeked = waitid(
            Id::All,
            WaitPidFlag::WEXITED | WaitPidFlag::WSTOPPED | WaitPidFlag::WNOWAIT,
        );
        let event = match peeked {
            Ok(WaitStatus::Stopped(pid, signal)) => {
                // Taken off, or it would be seen again.
                let _ = waitpid(pid, Some(consume));
                Some(Event::Stopped(pid, signal))
            }
            Ok(ended) if ended.pid() == Some(command_pid) && !command_ended => {
                command_ended = true;
                Some(Event::CommandEnded(command.wait()))
            }
            Ok(other) => {
                if let Some(pid) = other.pid() {
                    let _ = waitpid(pid, Some(consume));
                }
                None
            }
            Err(Errno::EINTR) => None,
            Err(Errno::ECHILD) => {
                let _ = events.send(Event::Ended);
                return;
            }
            // A child ended by a signal nix cannot name: CMD (std reaps and names it), or
            // another, found among lockctl's zombies.
            Err(Errno::EINVAL) => {
                if command_ended {
                    reap_zombies(command_pid);
                    None
                } else if let Ok(Some(status)) = command.try_wait() {
                    command_ended = true;
                    Some(Event::CommandEnded(Ok(status)))
                } else {
                    reap_zombies(command_pid);
                    None
                }
            }
            Err(e) => {
                say!("lockctl: waiting for the command's processes failed: {e}; retrying");
                std::thread::sleep(Duration::from_millis(100));
                None
            }
        };
        if let Some(event) = event {
            if events.send(event).is_err() {
                return;
            }
        }
    }
}

/// Reaps lockctl's zombie children other than CMD, by pid.
fn reap_zombies(command: Pid) {
    let me = Pid::this();
    let mut reaped = 0;
    for (pid, process) in processes() {
        if process.parent == me && process.dead && pid != command {
            let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
            reaped += 1;
        }
    }
    if reaped == 0 {
        // Not in /proc yet: a moment, rather than a busy loop.
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("a pid fits in an i32"))
}

/// A process as `/proc/<pid>/stat` shows it.
struct Process {
    parent: Pid,
    group: Pid,
    /// A zombie: ended, not yet reaped.
    dead: bool,
}

/// Every process in `/proc`. One that ends meanwhile is simply missing.
fn processes() -> HashMap<Pid, Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid pgrp ...`: the command name may hold spaces and parentheses.
            let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
            let state = fields.next()?;
            let parent: i32 = fields.next()?.parse().ok()?;
            let group: i32 = fields.next()?.parse().ok()?;
            Some((
                Pid::from_raw(pid),
                Process {
                    parent: Pid::from_raw(parent),
                    group: Pid::from_raw(group),
                    dead: matches!(state, "Z" | "X"),
                },
            ))
        })
        .collect()
}

/// The live processes descended from lockctl (the job's, wherever their process group), with
/// their process group.
fn descendants() -> Vec<(Pid, Pid)> {
    let all = processes();
    let mut children: HashMap<Pid, Vec<Pid>> = HashMap::new();
    for (&pid, process) in &all {
        children.entry(process.parent).or_default().push(pid);
    }
    // Dead ones are walked through too: a zombie's children may not be adopted yet.
    let mut found = Vec::new();
    let mut next = vec![Pid::this()];
    while let Some(parent) = next.pop() {
        for &child in children.get(&parent).into_iter().flatten() {
            next.push(child);
            if !all[&child].dead {
                found.push((child, all[&child].group));
            }
        }
    }
    found.sort_unstable();
    found
}

/// The live processes of the job.
pub fn members() -> Vec<Pid> {
    descendants().into_iter().map(|(pid, _)| pid).collect()
}

/// Sends `signal` to the job: to CMD's process group (while the job has a process in it), then
/// to each live process
/// descended from lockctl outside that group (one that ended meanwhile is skipped). Each gets
/// it once: a handler does not run twice.
pub fn signal(group: Pid, signal: Signal) {
    let all = descendants();
    if all.iter().any(|&(_, g)| g == group) {
        let _ = killpg(group, signal);
    }
    for (pid, _) in all.into_iter().filter(|&(_, g)| g != group) {
        let _ = kill(pid, signal);
    }
}

/// Sends `signal` to CMD's process group while a process of the job is in it: once the group
/// is empty its number is free, and an unrelated process may have taken it since.
pub fn signal_group(group: Pid, signal: Signal) {
    if descendants().iter().any(|&(_, g)| g == group) {
        let _ = killpg(group, signal);
    }
}

/// `pids` for a message: the first few, and how many more.
pub fn listed(pids: &[Pid]) -> String {
    const SHOWN: usize = 8;
    let mut list = pids
        .iter()
        .take(SHOWN)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if pids.len() > SHOWN {
        list.push_str(&format!(" and {} more", pids.len() - SHOWN));
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_lists_a_few_pids_and_counts_the_rest() {
        let pids: Vec<Pid> = (1..=10).map(Pid::from_raw).collect();
        assert_eq!(listed(&pids[..2]), "1, 2");
        assert_eq!(listed(&pids), "1, 2, 3, 4, 5, 6, 7, 8 and 2 more");
    }

    #[test]
    fn members_are_the_live_descendants_of_this_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = pid_of(&child);
        assert!(members().contains(&pid));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!members().contains(&pid));
    }
}
