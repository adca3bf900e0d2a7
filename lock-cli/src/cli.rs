//! The command line: what `lockctl` accepts, as clap derive types.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Inspect the Redis locks of lock-runtime (`#[distributed_lock]`): list, show, watch, and
/// force-unlock them, see who leads an election, and run a command under a lock.
///
/// Without --url, --cluster, --redlock or --sentinel, the Redis to inspect comes from the same
/// environment variables as the library: LOCK_REDIS_SENTINEL with LOCK_REDIS_SENTINEL_MASTER,
/// else LOCK_REDIS_CLUSTER (seeds, comma-separated), else LOCK_REDIS_URL (comma-separated URLs
/// mean Redlock), else REDIS_URL.
///
/// rediss:// URLs speak TLS and trust the system's roots (a private CA: point SSL_CERT_FILE at
/// its PEM). LOCK_REDIS_PASSWORD is the password of every URL that carries none (with
/// sentinels, of the master), so that no password need be typed on the command line. Owners are shown by host, pid and the first
/// 8 hex digits of their token, never the whole token (whoever has it can release the lock).
#[derive(Debug, Parser)]
#[command(name = "lockctl", version)]
pub struct Cli {
    /// Where the locks live.
    #[command(flatten)]
    pub target: TargetArgs,

    /// The registry's key prefix: lock `deploy:1` is the Redis key `<prefix>deploy:1`.
    #[arg(long, global = true, default_value = "lock:", value_name = "PREFIX")]
    pub prefix: String,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The deployment to talk to; at most one of these, else the environment decides.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// One Redis server: redis://host:port/ (with an ACL user: redis://user:password@host:port/).
    #[arg(
        long,
        global = true,
        value_name = "URL",
        conflicts_with_all = ["cluster", "redlock", "sentinel", "master_name"]
    )]
    pub url: Option<String>,

    /// A Redis Cluster, through these seed nodes.
    #[arg(
        long,
        global = true,
        value_name = "SEED,SEED",
        value_delimiter = ',',
        conflicts_with_all = ["redlock", "sentinel", "master_name"]
    )]
    pub cluster: Vec<String>,

    /// Redlock over these independent masters.
    #[arg(
        long,
        global = true,
        value_name = "URL,URL,URL",
        value_delimiter = ',',
        conflicts_with_all = ["sentinel", "master_name"]
    )]
    pub redlock: Vec<String>,

    /// Redis Sentinel: the master these sentinels name for --master-name, followed as the
    /// library follows it (comma-separated, or the flag repeated). rediss:// sentinels speak
    /// TLS, and so does the master unless --master-name is a redis:// URL.
    #[arg(long, global = true, value_name = "URL,URL", value_delimiter = ',')]
    pub sentinel: Vec<String>,

    /// The service name the sentinels monitor (mymaster), or redis://user:password@mymaster/db
    /// for the master's login (rediss:// for a TLS master). No default: else
    /// LOCK_REDIS_SENTINEL_MASTER, as for the library.
    #[arg(long, global = true, value_name = "NAME")]
    pub master_name: Option<String>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the held locks whose key starts with KEY_PREFIX (all of them without one).
    ///
    /// Uses SCAN with MATCH (never KEYS, which blocks the server), on every master of a
    /// cluster and on every Redlock node.
    List {
        /// Only keys starting with this, e.g. `deploy:` (matched literally, not as a glob).
        #[arg(value_name = "KEY_PREFIX", default_value = "")]
        key_prefix: String,
    },
    /// Show one lock: owner, remaining lease, last fencing token.
    Show {
        /// The lock's key as the code names it, without the prefix (`deploy:42`).
        key: String,
    },
    /// Print a lock's changes (taken, renewed, released, taken over) until Ctrl-C or --for.
    Watch {
        /// The lock's key, without the prefix.
        key: String,
        /// Stop after this many seconds instead of waiting for Ctrl-C.
        #[arg(long = "for", value_name = "SECS", value_parser = seconds)]
        duration: Option<Duration>,
        /// How often to look, in milliseconds. Taking a lock publishes nothing, so watching
        /// polls; a change shorter than this can go unseen.
        #[arg(long, value_name = "MS", default_value_t = 100)]
        every: u64,
    },
    /// Show who leads an election (`Registry::election`): the identity it campaigned with,
    /// its term and its remaining lease.
    Leader {
        /// The election's key, without the prefix.
        key: String,
        /// Follow the election: a line per change (elected, resigned, handed over, a crashed
        /// leader's lease ended), until Ctrl-C or --for. Woken by the election's
        /// notifications: nothing is polled while nothing changes.
        #[arg(long)]
        watch: bool,
        /// With --watch: stop after this many seconds.
        #[arg(long = "for", value_name = "SECS", value_parser = seconds, requires = "watch")]
        duration: Option<Duration>,
    },
    /// Run CMD under a lock: take it, renew it while CMD runs, release it when CMD ends.
    ///
    /// CMD finds the key in LOCK_KEY and, with --fencing, the fencing token in LOCK_FENCE. It
    /// runs in a process group of its own: every signal lockctl receives (TERM, INT, HUP,
    /// QUIT, USR1, USR2) is passed on to that group, and if the lease is lost the group is sent
    /// SIGTERM, then SIGKILL after --grace. CMD cannot read from a terminal (it is not in the
    /// foreground group). If lockctl itself is killed with SIGKILL, CMD runs on without the
    /// lock: supervise lockctl, not CMD.
    ///
    /// Exits with CMD's status (128 + the signal's number if a signal ended it), or: 75 when
    /// the lock was held (after --wait), 79 when the lease was lost before CMD ended, 69 when
    /// Redis could not be reached, 2 for a bad key or options, 126 or 127 when CMD could not
    /// be run or was not found.
    #[command(
        after_help = "Example, a job that runs once a day whichever machine's cron starts it first:\n  \
        lockctl run report:daily --min-hold 72000 -- ./make-report"
    )]
    Run(RunArgs),
    /// Force-unlock a lock, whoever holds it (asks first).
    ///
    /// The holder notices at its next renewal (within a third of its ttl) and, with
    /// on_lost = "cancel", stops its work.
    Unlock {
        /// The lock's key, without the prefix.
        key: String,
        /// Do not ask (required when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

/// What `lockctl run` takes.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The lock's key, without the prefix.
    pub key: String,
    /// The lease, renewed every third of it while CMD runs; a crashed lockctl's lock is
    /// free after it. Default: the library's (30 s).
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    pub ttl: Option<Duration>,
    /// How long to wait for a busy lock (queued, woken by its release) before giving up.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "0")]
    pub wait: Duration,
    /// Keep the lock this long after it was taken when CMD succeeded (not renewed): the
    /// others' runs of the same job in that period find it busy. A failed CMD releases at
    /// once, so that another may retry.
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    pub min_hold: Option<Duration>,
    /// Take a fencing token and give it to CMD in LOCK_FENCE.
    #[arg(long)]
    pub fencing: bool,
    /// A semaphore of N permits: up to N such commands run at once.
    #[arg(long, value_name = "N", conflicts_with = "mode")]
    pub permits: Option<u32>,
    /// `read`: a reader of a read-write lock, beside other readers (`write`, the default,
    /// runs alone).
    #[arg(long, value_enum, default_value_t = LockMode::Write)]
    pub mode: LockMode,
    /// After a loss's SIGTERM, how long CMD may take to stop before SIGKILL. It runs past
    /// the lease (another holder may have the lock by then): keep it short, or have CMD
    /// write through fencing.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "10")]
    pub grace: Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `lockctl run --mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LockMode {
    /// Alone (an exclusive lock, or a writer of a read-write one).
    Write,
    /// Beside other readers.
    Read,
}

fn seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{s}` is not a positive duration"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn seeds_and_nodes_are_split_on_commas() {
        let cli = Cli::try_parse_from(["lockctl", "--cluster", "redis://a:1,redis://b:2", "list"])
            .unwrap();
        assert_eq!(cli.target.cluster, ["redis://a:1", "redis://b:2"]);
        let cli = Cli::try_parse_from(["lockctl", "show", "x", "--redlock", "redis://a,redis://b"])
            .unwrap();
        assert_eq!(cli.target.redlock, ["redis://a", "redis://b"]);
    }

    #[test]
    fn sentinels_are_taken_comma_separated_or_repeated() {
        let cli = Cli::try_parse_from([
            "lockctl",
            "--sentinel",
            "redis://a:1,redis://b:2",
            "--sentinel",
            "redis://c:3",
            "--master-name",
            "mymaster",
            "list",
        ])
        .unwrap();
        assert_eq!(
            cli.target.sentinel,
            ["redis://a:1", "redis://b:2", "redis://c:3"]
        );
        assert_eq!(cli.target.master_name.as_deref(), Some("mymaster"));
        let both = Cli::try_parse_from([
            "lockctl",
            "--url",
            "redis://a",
            "--sentinel",
            "redis://b",
            "list",
        ]);
        assert!(both.is_err());
    }

    #[test]
    fn two_deployments_at_once_are_refused() {
        let both = Cli::try_parse_from([
            "lockctl",
            "--url",
            "redis://a",
            "--cluster",
            "redis://b",
            "list",
        ]);
        assert!(both.is_err());
    }

    #[test]
    fn run_takes_its_command_after_a_double_dash() {
        let cli = Cli::try_parse_from([
            "lockctl",
            "run",
            "job",
            "--ttl",
            "5",
            "--fencing",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .unwrap();
        let Command::Run(RunArgs {
            key,
            ttl,
            fencing,
            command,
            grace,
            ..
        }) = cli.command
        else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(key, "job");
        assert_eq!(ttl, Some(Duration::from_secs(5)));
        assert!(fencing);
        assert_eq!(command, ["sh", "-c", "exit 3"]);
        assert_eq!(grace, Duration::from_secs(10));
        // No command, or one without `--`: refused.
        assert!(Cli::try_parse_from(["lockctl", "run", "job"]).is_err());
        assert!(Cli::try_parse_from(["lockctl", "run", "job", "true"]).is_err());
        // A semaphore has no readers.
        assert!(Cli::try_parse_from([
            "lockctl",
            "run",
            "job",
            "--permits",
            "2",
            "--mode",
            "read",
            "--",
            "true"
        ])
        .is_err());
    }

    #[test]
    fn watch_duration_takes_fractional_seconds() {
        let cli = Cli::try_parse_from(["lockctl", "watch", "k", "--for", "1.5"]).unwrap();
        let Command::Watch { duration, .. } = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(duration, Some(Duration::from_millis(1500)));
        assert!(Cli::try_parse_from(["lockctl", "watch", "k", "--for", "-1"]).is_err());
    }
}
