//! `lockctl`: list, show, watch and force-unlock the Redis locks of lock-runtime, show who
//! leads an election, and run a command under a lock.
//!
//! Reads and deletes go through `lock_runtime::Registry` (`inspect`, `force_unlock_owned_by`), so the
//! tool sees the same keys, fencing counters and Redlock quorums as the services; only listing
//! talks to Redis directly, since the library has no scan.

/// `eprintln!` that never panics: a `lockctl run` whose stderr is gone (a closed pipe) must go
/// on holding its lock for its job, not die at its first message and let the lock go.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod cli;
mod confirm;
mod job;
mod json;
mod leader;
mod list;
mod render;
mod run;
mod scan;
mod status;
mod target;
mod watch;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use lock_runtime::{LockError, Registry};

use crate::cli::{Cli, Command};
use crate::confirm::Answer;
use crate::target::{TargetExt, PASSWORD_VAR};

/// A failure to report: one message for the operator, exit status 1.
#[derive(Debug)]
pub struct Failure(pub String);

impl From<LockError> for Failure {
    fn from(e: LockError) -> Self {
        Self(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        // Before any runtime: this process becomes CMD.
        Command::ExecJob(args) => return job::exec(args),
        Command::Schema => {
            print!("{}", lock_runtime::protocol::POSTGRES_SCHEMA);
            return ExitCode::SUCCESS;
        }
        // Before any thread starts, so that every thread has them blocked.
        Command::Run(_) => {
            if let Err(e) = job::block_terminal_signals() {
                eprintln!("lockctl: cannot block SIGTTIN and SIGTTOU: {e}");
                return ExitCode::FAILURE;
            }
        }
        _ => {}
    }
    // One thread: `run` starts CMD from it, and CMD dies with the thread that started it.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lockctl: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(start(cli))
}

async fn start(cli: Cli) -> ExitCode {
    // `run` exits with its command's status, or with one of its own that says why it did not
    // run; a configuration it cannot use is a usage error there.
    let usage = if matches!(cli.command, Command::Run(_)) {
        ExitCode::from(status::USAGE)
    } else {
        ExitCode::FAILURE
    };
    match execute(cli).await {
        Ok(code) => code,
        Err(Failure(message)) => {
            eprintln!("lockctl: {message}");
            usage
        }
    }
}

async fn execute(cli: Cli) -> Result<ExitCode, Failure> {
    let env = |name: &str| std::env::var(name).ok();
    let mut target = target::resolve(&cli.target, env).map_err(Failure)?;
    if let Some(password) = env(PASSWORD_VAR).filter(|p| !p.is_empty()) {
        target = target.with_password(&password).map_err(Failure)?;
    }
    let registry = target.registry(&cli.prefix)?;
    match cli.command {
        Command::Run(args) => return Ok(run::run(&registry, args).await),
        Command::List {
            key_prefix,
            owner,
            queued,
            oldest,
            top,
            json,
        } => {
            let listing = list::Listing {
                owner,
                queued,
                oldest,
                top,
                json,
            };
            list::list(&target, &registry, &key_prefix, &listing).await?;
        }
        Command::Show { key, json } => {
            let info = registry.inspect(&key).await?;
            let store_key = registry.redis_key(&key);
            if json {
                println!("{}", json::lock(&key, &store_key, &info));
            } else {
                print!("{}", render::details(&store_key, &info));
            }
        }
        Command::Watch {
            key,
            duration,
            every,
        } => {
            // Fail fast on a bad key or an unreachable Redis instead of watching an error.
            registry.inspect(&key).await?;
            watch::watch(&registry, &key, Duration::from_millis(every), duration).await;
        }
        Command::Leader {
            key,
            watch: false,
            json,
            ..
        } => leader::show(&registry, &key, json).await?,
        Command::Leader { key, duration, .. } => leader::watch(&registry, &key, duration).await?,
        Command::Unlock { key, yes } => unlock(&registry, &key, yes).await?,
        Command::ExecJob(_) | Command::Schema => {
            unreachable!("exec-job and schema run before any registry")
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn unlock(registry: &Registry, key: &str, yes: bool) -> Result<(), Failure> {
    let redis_key = registry.redis_key(key);
    let info = registry.inspect(key).await?;
    if let (None, Some(held)) = (&info.owner, render::holder(&info)) {
        return Err(Failure(format!(
            "{redis_key} is held shared ({held}): `unlock` deletes one owner's lock, and it has \
             no single owner. Its places come back as their holders release them, or within \
             their ttl"
        )));
    }
    let Some(owner) = info.owner.as_deref() else {
        println!("{redis_key} is not held; nothing to unlock");
        return Ok(());
    };
    let shown = render::owner(owner);
    if !yes {
        let question = format!(
            "Force-unlock {redis_key}, held by {shown} ({} left, fence {})? Its holder loses \
             the lock at its next renewal, and another may take it at once.",
            render::remaining(&info),
            render::fence(&info),
        );
        let stdin = std::io::stdin();
        match confirm::ask(
            &question,
            stdin.is_terminal(),
            &mut stdin.lock(),
            &mut std::io::stderr(),
        ) {
            Answer::Yes => {}
            Answer::No => {
                return Err(Failure(format!(
                    "not confirmed: {redis_key} is still locked"
                )));
            }
            Answer::CannotAsk(why) => {
                return Err(Failure(format!(
                    "refusing to force-unlock {redis_key}: {why}"
                )));
            }
        }
    }
    // Owner-checked: if the lock changed hands since we looked (or since the question), the new
    // holder's lock stays; the operator looks again.
    if registry.force_unlock_owned_by(key, owner).await? {
        println!("force-unlocked {redis_key} (held by {shown})");
        Ok(())
    } else {
        Err(Failure(format!(
            "{redis_key} is no longer held by {shown} (released, expired or taken over since); \
             nothing was deleted: run `lockctl show` and try again"
        )))
    }
}
