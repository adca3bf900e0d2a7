//! Throwaway Postgres servers for the tests: each a cluster of its own on a free loopback port,
//! copied from one `initdb` per test process, run by Debian's `pg_ctl` as the `postgres` user
//! when the tests run as root (`initdb` refuses root). The machine's own server (5432) is
//! never used. `scripts/ensure-postgres` installs Debian's `postgresql` when it is missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::server::free_port;

const INSTALL_HINT: &str = "Postgres server binaries (initdb, pg_ctl) were not found under \
     /usr/lib/postgresql/*/bin: run scripts/ensure-postgres (apt-get install -y postgresql), \
     or point LOCK_TEST_PG_BIN at a directory that has them";

/// The directory of `initdb`, `pg_ctl` and `postgres`: `LOCK_TEST_PG_BIN`, else Debian's
/// newest `/usr/lib/postgresql/<version>/bin`.
fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Ok(dir) = std::env::var("LOCK_TEST_PG_BIN") {
            if !dir.is_empty() {
                return PathBuf::from(dir);
            }
        }
        let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| {
                let version = e.file_name().to_str()?.parse().ok()?;
                let bin = e.path().join("bin");
                bin.join("pg_ctl").exists().then_some((version, bin))
            })
            .collect();
        found.sort();
        found.pop().map(|(_, bin)| bin).expect(INSTALL_HINT)
    })
}

/// Whether the tests run as root, so that Postgres's tools run as `postgres` instead.
fn as_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
    })
}

/// `tool` of the Postgres binaries, run as `postgres` when the tests run as root.
fn tool(tool: &str) -> Command {
    as_postgres(bin_dir().join(tool))
}

/// `program`, run as the `postgres` user when the tests run as root (Postgres's tools and
/// PgBouncer refuse root).
fn as_postgres(program: impl AsRef<std::ffi::OsStr>) -> Command {
    if as_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn run(mut command: Command, what: &str) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}. {INSTALL_HINT}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A directory the `postgres` user owns, for the test clusters of every test process.
fn root_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join("lock-tests-pg");
        std::fs::create_dir_all(&dir).expect("a directory for the test clusters");
        if as_root() {
            let mut chown = Command::new("chown");
            chown.arg("postgres").arg(&dir);
            run(chown, "chown the test clusters' directory to postgres");
        }
        dir
    })
}

/// One `initdb`, kept for every later test process and copied for each server (a copy is
/// much faster). Made aside and renamed into place: a process racing this one, or killed
/// halfway, leaves either no template or a whole one.
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let version = bin_dir()
            .parent()
            .and_then(Path::file_name)
            .map_or_else(String::new, |v| v.to_string_lossy().into_owned());
        let data = root_dir().join(format!("template-{version}"));
        if data.join("PG_VERSION").exists() {
            return data;
        }
        let staging = root_dir().join(format!("staging-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        let mut initdb = tool("initdb");
        initdb
            .arg("-D")
            .arg(&staging)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"])
            .arg("--no-sync");
        run(initdb, "initdb");
        if std::fs::rename(&staging, &data).is_err() {
            // Another process put its template there first.
            let _ = std::fs::remove_dir_all(&staging);
        }
        data
    })
}

/// A client of the application's own on `url` (its connection driven by a task of the current
/// runtime), for what a test or benchmark does beside the library.
///
/// # Panics
/// When it cannot connect.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to Postgres: {e}"));
    tokio::spawn(connection);
    client
}

/// A Postgres server of its own, stopped and deleted on drop.
pub struct PostgresServer {
    port: u16,
    dir: PathBuf,
    extra: String,
}

impl PostgresServer {
    /// Starts a fresh server on a free loopback port.
    ///
    /// # Panics
    /// When Postgres is not installed (with how to install it) or does not start.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// Starts a server that logs every statement, for [`lock_statements`](Self::lock_statements).
    #[must_use]
    pub fn start_logging() -> Self {
        Self::start_with("-c log_statement=all")
    }

    /// Starts a fresh server with these `postgres` options (`-c name=value ...`).
    ///
    /// # Panics
    /// As [`start`](Self::start).
    #[must_use]
    pub fn start_with(extra: &str) -> Self {
        Self::start_prepared(extra, |_| {})
    }

