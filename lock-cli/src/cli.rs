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
        conflicts_with_all = ["cluster", "redlock", "sentinel", "master_name", "postgres"]
    )]
    pub url: Option<String>,

    /// One Postgres database: postgres://user@host:5432/database (else LOCK_POSTGRES_URL).
    #[arg(
        long,
        global = true,
        value_name = "URL",
        conflicts_with_all = ["cluster", "redlock", "sentinel", "master_name"]
    )]
    pub postgres: Option<String>,

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
    ///
    /// During an incident: `--owner web-1:4242` lists every lock one process holds, `--queued`
    /// the locks callers wait for, the longest queue first, `--oldest` the locks held longest.
    List {
        /// Only keys starting with this, e.g. `deploy:` (matched literally, not as a glob).
        #[arg(value_name = "KEY_PREFIX", default_value = "")]
        key_prefix: String,
        /// Only the locks OWNER holds (alone, or as a reader or permit holder): an election
        /// candidate's identity, a `host:pid`, a host, or an owner as `list` shows it.
        #[arg(long, value_name = "OWNER")]
        owner: Option<String>,
        /// Only the locks callers are queued for, the longest queue first.
        #[arg(long, conflicts_with = "oldest")]
        queued: bool,
        /// The locks held longest, the oldest holder first: only those whose time held the
        /// store knows (Postgres: always; Redis: from the holder's first renewal on, so a lock
        /// held for less than a third of its ttl, or by a client other than lock-runtime, is
        /// left out).
        #[arg(long)]
        oldest: bool,
        /// At most N rows (with --queued: the N longest queues; with --oldest: the N oldest
        /// holders).
        #[arg(long, value_name = "N")]
        top: Option<usize>,
        /// One JSON object for scripts: `locks`, each with its owner taken apart (identity,
        /// host, pid), durations in milliseconds, and its queue; `unscanned`, the nodes that
        /// could not be read.
        #[arg(long)]
        json: bool,
    },
    /// Print the Postgres store's schema (the tables and functions of `distributed_lock`), for
    /// a database owner to apply where the services' role may not create it on first use:
    /// `lockctl schema | psql "$DATABASE_URL"`.
    Schema,
    /// Show one lock: owner, remaining lease, last fencing token.
    Show {
        /// The lock's key as the code names it, without the prefix (`deploy:42`).
        key: String,
        /// One JSON object, as each of `list --json`'s locks.
        #[arg(long)]
        json: bool,
    },
    /// Print a lock's changes (taken, renewed, released, taken over) until Ctrl-C or --for.
    Watch {
        /// The lock's key, without the prefix.
        key: String,
        /// Stop after this long (`30s`, `2m`, or seconds) instead of waiting for Ctrl-C.
        #[arg(long = "for", value_name = "DURATION", value_parser = duration)]
        duration: Option<Duration>,
        /// How often to look, in milliseconds. Taking a lock publishes nothing, so watching
        /// polls; a change shorter than this can go unseen.
        #[arg(long, value_name = "MS", default_value_t = 100)]
        every: u64,
    },
    /// Show who leads an election (`Registry::election`): the identity it campaigned with,
    /// its term, how long it has led (where the store knows: see `list --oldest`) and its
    /// remaining lease; then the candidates in line, the next leader first,
    /// and those standing aside in their places (where candidates queue: not on Redlock).
    Leader {
        /// The election's key, without the prefix.
        key: String,
        /// Follow the election: a line per change (elected, resigned, handed over, a crashed
        /// leader's lease ended), until Ctrl-C or --for. Woken by the election's
        /// notifications: nothing is polled while nothing changes.
        #[arg(long)]
        watch: bool,
        /// With --watch: stop after this long (`30s`, `2m`, or seconds).
        #[arg(long = "for", value_name = "DURATION", value_parser = duration, requires = "watch")]
        duration: Option<Duration>,
        /// One JSON object: `leader` (its identity, term, and in milliseconds how long it has
        /// led and its remaining lease; or null), `in_line` and `standing_aside`.
        #[arg(long, conflicts_with = "watch")]
        json: bool,
    },
    /// Run CMD under a lock: take it, renew it while the job runs, release it when the job
    /// has ended.
    ///
    /// The job is CMD and every process it starts, in CMD's process group or out of it
    /// (setsid, a daemon): lockctl is their subreaper and holds the lock until the last of
    /// them has ended. CMD finds the key in LOCK_KEY and, with --fencing, the fencing token in
    /// LOCK_FENCE; it does not find lockctl's credentials (see --pass-credentials).
    ///
    /// Signals: TERM, INT, HUP, QUIT, USR1 and USR2 sent to lockctl are passed on to CMD's
    /// process group. Ctrl-Z (TSTP) is refused with a word on stderr, and TTIN and TTOU are
    /// blocked: a stopped lockctl would stop renewing the lock while the job runs on. If the
    /// lease is lost, every process of the job is sent SIGTERM, then SIGKILL after --grace,
    /// and lockctl exits once none is left. If lockctl is killed with SIGKILL, CMD is killed
    /// with it; processes CMD started run on, without the lock.
    ///
    /// CMD runs outside the terminal's foreground: it cannot read from the terminal. A job
    /// that stops to read from it (SIGTTIN), or to change its settings (SIGTTOU), is ended
    /// and the lock released.
    ///
    /// Exits with CMD's status (128 + the signal's number if a signal ended it), or: 75 when
    /// the lock was held (after --wait), 79 when the lease was lost before the job ended, 66
    /// when the job stopped to use the terminal, 69 when Redis could not be reached, 2 for a
    /// bad key or options, 126 or 127 when CMD could not be run or was not found.
    ///
    /// Durations are written as the attribute's (500ms, 30s, 2m, 12h) or in plain seconds
    /// (30, 0.5). Linux only (the subreaper and the parent-death signal are Linux's).
    #[command(
        after_help = "Example, a job that runs once a day whichever machine's cron starts it first:\n  \
        lockctl run report:daily --min-hold 20h -- ./make-report"
    )]
    Run(RunArgs),
    /// How `lockctl run` starts CMD: ties CMD's life to the lockctl given (it is killed if that
    /// lockctl dies), then executes CMD in its place. Not for direct use.
    #[command(name = "exec-job", hide = true)]
    ExecJob(ExecJobArgs),
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
    /// The lease, renewed every third of it while the job runs; a crashed lockctl's lock is
    /// free after it. Default: the library's (30s).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub ttl: Option<Duration>,
    /// How long to wait for a busy lock (queued, woken by its release) before giving up.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "0s")]
    pub wait: Duration,
    /// Keep the lock this long after it was taken when CMD succeeded (not renewed): the
    /// others' runs of the same job in that period find it busy. A failed CMD releases at
    /// once, so that another may retry.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
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
    /// After a loss's SIGTERM (or the job's stop at the terminal), how long the job's
    /// processes may take to end before SIGKILL. It runs past the lease (another holder may
    /// have the lock by then): keep it short, or have CMD write through fencing.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "10s")]
    pub grace: Duration,
    /// Leave lockctl's credentials in CMD's environment: LOCK_REDIS_PASSWORD, and those of
    /// LOCK_REDIS_URL, REDIS_URL, LOCK_REDIS_CLUSTER, LOCK_REDIS_SENTINEL and
    /// LOCK_REDIS_SENTINEL_MASTER that hold a URL with a password. Without it, CMD does not
    /// find them.
    #[arg(long)]
    pub pass_credentials: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// What `lockctl exec-job` takes.