    /// Starts a server that speaks TLS with the certificate `certs` made, and takes connections
    /// over TCP only with TLS, authenticated by `auth` (`hostssl ... <auth>`): `cert` for a
    /// client certificate its CA signed for the user (`postgres`), `trust` for anyone. Its
    /// local socket, which [`client`](Self::client) uses, trusts.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    #[must_use]
    pub fn start_tls(certs: &crate::server::Certificates, auth: &str) -> Self {
        let hba = format!("local all all trust\nhostssl all all 127.0.0.1/32 {auth}\n");
        let (cert, key) = certs.server_pems();
        let ca = certs.ca_pem();
        Self::start_prepared(
            "-c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key \
             -c ssl_ca_file=ca.crt",
            |dir| {
                let files: [(&str, &[u8]); 4] = [
                    ("server.crt", &cert),
                    ("server.key", &key),
                    ("ca.crt", &ca),
                    ("pg_hba.conf", hba.as_bytes()),
                ];
                for (name, bytes) in files {
                    let path = dir.join(name);
                    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
                    // Postgres reads its key only if nobody else can.
                    let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
                    std::fs::set_permissions(&path, private).expect("chmod 600");
                    if as_root() {
                        let mut chown = Command::new("chown");
                        chown.arg("postgres").arg(&path);
                        run(chown, "chown a TLS file to postgres");
                    }
                }
            },
        )
    }

    /// Starts a fresh server with these options, once `prepare` has written what it needs
    /// into its data directory.
    fn start_prepared(extra: &str, prepare: impl Fn(&Path)) -> Self {
        let template = template();
        let mut last = String::new();
        // A port found free can be taken before the server binds it: retry.
        for _ in 0..5 {
            let port = free_port();
            let dir = root_dir().join(format!("data-{}-{port}", std::process::id()));
            let mut copy = as_postgres("cp");
            copy.arg("-a").arg(template).arg(&dir);
            run(copy, "copy the template cluster");
            prepare(&dir);
            let server = Self {
                port,
                dir,
                extra: extra.to_owned(),
            };
            match server.pg_ctl_start() {
                Ok(()) => return server,
                Err(e) => last = e,
            }
        }
        panic!("postgres did not start: {last}");
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=200 {}",
            self.port,
            self.dir.display(),
            self.extra
        );
        let out = tool("pg_ctl")
            .arg("-D")
            .arg(&self.dir)
            .args(["-o", &options, "-l"])
            .arg(self.dir.join("log"))
            .args(["-w", "-t", "60", "start"])
            .output()
            .map_err(|e| format!("pg_ctl: {e}. {INSTALL_HINT}"))?;
        if out.status.success() {
            return Ok(());
        }
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        Err(format!(
            "pg_ctl start on port {}: {}\n{log}",
            self.port,
            String::from_utf8_lossy(&out.stderr)
        ))
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs `sql` with `psql` and returns what it printed (unaligned, tuples only).
    ///
    /// # Panics
    /// When `psql` fails.
    pub fn psql(&self, sql: &str) -> String {
        self.client().psql(sql)
    }

    /// `psql` on this server, through its local socket (which trusts whatever TCP asks),
    /// for use where the server itself is not at hand.
    #[must_use]
    pub fn client(&self) -> Psql {
        Psql {
            url: format!(
                "host={} port={} user=postgres dbname=postgres",
                self.dir.display(),
                self.port
            ),
        }
    }

    /// How many sessions listen for a key's release: those whose last statement, finished,
    /// was the store's `LISTEN` (Postgres shows no session's channels but its own).
    #[must_use]
    pub fn listeners(&self) -> usize {
        self.psql(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' \
             AND query LIKE 'SELECT distributed_lock.listen(%'",
        )
        .parse()
        .expect("a count")
    }
}

impl PostgresServer {
    /// How many calls of the store's lock functions (all but `LISTEN`'s) the server logged so
    /// far (a server started with [`start_logging`](Self::start_logging)).
    #[must_use]
    pub fn lock_statements(&self) -> u64 {
        self.logged(|l| l.contains("distributed_lock.") && !l.contains("listen("))
    }