#[derive(Debug, Args)]
pub struct ExecJobArgs {
    /// The pid of the `lockctl run` that starts it: if that is no longer its parent, CMD is
    /// not run.
    #[arg(long, value_name = "PID")]
    pub parent: i32,
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

/// The longest duration any option takes: 365 days, as the attribute's grammar and the
/// library's own bound for `ttl` and `min_hold`.
const MAX_MILLIS: u64 = 365 * 24 * 3_600_000;

/// The attribute's units (`lock-macros/src/duration.rs`), with their length in milliseconds.
const UNITS: [(&str, u64); 4] = [("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)];

/// A duration as the attribute writes it (a whole number and a unit: `500ms`, `30s`, `2m`,
/// `12h`), or a plain number of seconds (`30`, `0.5`).
fn duration(text: &str) -> Result<Duration, String> {
    const UNIT_LIST: &str = "`ms`, `s`, `m` or `h`";
    let too_long = || format!("`{text}` is too long: at most 365 days (`8760h`)");
    if text.is_empty() {
        return Err(format!(
            "empty duration: write a number and a unit ({UNIT_LIST}), e.g. `30s`"
        ));
    }
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, rest) = text.split_at(digits);
    if number.is_empty() {
        return Err(format!(
            "`{text}`: a duration starts with a number, e.g. `30s`, `500ms` or `0.5` (seconds)"
        ));
    }
    if let Some(fraction) = rest.strip_prefix('.') {
        // Plain seconds with a fraction; a unit takes whole numbers only, as in the attribute.
        let digits = fraction
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(fraction.len());
        if digits == 0 {
            return Err(format!("`{text}` is not a number of seconds"));
        }
        if digits < fraction.len() {
            return Err(format!(
                "`{text}`: fractions are taken in plain seconds only (`1.5`); with a unit, \
                 use a smaller one (`1500ms`)"
            ));
        }
    }
    if rest.is_empty() || rest.starts_with('.') {
        let secs: f64 = text
            .parse()
            .map_err(|_| format!("`{text}` is not a number of seconds"))?;
        return match Duration::try_from_secs_f64(secs) {
            Ok(d) if d <= Duration::from_millis(MAX_MILLIS) => Ok(d),
            _ => Err(too_long()),
        };
    }
    let Some(&(_, unit_millis)) = UNITS.iter().find(|(name, _)| *name == rest) else {
        return Err(format!(
            "`{text}`: unknown unit `{rest}`; use {UNIT_LIST} (or a plain number of seconds)"
        ));
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|count| count.checked_mul(unit_millis))
        .filter(|&millis| millis <= MAX_MILLIS)
        .map(Duration::from_millis)
        .ok_or_else(too_long)
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
    fn durations_take_the_attributes_units_or_plain_seconds() {
        let ms = Duration::from_millis;
        for (text, expected) in [
            ("500ms", ms(500)),
            ("30s", ms(30_000)),
            ("2m", ms(120_000)),
            ("12h", ms(43_200_000)),
            ("0s", ms(0)),
            ("30", ms(30_000)),
            ("0.5", ms(500)),
            ("0", ms(0)),
            ("8760h", ms(365 * 24 * 3_600_000)),
        ] {
            assert_eq!(duration(text), Ok(expected), "{text}");
        }
        for (text, why) in [
            ("", "empty"),
            ("s", "starts with a number"),
            ("1.5s", "fractions"),
            ("5x", "unknown unit `x`"),
            ("5 s", "unknown unit ` s`"),
            ("-1", "starts with a number"),
            ("1e3", "unknown unit `e3`"),
            ("inf", "starts with a number"),
            ("8761h", "too long"),
            ("31536001", "too long"),
            ("99999999999999999999s", "too long"),
            ("1.", "not a number"),
        ] {
            let error = duration(text).expect_err(text);
            assert!(error.contains(why), "{text}: {error}");
        }
        let cli = Cli::try_parse_from([
            "lockctl",
            "run",
            "job",
            "--ttl",
            "30s",
            "--wait",
            "2m",
            "--min-hold",
            "12h",
            "--grace",
            "500ms",
            "--",
            "true",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(
            (args.ttl, args.wait, args.min_hold, args.grace),
            (Some(ms(30_000)), ms(120_000), Some(ms(43_200_000)), ms(500))
        );
        let refused = Cli::try_parse_from(["lockctl", "run", "job", "--ttl", "5x", "--", "true"])
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("--ttl") && refused.contains("unknown unit `x`"),
            "{refused}"
        );
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