    /// How many statements the server logged so far that contain `text`.
    #[must_use]
    pub fn statements_with(&self, text: &str) -> u64 {
        self.logged(|l| l.contains(text))
    }

    /// How many lines of the server's log contain `text` (a server started with a logging
    /// option, such as `-c log_connections=on`).
    #[must_use]
    pub fn log_lines_with(&self, text: &str) -> u64 {
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        u64::try_from(log.lines().filter(|l| l.contains(text)).count()).unwrap_or(u64::MAX)
    }

    fn logged(&self, counts: impl Fn(&str) -> bool) -> u64 {
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        let n = log
            .lines()
            .filter(|l| l.contains("statement:") || l.contains("execute <unnamed>:"))
            .filter(|l| counts(l))
            .count();
        u64::try_from(n).unwrap_or(u64::MAX)
    }
}

/// Faults, for the tests that inject them.
impl PostgresServer {
    /// The postmaster's pid (the data directory's `postmaster.pid`).
    ///
    /// # Panics
    /// When the server is not running.
    #[must_use]
    pub fn pid(&self) -> u32 {
        let pid = std::fs::read_to_string(self.dir.join("postmaster.pid")).expect("postmaster.pid");
        pid.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("a pid")
    }

    /// The postmaster and every process it started (its backends and workers).
    fn processes(&self) -> Vec<u32> {
        let postmaster = self.pid();
        let children = Command::new("pgrep")
            .arg("-P")
            .arg(postmaster.to_string())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        std::iter::once(postmaster)
            .chain(children.lines().filter_map(|l| l.trim().parse().ok()))
            .collect()
    }

    /// Stops every process of the server (`SIGSTOP`): connections stay open, nothing answers.
    pub fn pause(&self) {
        for pid in self.processes() {
            let _ = signal_quietly(pid, "STOP");
        }
    }

    /// Continues what [`pause`](Self::pause) stopped.
    pub fn resume(&self) {
        for pid in self.processes() {
            let _ = signal_quietly(pid, "CONT");
        }
    }

    /// Kills the postmaster with `SIGKILL` (its backends end with it) and starts the server
    /// again on the same port and data: what was committed survives, as after a crash.
    ///
    /// # Panics
    /// When the server does not start again.
    pub fn kill_and_restart(&self) {
        self.kill();
        self.start_again();
    }

    /// Kills the postmaster with `SIGKILL` and returns once it is gone; its backends exit as
    /// they notice.
    ///
    /// # Panics
    /// When the postmaster lingers for 30 s.
    pub fn kill(&self) {
        let postmaster = self.pid();
        let _ = signal_quietly(postmaster, "KILL");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::path::Path::new(&format!("/proc/{postmaster}")).exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the killed postmaster lingers"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Starts a [`kill`](Self::kill)ed server again on the same port and data.
    ///
    /// # Panics
    /// When it does not start.
    pub fn start_again(&self) {
        let _ = std::fs::remove_file(self.dir.join("postmaster.pid"));
        let mut last = String::new();
        for _ in 0..50 {
            match self.pg_ctl_start() {
                Ok(()) => return,
                // Backends of the killed server may still hold its shared memory a moment.
                Err(e) => last = e,
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("postgres did not start again: {last}");
    }

    /// Ends every client session (`pg_terminate_backend`) but the one that asks.
    pub fn terminate_clients(&self) {
        let _ = self.psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        );
    }
}

/// `psql` on one server, as the `postgres` superuser.
#[derive(Clone, Debug)]
pub struct Psql {
    url: String,
}

impl Psql {
    /// Runs `sql` and returns what it printed (unaligned, tuples only).
    ///
    /// # Panics
    /// When `psql` fails.
    pub fn psql(&self, sql: &str) -> String {
        self.run(sql, &[], &[])
            .unwrap_or_else(|e| panic!("psql {sql}: {e}"))
    }

    /// [`psql`](Self::psql) with its fields separated by `separator` (a field may hold `|`).
    ///
    /// # Panics
    /// When `psql` fails.
    pub fn psql_separated(&self, sql: &str, separator: char) -> String {
        self.run(sql, &["-F", &separator.to_string()], &[])
            .unwrap_or_else(|e| panic!("psql {sql}: {e}"))
    }

    /// [`psql`](Self::psql) that gives up within about a second, or `None` when it fails: a
    /// question to a server that may be stopped or down.
    #[must_use]
    pub fn psql_quick(&self, sql: &str) -> Option<String> {
        self.run(
            sql,
            &[],
            &[
                ("PGCONNECT_TIMEOUT", "1"),
                ("PGOPTIONS", "-c statement_timeout=1000"),
            ],
        )
        .ok()
    }

    /// Starts `psql` running `sql` as a session named `application`, and returns at once.
    ///
    /// # Panics
    /// When `psql` cannot be started.
    #[must_use]
    pub fn spawn(&self, sql: &str, application: &str) -> std::process::Child {
        self.command(sql)
            .env("PGAPPNAME", application)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("psql: {e}. {INSTALL_HINT}"))
    }

    fn command(&self, sql: &str) -> Command {
        let mut psql = Command::new(bin_dir().join("psql"));
        psql.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(&self.url)
            .arg("-c")
            .arg(sql);
        psql
    }

    fn run(&self, sql: &str, args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
        let out = self
            .command(sql)
            .args(args)
            .envs(env.iter().copied())
            .output()
            .map_err(|e| format!("psql: {e}. {INSTALL_HINT}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

/// `kill -<sig> <pid>`, saying nothing of a process that has just exited.
fn signal_quietly(pid: u32, sig: &str) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(std::process::Stdio::null())
        .status()
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let _ = tool("pg_ctl")
            .arg("-D")
            .arg(&self.dir)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const PGBOUNCER_HINT: &str =
    "pgbouncer was not found: run scripts/ensure-postgres (apt-get install -y pgbouncer)";

/// Where `pgbouncer` is: Debian puts it in `/usr/sbin`, which the `postgres` user's `PATH`
/// may lack.
fn pgbouncer() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|bin| bin.exists())
        .unwrap_or_else(|| panic!("{PGBOUNCER_HINT}"))
}

/// PgBouncer in transaction mode in front of a [`PostgresServer`], on a free loopback port,
/// run as the `postgres` user when the tests run as root (it refuses root). Stopped on drop.
pub struct PgBouncer {
    port: u16,
    dir: PathBuf,
    child: std::process::Child,
}

impl PgBouncer {
    /// Starts one for `server`'s database `postgres`, trusting every user.
    ///
    /// # Panics
    /// When `pgbouncer` is not installed (`scripts/ensure-postgres` installs it) or does not
    /// start.
    #[must_use]
    pub fn transaction_mode(server: &PostgresServer) -> Self {
        let port = free_port();
        let dir = root_dir().join(format!("pgbouncer-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for pgbouncer");
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").expect("users.txt");
        let ini = format!(
            "[databases]\npostgres = host=127.0.0.1 port={} dbname=postgres user=postgres\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {users}\npool_mode = transaction\n\
             default_pool_size = 4\nmax_client_conn = 200\n\
             ignore_startup_parameters = extra_float_digits,options\nlogfile = {log}\n",
            server.port(),
            users = dir.join("users.txt").display(),
            log = dir.join("pgbouncer.log").display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).expect("pgbouncer.ini");
        if as_root() {
            let mut chown = Command::new("chown");
            chown.args(["-R", "postgres"]).arg(&dir);
            run(chown, "chown pgbouncer's directory to postgres");
        }
        let child = as_postgres(pgbouncer())
            .arg(dir.join("pgbouncer.ini"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("pgbouncer: {e}. {PGBOUNCER_HINT}"));
        let mut bouncer = Self { port, dir, child };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            let log =
                || std::fs::read_to_string(bouncer.dir.join("pgbouncer.log")).unwrap_or_default();
            if let Ok(Some(status)) = bouncer.child.try_wait() {
                let mut stderr = String::new();
                if let Some(mut pipe) = bouncer.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
                }
                panic!("pgbouncer exited ({status}): {stderr}{}", log());
            }
            assert!(
                std::time::Instant::now() < deadline,
                "pgbouncer did not listen on {port}: {}",
                log()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        bouncer
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`, through the pooler.
    #[must_use]
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        // runuser passes the signal on to pgbouncer.
        let _ = signal_quietly(self.child.id(), "TERM");
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
