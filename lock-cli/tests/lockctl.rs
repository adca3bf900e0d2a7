//! `lockctl` against real servers: a single node, a Redis Cluster, Redlock nodes, Sentinel
//! deployments and Postgres that each test starts itself. The binary runs as an operator would run it; locks are taken through
//! the library, as the services would.

use std::process::{Output, Stdio};
use std::time::Duration;

use lock_runtime::{LockError, LockGuard, LostReason, Registry};
use lock_tests::cluster::RedisCluster;
use lock_tests::postgres::PostgresServer;
use lock_tests::sentinel::{RedisSentinels, SERVICE};
use lock_tests::{RedisServer, RENEWED_TTL};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// Longer than any test: locks must not expire under it.
const TTL: Duration = Duration::from_secs(60);
/// Bounds a wait for output that should come: a hang fails the test instead of stalling it.
const PATIENCE: Duration = Duration::from_secs(30);

/// A `lockctl` that keeps printing (`watch`, `leader --watch`), read line by line.
struct Printing {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Printing {
    fn spawn(mut command: Command) -> Self {
        let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    /// The next line, within [`PATIENCE`].
    async fn next(&mut self) -> String {
        tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .expect("a line from lockctl")
            .unwrap()
            .expect("lockctl goes on printing")
    }

    /// The next line that holds `needle`.
    async fn next_with(&mut self, needle: &str) -> String {
        loop {
            let line = self.next().await;
            if line.contains(needle) {
                return line;
            }
        }
    }

    async fn stop(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// `lockctl` with no deployment in its environment: each test says where to look.
fn lockctl(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command
        .args(args)
        .env_remove("LOCK_REDIS_URL")
        .env_remove("LOCK_REDIS_CLUSTER")
        .env_remove("REDIS_URL")
        .env_remove("LOCK_REDIS_SENTINEL")
        .env_remove("LOCK_REDIS_SENTINEL_MASTER")
        .env_remove("LOCK_REDIS_PASSWORD")
        .env_remove("LOCK_POSTGRES_URL")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// How `lockctl` shows an owner: `host:pid:` and the first 8 hex digits of its random part.
fn shown(token: &str) -> String {
    format!("{}…", &token[..token.len() - 24])
}

async fn run(command: &mut Command) -> Output {
    command.output().await.expect("run lockctl")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn succeeded(out: &Output) -> String {
    assert!(
        out.status.success(),
        "lockctl failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

async fn hold(registry: &Registry, key: &str, fencing: bool) -> LockGuard {
    registry
        .lock(key)
        .ttl(TTL)
        .fencing(fencing)
        .acquire()
        .await
        .expect("take the lock")
}

/// A holder whose lock lockctl deleted learns it at its next renewal.
async fn notices_it_is_gone(guard: LockGuard) {
    let lost = tokio::time::timeout(PATIENCE, guard.lost())
        .await
        .expect("the holder notices at its next renewal");
    assert!(
        matches!(
            lost,
            LockError::Lost {
                reason: LostReason::Gone,
                ..
            }
        ),
        "{lost}"
    );
}

/// The output line about `key` in a `list` table.
fn row<'a>(listing: &'a str, key: &str) -> &'a str {
    listing
        .lines()
        .find(|line| line.split_whitespace().next() == Some(key))
        .unwrap_or_else(|| panic!("no row for {key} in:\n{listing}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_owner_ttl_and_fence_of_locks_under_a_key_prefix() {
    let server = RedisServer::start();
    let registry = Registry::from_url(&server.url()).unwrap();
    let first = hold(&registry, "deploy:1", true).await;
    let second = hold(&registry, "deploy:2", false).await;
    let _other = hold(&registry, "report:daily", false).await;

    let out = succeeded(&run(&mut lockctl(&["--url", &server.url(), "list", "deploy:"])).await);

    let first_row = row(&out, "deploy:1");
    assert!(first_row.contains(&shown(first.token())), "{out}");
    let fence = first.fence().unwrap().to_string();
    let columns: Vec<&str> = first_row.split_whitespace().collect();
    assert_eq!(
        columns[columns.len() - 2..],
        [fence.as_str(), "0"],
        "its fence, and nobody queued: {out}"
    );
    assert!(
        first_row.contains('s'),
        "a remaining lease in seconds: {out}"
    );
    assert!(
        row(&out, "deploy:2").contains(&shown(second.token())),
        "{out}"
    );
    assert!(
        !out.contains("report:daily"),
        "outside the key prefix: {out}"
    );
    assert!(out.contains("2 locks under lock:deploy:"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_reads_the_deployment_from_the_library_environment() {
    let server = RedisServer::start();
    let registry = Registry::from_url(&server.url()).unwrap();
    let guard = hold(&registry, "job:env", false).await;

    let out = succeeded(&run(lockctl(&["list"]).env("LOCK_REDIS_URL", server.url())).await);
    assert!(
        row(&out, "job:env").contains(&shown(guard.token())),
        "{out}"
    );

    let out = succeeded(&run(lockctl(&["list"]).env("REDIS_URL", server.url())).await);
    assert!(
        row(&out, "job:env").contains(&shown(guard.token())),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_of_nothing_says_so() {
    let server = RedisServer::start();
    let out = succeeded(&run(&mut lockctl(&["--url", &server.url(), "list"])).await);
    assert_eq!(out.trim(), "no locks under lock:");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_uses_the_given_registry_prefix() {
    let server = RedisServer::start();
    let registry = Registry::builder()
        .url(server.url())
        .prefix("billing-lock:")
        .build()
        .unwrap();
    let guard = hold(&registry, "invoice:9", false).await;

    let default = succeeded(&run(&mut lockctl(&["--url", &server.url(), "list"])).await);
    assert!(!default.contains("invoice:9"), "{default}");
    let url = server.url();
    let out = succeeded(
        &run(&mut lockctl(&[
            "--url",
            &url,
            "--prefix",
            "billing-lock:",
            "list",
        ]))
        .await,
    );
    assert!(
        row(&out, "invoice:9").contains(&shown(guard.token())),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_prints_owner_host_pid_lease_and_fence() {
    let server = RedisServer::start();
    let registry = Registry::from_url(&server.url()).unwrap();
    let guard = hold(&registry, "deploy:7", true).await;

    let out = succeeded(&run(&mut lockctl(&["--url", &server.url(), "show", "deploy:7"])).await);
    assert!(out.contains("key:    lock:deploy:7"), "{out}");
    assert!(out.contains("state:  held"), "{out}");
    assert!(out.contains(&shown(guard.token())), "{out}");
    assert!(
        !out.contains(guard.token()),
        "never the whole token, which would release the lock: {out}"
    );
    assert!(
        out.contains(&format!("pid {})", std::process::id())),
        "the owner's pid is this test process: {out}"
    );
    let fence = guard.fence().unwrap();
    assert!(out.contains(&format!("fence:  {fence}")), "{out}");

    guard.release().await.unwrap();
    let out = succeeded(&run(&mut lockctl(&["--url", &server.url(), "show", "deploy:7"])).await);
    assert!(out.contains("state:  free"), "{out}");
    assert!(
        out.contains(&format!("fence:  {fence}")),
        "the counter outlives the lock: {out}"
    );
}

/// On a Postgres server that takes only TLS: `list` (its own connection) and `show` (through
/// the library) both speak it with `sslmode=verify-full`, trusting the CA that `SSL_CERT_FILE`
/// names; without the CA, the refusal says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_show_work_on_postgres_over_tls() {
    let certs = lock_tests::server::Certificates::make();
    let server = lock_tests::postgres::PostgresServer::start_tls(&certs, "trust");
    let ca = tempdir().join("ca.pem");
    std::fs::write(&ca, certs.ca_pem()).unwrap();
    let url = format!("{}?sslmode=verify-full", server.url());
    let registry = Registry::builder()
        .postgres(&url)
        .tls_root_cert(certs.ca_pem())
        .build()
        .unwrap();
    let held = hold(&registry, "deploy:tls", true).await;
    let with_ca = |args: &[&str]| {
        let mut command = lockctl(args);
        command.env("SSL_CERT_FILE", &ca);
        command
    };
    let out = succeeded(&run(&mut with_ca(&["--postgres", &url, "list"])).await);
    assert!(
        row(&out, "deploy:tls").contains(&shown(held.token())),
        "{out}"
    );
    let out = succeeded(&run(&mut with_ca(&["--postgres", &url, "show", "deploy:tls"])).await);
    assert!(out.contains(&shown(held.token())), "{out}");
    // Without the CA the server's certificate cannot be checked: refused, never downgraded.
    let mut without = lockctl(&["--postgres", &url, "show", "deploy:tls"]);
    without.env("SSL_CERT_FILE", "/nonexistent");
    let out = run(&mut without).await;
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(stderr(&out).contains("tls_root_cert"), "{}", stderr(&out));
    held.release().await.unwrap();
}

/// `list`'s own connection reads `sslmode` as the library does: only the parameter, never a
/// password that happens to spell one (a plain text replace turned this password into another,
/// and the server refused the login).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_on_postgres_sends_a_password_that_spells_an_sslmode_as_written() {
    let certs = lock_tests::server::Certificates::make();
    let server = lock_tests::postgres::PostgresServer::start_tls(&certs, "scram-sha-256");
    let password = "pw-sslmode=verify-full";
    server.psql(&format!("ALTER ROLE postgres PASSWORD '{password}'"));
    let ca = tempdir().join("ca.pem");
    std::fs::write(&ca, certs.ca_pem()).unwrap();
    let url = format!(
        "postgres://postgres:{password}@127.0.0.1:{}/postgres?sslmode=verify-full",
        server.port()
    );
    let registry = Registry::builder()
        .postgres(&url)
        .tls_root_cert(certs.ca_pem())
        .build()
        .unwrap();
    let held = hold(&registry, "deploy:password", true).await;
    let mut list = lockctl(&["--postgres", &url, "list"]);
    list.env("SSL_CERT_FILE", &ca);
    let out = succeeded(&run(&mut list).await);
    assert!(
        row(&out, "deploy:password").contains(&shown(held.token())),
        "{out}"
    );
    held.release().await.unwrap();
}

/// On Postgres: `list` reads the store's table, `show` and `unlock` go through the library, and
/// the deployment comes from `--postgres` or `LOCK_POSTGRES_URL`; `schema` prints the SQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_and_unlock_work_on_postgres() {
    let server = lock_tests::postgres::PostgresServer::start();
    let url = server.url();
    let out = succeeded(&run(&mut lockctl(&["--postgres", &url, "list"])).await);
    assert!(
        out.contains("no locks under lock:"),
        "before the schema exists: {out}"
    );
    let registry = Registry::builder().postgres(&url).build().unwrap();
    let fenced = hold(&registry, "deploy:1", true).await;
    let guard = registry
        .lock("deploy:2")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let _other = hold(&registry, "report:daily", false).await;

    let mut from_env = lockctl(&["list", "deploy:"]);
    from_env.env("LOCK_POSTGRES_URL", &url);
    let out = succeeded(&run(&mut from_env).await);
    let first_row = row(&out, "deploy:1");
    assert!(first_row.contains(&shown(fenced.token())), "{out}");
    assert!(
        first_row.contains(&fenced.fence().unwrap().to_string()),
        "{out}"
    );
    assert!(
        row(&out, "deploy:2").contains(&shown(guard.token())),
        "{out}"
    );
    assert!(!out.contains("report:daily"), "{out}");
    assert!(out.contains("2 locks under lock:deploy:"), "{out}");

    let out = succeeded(&run(&mut lockctl(&["--postgres", &url, "show", "deploy:2"])).await);
    assert!(out.contains(&shown(guard.token())), "{out}");
    let out = succeeded(
        &run(&mut lockctl(&[
            "--postgres",
            &url,
            "unlock",
            "deploy:2",
            "--yes",
        ]))
        .await,
    );
    assert!(out.contains("force-unlocked lock:deploy:2"), "{out}");
    assert_eq!(registry.inspect("deploy:2").await.unwrap().owner, None);
    notices_it_is_gone(guard).await;

    let out = succeeded(&run(&mut lockctl(&["schema"])).await);
    assert!(
        out.contains("CREATE OR REPLACE FUNCTION distributed_lock.acquire("),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_with_yes_deletes_the_lock_and_its_holder_learns_it_was_stolen() {
    let server = RedisServer::start();
    let registry = Registry::from_url(&server.url()).unwrap();
    let guard = registry
        .lock("deploy:9")
        // Renewals at ttl/3 are how the holder finds out; keep them frequent.
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();

    let url = server.url();
    let out = succeeded(
        &run(&mut lockctl(&[
            "--url", &url, "unlock", "deploy:9", "--yes",
        ]))
        .await,
    );
    assert!(out.contains("force-unlocked lock:deploy:9"), "{out}");
    assert!(
        out.contains(&shown(guard.token())),
        "names who held it: {out}"
    );
    let exists: bool = redis::cmd("EXISTS")
        .arg("lock:deploy:9")
        .query(&mut server.connection())
        .unwrap();
    assert!(!exists);

    notices_it_is_gone(guard).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_without_yes_is_refused_when_stdin_is_not_a_terminal() {
    let server = RedisServer::start();
    let registry = Registry::from_url(&server.url()).unwrap();
    let guard = hold(&registry, "deploy:3", false).await;

    // A "y" piped in is not a person answering.
    let mut child = lockctl(&["--url", &server.url(), "unlock", "deploy:3"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        // The tool may exit before reading: a broken pipe here is fine.
        let _ = stdin.write_all(b"y\n").await;
    }
    let out = child.wait_with_output().await.unwrap();

    assert!(!out.status.success(), "stdout: {}", stdout(&out));
    assert!(
        stderr(&out).contains("refusing to force-unlock lock:deploy:3"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("--yes"), "{}", stderr(&out));
    let owner: Option<String> = redis::cmd("GET")
        .arg("lock:deploy:3")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(
        owner.as_deref(),
        Some(guard.token()),
        "the lock is untouched"
    );
}

/// Runs `lockctl args` on a pseudo-terminal (through util-linux `script`), typing `typed`.
async fn on_terminal(args: &[&str], typed: &str) -> Output {
    use tokio::io::AsyncWriteExt;
    let command_line = std::iter::once(env!("CARGO_BIN_EXE_lockctl"))
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = Command::new("script")
        .args([
            "--quiet",
            "--return",
            "--command",
            &command_line,
            "/dev/null",
        ])
        .env_remove("LOCK_REDIS_URL")
        .env_remove("LOCK_REDIS_CLUSTER")
        .env_remove("REDIS_URL")
        .env_remove("LOCK_REDIS_SENTINEL")
        .env_remove("LOCK_REDIS_SENTINEL_MASTER")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run `script` (util-linux) to give lockctl a terminal");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(typed.as_bytes()).await.unwrap();
    // Kept open until lockctl is done: `script` may end the session at end of input.
    let out = ended(child, "lockctl answered").await;
    drop(stdin);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_on_a_terminal_asks_and_only_yes_unlocks() {
    let server = RedisServer::start();
    let registry = Registry::from_url(&server.url()).unwrap();
    let guard = hold(&registry, "deploy:4", true).await;
    let url = server.url();
    let owner = || -> Option<String> {
        redis::cmd("GET")
            .arg("lock:deploy:4")
            .query(&mut server.connection())
            .unwrap()
    };

    let out = on_terminal(&["--url", &url, "unlock", "deploy:4"], "n\n").await;
    // On a terminal, lockctl's stdout and stderr both arrive on `script`'s stdout.
    let screen = stdout(&out);
    assert!(!out.status.success(), "{screen}");
    assert!(
        screen.contains("Force-unlock lock:deploy:4, held by"),
        "{screen}"
    );
    assert!(screen.contains(&shown(guard.token())), "{screen}");
    assert!(screen.contains("[y/N]"), "{screen}");
    assert!(screen.contains("still locked"), "{screen}");
    assert_eq!(owner().as_deref(), Some(guard.token()));

    let out = on_terminal(&["--url", &url, "unlock", "deploy:4"], "y\n").await;
    let screen = stdout(&out);
    assert!(out.status.success(), "{screen}");
    assert!(screen.contains("force-unlocked lock:deploy:4"), "{screen}");
    assert_eq!(owner(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_of_a_free_lock_changes_nothing() {
    let server = RedisServer::start();
    let out = succeeded(
        &run(&mut lockctl(&[
            "--url",
            &server.url(),
            "unlock",
            "deploy:0",
        ]))
        .await,
    );
    assert!(out.contains("lock:deploy:0 is not held"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_each_holder_coming_and_going() {
    let server = RedisServer::start();
    let registry = Registry::from_url(&server.url()).unwrap();
    let mut printing = Printing::spawn(lockctl(&[
        "--url",
        &server.url(),
        "watch",
        "deploy:5",
        "--every",
        "20",
    ]));

    printing.next_with("free").await;
    let guard = hold(&registry, "deploy:5", true).await;
    let taken = printing.next_with("taken by").await;
    assert!(taken.contains(&shown(guard.token())), "{taken}");
    let fence = format!("fence {}", guard.fence().unwrap());
    assert!(taken.contains(&fence), "{taken}");
    guard.release_now().await.unwrap();
    printing.next_with("released").await;

    printing.stop().await;
}

/// A throwaway Postgres server, a registry on it, and `lockctl watch <key>` looking every
/// 20 ms.
fn watching_on_postgres(key: &str) -> (PostgresServer, Registry, Printing) {
    let server = PostgresServer::start();
    let url = server.url();
    let registry = Registry::builder().postgres(&url).build().unwrap();
    let printing = Printing::spawn(lockctl(&[
        "--postgres",
        &url,
        "watch",
        key,
        "--every",
        "20",
    ]));
    (server, registry, printing)
}

/// On Postgres `watch` polls the store's row through the library: a holder coming (its owner
/// and fence), its lease renewed on the database's clock, and its release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_on_postgres_prints_a_holder_coming_renewing_and_going() {
    let (_server, registry, mut printing) = watching_on_postgres("deploy:5");

    assert!(printing
        .next()
        .await
        .starts_with("watching lock:deploy:5 every "));
    let first = printing.next().await;
    assert!(first.ends_with(" free"), "nobody holds it yet: {first}");
    let guard = registry
        .lock("deploy:5")
        // Renewed every third of it: the lease is seen growing.
        .ttl(Duration::from_secs(3))
        .fencing(true)
        .acquire()
        .await
        .unwrap();
    let taken = printing.next().await;
    assert!(taken.contains("taken by"), "{taken}");
    assert!(taken.contains(&shown(guard.token())), "{taken}");
    let fence = format!("fence {},", guard.fence().unwrap());
    assert!(taken.contains(&fence), "{taken}");
    let renewed = printing.next().await;
    assert!(renewed.contains("renewed: "), "{renewed}");
    guard.release_now().await.unwrap();
    let gone = loop {
        let line = printing.next().await;
        if !line.contains("renewed: ") {
            break line;
        }
    };
    assert!(gone.ends_with(" released"), "{gone}");

    printing.stop().await;
}

/// `watch` compares a lease with what the time between two reads left of it; a read the server
/// answers late (here: paused) must not make a lease look cut short. Found on Postgres, whose
/// answers came 0.7s late on a loaded machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_on_postgres_does_not_take_a_late_answer_for_a_lease_cut_short() {
    let (server, registry, mut printing) = watching_on_postgres("deploy:6");
    assert!(printing.next().await.starts_with("watching lock:deploy:6"));
    assert!(printing.next().await.ends_with(" free"));
    // Not renewed while the test runs: the lease only ticks down.
    let guard = hold(&registry, "deploy:6", false).await;
    let taken = printing.next().await;
    assert!(taken.contains("taken by"), "{taken}");
    // The fault, not a wait for anything: reads sent meanwhile are answered late.
    server.pause();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    guard.release_now().await.unwrap();
    let next = printing.next().await;
    assert!(
        next.ends_with(" released"),
        "only the release is a change: {next}"
    );

    printing.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_for_a_duration_ends_by_itself() {
    let server = RedisServer::start();
    let out = run(&mut lockctl(&[
        "--url",
        &server.url(),
        "watch",
        "deploy:5",
        "--for",
        "0.3",
    ]))
    .await;
    assert!(succeeded(&out).contains("free"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_deployment_configured_says_what_to_set() {
    let out = run(&mut lockctl(&["list"])).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("LOCK_REDIS_URL"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_list_scans_every_master_and_unlock_reaches_the_owning_shard() {
    let cluster = RedisCluster::start(3, 0);
    let seeds = cluster.seeds().join(",");
    let registry = Registry::builder()
        .cluster(cluster.seeds())
        .build()
        .unwrap();
    let keys: Vec<String> = (0..12).map(|i| format!("job:{i}")).collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(hold(&registry, key, true).await);
    }
    let mut masters: Vec<u16> = keys
        .iter()
        .map(|k| cluster.master_port_of(&cluster.nodes[0], &format!("lock:{k}")))
        .collect();
    masters.sort_unstable();
    masters.dedup();
    assert!(
        masters.len() > 1,
        "the keys must spread over masters to test this"
    );

    let out = succeeded(&run(&mut lockctl(&["--cluster", &seeds, "list", "job:"])).await);
    for (key, guard) in keys.iter().zip(&guards) {
        let line = row(&out, key);
        assert!(line.contains(&shown(guard.token())), "{out}");
        let fence = guard.fence().unwrap().to_string();
        assert_eq!(
            line.split_whitespace().rev().nth(1),
            Some(fence.as_str()),
            "its fence, before its queue: {out}"
        );
    }
    assert!(
        out.contains("12 locks under lock:job: on 3 masters"),
        "{out}"
    );

    // The same through the library's environment variable, then force-unlock one.
    let out = succeeded(
        &run(lockctl(&["unlock", "job:4", "--yes"]).env("LOCK_REDIS_CLUSTER", &seeds)).await,
    );
    assert!(out.contains("force-unlocked lock:job:4"), "{out}");
    let out = succeeded(&run(lockctl(&["show", "job:4"]).env("LOCK_REDIS_CLUSTER", &seeds)).await);
    assert!(out.contains("state:  free"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_list_shows_the_majority_owner_and_on_how_many_nodes_a_key_lives() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let registry = Registry::builder().redlock(urls.clone()).build().unwrap();
    let guard = hold(&registry, "pay:1", false).await;
    // An acquisition returns once a majority granted: the last node's grant may come later.
    let on_every_node = || {
        servers.iter().all(|server| {
            redis::cmd("EXISTS")
                .arg("lock:pay:1")
                .query::<bool>(&mut server.connection())
                .unwrap()
        })
    };
    lock_tests::eventually(PATIENCE, "pay:1 on every node", || {
        std::future::ready(on_every_node())
    })
    .await;
    // A leftover of a failed acquisition: present on one node only, held by nobody.
    let _: () = redis::cmd("SET")
        .arg("lock:pay:2")
        .arg("elsewhere:1:0123456789abcdef0123456789abcdef")
        .arg("PX")
        .arg(60_000)
        .query(&mut servers[0].connection())
        .unwrap();

    let nodes = urls.join(",");
    let out = succeeded(&run(&mut lockctl(&["--redlock", &nodes, "list", "pay:"])).await);
    let held = row(&out, "pay:1");
    assert!(held.contains(&shown(guard.token())), "{out}");
    assert!(held.ends_with("3/3"), "{out}");
    let minority = row(&out, "pay:2");
    assert!(minority.contains("(no majority)"), "{out}");
    assert!(minority.ends_with("1/3"), "{out}");

    // A comma list in LOCK_REDIS_URL is Redlock, as for the library.
    let out = succeeded(&run(lockctl(&["show", "pay:1"]).env("LOCK_REDIS_URL", &nodes)).await);
    assert!(out.contains(&shown(guard.token())), "{out}");
    let out = succeeded(
        &run(&mut lockctl(&[
            "--redlock",
            &nodes,
            "unlock",
            "pay:1",
            "--yes",
        ]))
        .await,
    );
    assert!(out.contains("force-unlocked lock:pay:1"), "{out}");
    let left = || {
        servers
            .iter()
            .filter(|server| {
                redis::cmd("EXISTS")
                    .arg("lock:pay:1")
                    .query::<bool>(&mut server.connection())
                    .unwrap()
            })
            .count()
    };
    // A Redlock release returns once a majority deleted; the last node's delete, sent with
    // theirs, lands just after.
    assert!(left() <= 1, "deleted on a majority when lockctl returned");
    lock_tests::eventually(PATIENCE, "deleted on every node", || async { left() == 0 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_show_count_readers_and_permits_and_unlock_refuses_them() {
    let server = RedisServer::start();
    let registry = Registry::from_url(&server.url()).unwrap();
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            registry
                .lock("gpus")
                .permits(3)
                .ttl(TTL)
                .acquire()
                .await
                .unwrap(),
        );
        let reader = registry.lock("catalog").mode(lock_runtime::Mode::Read);
        held.push(reader.ttl(TTL).acquire().await.unwrap());
    }

    let out = succeeded(&run(&mut lockctl(&["--url", &server.url(), "list", ""])).await);
    assert!(row(&out, "gpus").contains("2 of 3 permits"), "{out}");
    assert!(row(&out, "catalog").contains("2 readers"), "{out}");
    let out = succeeded(&run(&mut lockctl(&["--url", &server.url(), "show", "gpus"])).await);
    assert!(out.contains("state:  held"), "{out}");
    assert!(out.contains("owner:  2 of 3 permits"), "{out}");

    let out = run(&mut lockctl(&[
        "--url",
        &server.url(),
        "unlock",
        "catalog",
        "--yes",
    ]))
    .await;
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(stderr(&out).contains("no single owner"), "{}", stderr(&out));
    let info = registry.inspect("catalog").await.unwrap();
    assert_eq!(info.readers, Some(2), "nothing was deleted");
    for guard in held {
        guard.release().await.unwrap();
    }
}

/// Over TLS end to end: the sentinels, and the master they name, which `list` scans and
/// `show` and `unlock` reach through the library. The throwaway CA is trusted the way an
/// operator trusts a private CA, through `SSL_CERT_FILE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_reaches_the_master_that_tls_sentinels_name() {
    let deployment = RedisSentinels::start_tls();
    let registry = Registry::builder()
        .sentinel(SERVICE, deployment.urls())
        .tls_root_cert(deployment.ca_pem())
        .build()
        .unwrap();
    let guard = registry
        .lock("deploy:s")
        // Renewals at ttl/3 are how the holder finds out about the unlock; keep them frequent.
        .ttl(Duration::from_secs(3))
        .fencing(true)
        .acquire()
        .await
        .unwrap();
    let ca = std::env::temp_dir().join(format!(
        "lockctl-ca-{}-{}.pem",
        std::process::id(),
        deployment.master.port()
    ));
    std::fs::write(&ca, deployment.ca_pem()).unwrap();
    let sentinels = deployment.urls().join(",");
    let lockctl_tls = |args: &[&str]| {
        let mut command =
            lockctl(&[&["--sentinel", &sentinels, "--master-name", SERVICE], args].concat());
        command.env("SSL_CERT_FILE", &ca);
        command
    };

    let out = succeeded(&run(&mut lockctl_tls(&["list", "deploy:"])).await);
    assert!(
        row(&out, "deploy:s").contains(&shown(guard.token())),
        "{out}"
    );
    let master = format!("127.0.0.1:{}", deployment.master.port());
    assert!(
        out.contains(&format!(
            "1 lock under lock:deploy: on {master}, the master the sentinels name"
        )),
        "{out}"
    );
    let out = succeeded(&run(&mut lockctl_tls(&["show", "deploy:s"])).await);
    assert!(out.contains(&shown(guard.token())), "{out}");
    assert!(
        out.contains(&format!("fence:  {}", guard.fence().unwrap())),
        "{out}"
    );
    let out = succeeded(&run(&mut lockctl_tls(&["unlock", "deploy:s", "--yes"])).await);
    assert!(out.contains("force-unlocked lock:deploy:s"), "{out}");
    let exists: bool = redis::cmd("EXISTS")
        .arg("lock:deploy:s")
        .query(&mut deployment.master.connection())
        .unwrap();
    assert!(!exists, "deleted on the master");
    let old_fence = guard.fence().unwrap();
    notices_it_is_gone(guard).await;
    // A command under a lock on that master: its fence is the master's counter's next.
    let out = succeeded(
        &run(&mut lockctl_tls(&[
            "run",
            "deploy:s",
            "--fencing",
            "--",
            "sh",
            "-c",
            "echo \"$LOCK_FENCE\"",
        ]))
        .await,
    );
    let fence: u64 = out.trim().parse().unwrap();
    assert!(fence > old_fence, "{out}");
    let _ = std::fs::remove_file(&ca);
}

/// With the library's Sentinel variables set, lockctl follows the sentinels, never the
/// `REDIS_URL` that may name some other Redis (here, nothing at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_sentinel_environment_is_followed_before_redis_url() {
    let deployment = RedisSentinels::start();
    let registry = Registry::builder()
        .sentinel(SERVICE, deployment.urls())
        .build()
        .unwrap();
    let guard = hold(&registry, "job:sentinel", false).await;
    let out = succeeded(
        &run(lockctl(&["list"])
            .env("LOCK_REDIS_SENTINEL", deployment.urls().join(","))
            .env("LOCK_REDIS_SENTINEL_MASTER", SERVICE)
            .env("REDIS_URL", "redis://127.0.0.1:1/"))
        .await,
    );
    assert!(
        row(&out, "job:sentinel").contains(&shown(guard.token())),
        "{out}"
    );

    // Without a master name there is nothing to follow: lockctl says what to pass.
    let out = run(lockctl(&["list"])
        .env("LOCK_REDIS_SENTINEL", deployment.urls().join(","))
        .env("REDIS_URL", "redis://127.0.0.1:1/"))
    .await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--master-name"), "{}", stderr(&out));
}

#[tokio::test]
async fn a_password_comes_from_the_environment_not_the_command_line() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let with_login = format!("redis://:s3cret@127.0.0.1:{}/", server.port());
    let registry = Registry::from_url(&with_login).unwrap();
    let guard = hold(&registry, "deploy:pw", false).await;
    let url = server.url();
    let out = run(&mut lockctl(&["--url", &url, "show", "deploy:pw"])).await;
    assert!(
        !out.status.success(),
        "no password, no answer: {}",
        stdout(&out)
    );
    let out = succeeded(
        &run(lockctl(&["--url", &url, "show", "deploy:pw"]).env("LOCK_REDIS_PASSWORD", "s3cret"))
            .await,
    );
    assert!(out.contains(&shown(guard.token())), "{out}");
    assert!(!out.contains("s3cret"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_shows_who_leads_and_watch_follows_each_change() {
    let server = RedisServer::start();
    let registry = Registry::from_url(&server.url()).unwrap();
    leader_is_shown_and_followed(&["--url", &server.url()], &registry).await;
}

/// The same on Postgres: the leader read from the store's row, each change followed through
/// the library's observer (woken by `LISTEN/NOTIFY` there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_on_postgres_shows_who_leads_and_watch_follows_each_change() {
    let server = PostgresServer::start();
    let url = server.url();
    let registry = Registry::builder().postgres(&url).build().unwrap();
    leader_is_shown_and_followed(&["--postgres", &url], &registry).await;
}

/// `lockctl leader` on the deployment the flags `on` name, while candidates campaign through
/// `registry` on the same deployment: who leads and its term, then `--watch` following a
/// resignation and a new leader; a lock's key is refused.
async fn leader_is_shown_and_followed(on: &[&str], registry: &Registry) {
    let leader = |args: &[&str]| lockctl(&[on, args].concat());
    let out = succeeded(&run(&mut leader(&["leader", "scheduler"])).await);
    assert_eq!(out.trim(), "no leader");
    let election = registry.election("scheduler").ttl(TTL);
    let first = election
        .clone()
        .identity("web-1:8080")
        .campaign()
        .await
        .unwrap();
    let out = succeeded(&run(&mut leader(&["leader", "scheduler"])).await);
    let term = first.term().unwrap();
    assert!(
        out.starts_with(&format!("leader web-1:8080, term {term}, ")),
        "{out}"
    );
    assert_eq!(out.lines().count(), 1, "nobody in line: {out}");

    let mut printing = Printing::spawn(leader(&["leader", "scheduler", "--watch"]));

    assert!(printing
        .next()
        .await
        .starts_with("following the election lock:scheduler"));
    assert!(printing.next().await.contains("leader web-1:8080"));
    first.resign().await.unwrap();
    assert!(printing.next().await.ends_with("no leader"));
    let second = election
        .clone()
        .identity("web-2:8080")
        .campaign()
        .await
        .unwrap();
    let line = printing.next().await;
    let term = second.term().unwrap();
    assert!(
        line.contains(&format!("leader web-2:8080, term {term}")),
        "{line}"
    );
    printing.stop().await;

    // The candidates in line, the next first: whom the leader can hand its term to.
    let mut standbys = Vec::new();
    for identity in ["web-3:8080", "web-4:8080"] {
        standbys.push(tokio::spawn(election.clone().identity(identity).campaign()));
        queued(
            registry,
            "scheduler",
            u32::try_from(standbys.len()).unwrap(),
        )
        .await;
    }
    let out = succeeded(&run(&mut leader(&["leader", "scheduler"])).await);
    assert_eq!(
        out.lines().nth(1),
        Some("in line: web-3:8080, web-4:8080"),
        "{out}"
    );
    let out = succeeded(&run(&mut leader(&["leader", "scheduler", "--json"])).await);
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(json["leader"]["identity"], "web-2:8080", "{out}");
    assert_eq!(json["leader"]["term"], second.term().unwrap(), "{out}");
    assert!(json["leader"]["remaining_ms"].as_u64() > Some(0), "{out}");
    assert_eq!(
        json["in_line"],
        serde_json::json!(["web-3:8080", "web-4:8080"]),
        "{out}"
    );
    // One stands aside: it keeps its place, shown apart, and no hand-over can name it.
    let draining = election.clone().identity("web-4:8080");
    draining.stand_aside();
    lock_tests::eventually(PATIENCE, "web-4 stands aside", || async {
        draining.standing_aside().await.unwrap() == ["web-4:8080"]
    })
    .await;
    let out = succeeded(&run(&mut leader(&["leader", "scheduler"])).await);
    assert_eq!(
        out.lines().skip(1).collect::<Vec<_>>(),
        ["in line: web-3:8080", "standing aside: web-4:8080"],
        "{out}"
    );
    let out = succeeded(&run(&mut leader(&["leader", "scheduler", "--json"])).await);
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        json["standing_aside"],
        serde_json::json!(["web-4:8080"]),
        "{out}"
    );
    draining.rejoin();
    second.resign().await.unwrap();
    for standby in standbys {
        standby.await.unwrap().unwrap().resign().await.unwrap();
    }

    // How long the leader has led, once the store knows (on Redis, after its first renewal).
    let elected = tokio::time::Instant::now();
    let rota = registry
        .election("rota")
        .ttl(RENEWED_TTL)
        .identity("web-5:8080")
        .campaign()
        .await
        .unwrap();
    held_at_least(registry, "rota", Duration::ZERO).await;
    let out = succeeded(&run(&mut leader(&["leader", "rota"])).await);
    assert!(out.contains(", leading for "), "{out}");
    let out = succeeded(&run(&mut leader(&["leader", "rota", "--json"])).await);
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let led = json["leader"]["led_for_ms"].as_u64().expect("known");
    assert!(
        u128::from(led) <= elected.elapsed().as_millis() + 5,
        "{out}"
    );
    rota.resign().await.unwrap();

    // A lock's key is not an election's: said so, and nothing is touched.
    let held = hold(registry, "deploy:1", false).await;
    let out = run(&mut leader(&["leader", "deploy:1"])).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("held as a lock"), "{}", stderr(&out));
    held.release().await.unwrap();
}

/// A waiter queued for `key` on `registry`, in a task of its own.
fn queue_for(registry: &Registry, key: &'static str) -> tokio::task::JoinHandle<LockGuard> {
    let registry = registry.clone();
    tokio::spawn(async move {
        registry
            .lock(key)
            .ttl(TTL)
            .wait(TTL)
            .acquire()
            .await
            .expect("handed the lock in turn")
    })
}

async fn queued(registry: &Registry, key: &str, waiters: u32) {
    lock_tests::eventually(PATIENCE, "the waiters queued", || async {
        registry.inspect(key).await.unwrap().waiters == waiters
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_lists_the_queue_in_the_order_it_is_served_and_shared_holders_with_their_leases() {
    let server = RedisServer::start();
    let url = server.url();
    let registry = Registry::from_url(&url).unwrap();
    let holder = hold(&registry, "deploy", false).await;
    let first = queue_for(&registry, "deploy");
    queued(&registry, "deploy", 1).await;
    let second = queue_for(&registry, "deploy");
    queued(&registry, "deploy", 2).await;

    let out = succeeded(&run(&mut lockctl(&["--url", &url, "show", "deploy"])).await);
    let listing = succeeded(&run(&mut lockctl(&["--url", &url, "list", ""])).await);
    assert!(
        row(&listing, "deploy").ends_with(" 2"),
        "two queued: {listing}"
    );
    // Served in the order shown.
    holder.release().await.unwrap();
    let first = first.await.unwrap();
    let first_token = first.token().to_owned();
    first.release().await.unwrap();
    let second = second.await.unwrap();
    let queue = out
        .split_once("queue:  2 waiting, handed the lock in this order\n")
        .unwrap_or_else(|| panic!("{out}"))
        .1;
    let rows: Vec<&str> = queue.lines().collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(
        rows[0].trim_start().starts_with("1.") && rows[0].contains(&shown(&first_token)),
        "{out}"
    );
    assert!(
        rows[1].trim_start().starts_with("2.") && rows[1].contains(&shown(second.token())),
        "{out}"
    );
    assert!(
        rows.iter()
            .all(|r| r.contains("place ") && r.ends_with(" left")),
        "{out}"
    );
    second.release().await.unwrap();

    // Readers, each with its lease, the longest first.
    let read = |ttl| {
        registry
            .lock("catalog")
            .mode(lock_runtime::Mode::Read)
            .ttl(ttl)
            .acquire()
    };
    let long = read(TTL).await.unwrap();
    let short = read(Duration::from_secs(20)).await.unwrap();
    let out = succeeded(&run(&mut lockctl(&["--url", &url, "show", "catalog"])).await);
    let held_by = out
        .split_once("held by:\n")
        .unwrap_or_else(|| panic!("{out}"))
        .1;
    let rows: Vec<&str> = held_by.lines().collect();
    assert!(
        rows[0].contains(&shown(long.token())) && rows[0].contains("lease "),
        "{out}"
    );
    assert!(rows[1].contains(&shown(short.token())), "{out}");
}

/// A shell command for `lockctl run`.
fn sh(script: &str) -> [&str; 3] {
    ["sh", "-c", script]
}

fn lockctl_run(url: &str, options: &[&str], command: &[&str]) -> Command {
    lockctl_run_on(&["--url", url], options, command)
}

/// `lockctl run` on the deployment the flags `on` name (`["--postgres", url]`).
fn lockctl_run_on(on: &[&str], options: &[&str], command: &[&str]) -> Command {
    let mut args = on.to_vec();
    args.push("run");
    args.extend(options);
    args.push("--");
    args.extend(command);
    lockctl(&args)
}

/// `lockctl run` started in the background, its output collected for [`ended`].
fn spawn_run(url: &str, options: &[&str], command: &[&str]) -> tokio::process::Child {
    spawn_run_on(&["--url", url], options, command)
}

/// [`spawn_run`] on the deployment the flags `on` name.
fn spawn_run_on(on: &[&str], options: &[&str], command: &[&str]) -> tokio::process::Child {
    lockctl_run_on(on, options, command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lockctl run")
}

/// Its output once it exited, within `PATIENCE` (`what` says why it should end).
async fn ended(child: tokio::process::Child, what: &str) -> Output {
    tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect(what)
        .expect("wait for lockctl")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("lockctl exited by itself")
}

/// The README's once-a-day job on two machines at once: whichever cron starts first runs it,
/// and the lock is kept for the day (`--min-hold`), so the other finds it busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_on_two_machines_at_once_runs_the_daily_job_once() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = tempdir();
    let log = dir.join("ran");
    // The job runs long enough that both starts overlap it.
    let job = format!("echo \"$LOCK_KEY\" >> {}; sleep 1", log.display());
    let start = || {
        let mut command = lockctl_run(&url, &["report:daily", "--min-hold", "72000"], &sh(&job));
        async move { command.output().await }
    };
    let (a, b) = tokio::join!(start(), start());
    let (a, b) = (a.unwrap(), b.unwrap());
    let mut codes = [code(&a), code(&b)];
    codes.sort_unstable();
    assert_eq!(
        codes,
        [0, 75],
        "one ran, the other found it busy: {}{}",
        stderr(&a),
        stderr(&b)
    );
    let busy = if code(&a) == 75 { &a } else { &b };
    assert!(
        stderr(busy).contains("report:daily"),
        "names the key: {}",
        stderr(busy)
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "report:daily\n",
        "ran once"
    );
    // Kept for the day: a later start finds it busy too, and the job did not run again.
    let later = run(&mut lockctl_run(&url, &["report:daily"], &sh(&job))).await;
    assert_eq!(code(&later), 75, "{}", stderr(&later));
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "report:daily\n");
    let left = server.pttl("lock:report:daily");
    assert!(
        left > 72_000_000 - 60_000,
        "kept for the min-hold: {left} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exits_with_the_commands_status_and_gives_it_the_key_and_fence() {
    let server = RedisServer::start();
    let url = server.url();
    let registry = Registry::from_url(&url).unwrap();
    let out = run(&mut lockctl_run(
        &url,
        &["deploy:7", "--fencing", "--min-hold", "600"],
        &sh("echo \"$LOCK_KEY $LOCK_FENCE\"; exit 3"),
    ))
    .await;
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    let (key, fence) = stdout(&out)
        .trim()
        .split_once(' ')
        .map(|(k, f)| (k.to_owned(), f.to_owned()))
        .unwrap();
    assert_eq!(key, "deploy:7");
    let info = registry.inspect("deploy:7").await.unwrap();
    assert_eq!(
        info.fence.map(|f| f.to_string()),
        Some(fence),
        "the fence it was given"
    );
    // A failed job releases at once, whatever --min-hold says: another may retry.
    assert_eq!(info.owner, None);

    // Killed by a signal: 128 + its number, as shells say.
    let out = run(&mut lockctl_run(&url, &["deploy:7"], &sh("kill -USR1 $$"))).await;
    assert_eq!(code(&out), 128 + 10);
    // Not found, not executable.
    let out = run(&mut lockctl_run(&url, &["deploy:7"], &["/nonexistent/job"])).await;
    assert_eq!(code(&out), 127, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/nonexistent/job: not found"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        registry.inspect("deploy:7").await.unwrap().owner,
        None,
        "released"
    );
    // Unreachable Redis, and a bad option the library refuses.
    let nowhere = format!("redis://127.0.0.1:{}/", lock_tests::free_port());
    let out = run(&mut lockctl_run(&nowhere, &["deploy:7"], &["true"])).await;
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    let out = run(&mut lockctl_run(
        &url,
        &["deploy:7", "--permits", "0"],
        &["true"],
    ))
    .await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

/// A lost lease stops the job: SIGTERM to its whole process group, then SIGKILL after the
/// grace period for a job that ignores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_stops_the_job_when_the_lease_is_lost() {
    let server = RedisServer::start();
    let url = server.url();
    let registry = Registry::from_url(&url).unwrap();
    let dir = tempdir();
    let started = dir.join("started");
    // A job that ignores SIGTERM, with a child of its own in the group.
    let job = format!(
        "trap '' TERM; sleep 300 & echo $! > {}; wait",
        started.display()
    );
    let child = spawn_run(&url, &["job", "--ttl", "1", "--grace", "0.5"], &sh(&job));
    lock_tests::eventually(PATIENCE, "the job started", || async {
        std::fs::read_to_string(&started).is_ok_and(|pid| pid.ends_with('\n'))
    })
    .await;
    let sleeper: u32 = std::fs::read_to_string(&started)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // An operator takes the lock away; lockctl learns it at its next renewal.
    assert!(registry.force_unlock("job").await.unwrap());
    let out = ended(child, "lockctl ends once the job is stopped").await;
    assert_eq!(code(&out), 79, "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("lost the lock `job`")
            && said.contains("SIGTERM")
            && said.contains("SIGKILL"),
        "{said}"
    );
    // The job's own child was in the group, and is gone too.
    lock_tests::eventually(PATIENCE, "the job's child was killed", || async {
        !std::path::Path::new(&format!("/proc/{sleeper}")).exists()
            || std::fs::read_to_string(format!("/proc/{sleeper}/stat"))
                .is_ok_and(|s| s.contains(") Z "))
    })
    .await;
}

/// The daily job on two machines at once, on Postgres: both start together, the one that takes
/// the lock runs the job (its key and fence in its environment) while the other finds it busy,
/// and `--min-hold` keeps the row for the day, so a later start is busy too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_on_postgres_runs_the_daily_job_once_with_its_key_and_fence() {
    let server = PostgresServer::start();
    let url = server.url();
    let on = ["--postgres", url.as_str()];
    let registry = Registry::builder().postgres(&url).build().unwrap();
    let dir = tempdir();
    let (log, go) = (dir.join("ran"), dir.join("go"));
    // The job holds on until told: both starts overlap it, whichever comes second.
    let job = format!(
        "echo \"$LOCK_KEY $LOCK_FENCE\" >> {}; until [ -e {} ]; do sleep 0.05; done",
        log.display(),
        go.display()
    );
    let options = ["report:daily", "--fencing", "--min-hold", "72000"];
    let start = || {
        ended(
            spawn_run_on(&on, &options, &sh(&job)),
            "one run ends busy, the other once its job is let go",
        )
    };
    let (a, b) = (Box::pin(start()), Box::pin(start()));
    // The job waits for `go`: the first to end is the one that did not run it.
    let (busy, running) = match futures_util::future::select(a, b).await {
        futures_util::future::Either::Left(ended) | futures_util::future::Either::Right(ended) => {
            ended
        }
    };
    assert_eq!(code(&busy), 75, "{}", stderr(&busy));
    assert!(
        stderr(&busy).contains("report:daily"),
        "names the key: {}",
        stderr(&busy)
    );
    std::fs::write(&go, "").unwrap();
    let ran = running.await;
    assert_eq!(code(&ran), 0, "{}", stderr(&ran));
    let logged = std::fs::read_to_string(&log).unwrap();
    let info = registry.inspect("report:daily").await.unwrap();
    let fence = info.fence.expect("a fenced lock has a fence");
    assert_eq!(
        logged,
        format!("report:daily {fence}\n"),
        "ran once, with its key and the fence it holds"
    );
    assert!(info.owner.is_some(), "kept after the job: {info:?}");
    let left = info.remaining.expect("a lease");
    assert!(
        left > Duration::from_secs(72_000 - 60),
        "kept for the min-hold: {left:?}"
    );
    // A later start finds it busy, and the job does not run again.
    let later = run(&mut lockctl_run_on(&on, &["report:daily"], &sh(&job))).await;
    assert_eq!(code(&later), 75, "{}", stderr(&later));
    assert_eq!(std::fs::read_to_string(&log).unwrap(), logged);
    // An unreachable Postgres: unavailable, and the job does not run.
    let nowhere = format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        lock_tests::free_port()
    );
    let out = run(&mut lockctl_run_on(
        &["--postgres", &nowhere],
        &["report:daily"],
        &sh(&job),
    ))
    .await;
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&log).unwrap(), logged);
}

/// On Postgres, an operator's `lockctl unlock --yes` takes the lock from a `lockctl run`: the
/// job, which ignores SIGTERM, is killed after the grace period, its child with it, and
/// `lockctl run` exits 79.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_on_postgres_stops_the_job_when_the_lock_is_force_unlocked() {
    let server = PostgresServer::start();
    let url = server.url();
    let on = ["--postgres", url.as_str()];
    let dir = tempdir();
    let pids = dir.join("pids");
    // A job that ignores SIGTERM, with a child of its own in the group.
    let job = format!(
        "trap '' TERM; sleep 300 & echo $! > {}; wait",
        pids.display()
    );
    let child = spawn_run_on(&on, &["job", "--ttl", "1", "--grace", "0.5"], &sh(&job));
    let sleeper = pids_written(&pids, 1).await;
    let out = succeeded(
        &run(&mut lockctl(
            &[&on[..], &["unlock", "job", "--yes"]].concat(),
        ))
        .await,
    );
    assert!(out.contains("force-unlocked lock:job"), "{out}");
    let out = ended(child, "lockctl ends once the job is stopped").await;
    assert_eq!(code(&out), 79, "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("lost the lock `job`")
            && said.contains("SIGTERM")
            && said.contains("SIGKILL"),
        "{said}"
    );
    assert_all_dead(
        &sleeper,
        "the job's child when lockctl exited after the loss",
    );
}

/// A job that ended after its lease did (here lockctl itself was stopped, so nothing renewed
/// it) may have overlapped the next holder: reported lost, not with the job's own status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_reports_a_job_that_ended_after_its_lease_as_lost() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = tempdir();
    let (started, done) = (dir.join("started"), dir.join("done"));
    let job = format!(
        "touch {}; sleep 1; touch {}",
        started.display(),
        done.display()
    );
    let child = spawn_run(&url, &["job", "--ttl", "1"], &sh(&job));
    let pid = child.id().unwrap();
    lock_tests::eventually(PATIENCE, "the job started", || async { started.exists() }).await;
    lock_tests::signal(pid, "STOP");
    lock_tests::eventually(PATIENCE, "the job ended and the key expired", || async {
        done.exists() && server.pttl("lock:job") == -2
    })
    .await;
    lock_tests::signal(pid, "CONT");
    let out = ended(child, "lockctl ends once continued").await;
    assert_eq!(code(&out), 79, "{}", stderr(&out));
}

/// A signal sent to lockctl reaches the job once; the job's end releases the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_passes_signals_on_to_the_job_and_releases_when_it_ends() {
    let server = RedisServer::start();
    let url = server.url();
    let registry = Registry::from_url(&url).unwrap();
    let dir = tempdir();
    let (ready, got) = (dir.join("ready"), dir.join("got"));
    let job = format!(
        "trap 'echo term >> {got}; exit 5' TERM; touch {ready}; while :; do sleep 0.05; done",
        got = got.display(),
        ready = ready.display()
    );
    let child = spawn_run(&url, &["job"], &sh(&job));
    lock_tests::eventually(PATIENCE, "the job started", || async { ready.exists() }).await;
    assert!(
        registry.inspect("job").await.unwrap().owner.is_some(),
        "held while the job runs"
    );
    lock_tests::signal(child.id().unwrap(), "TERM");
    let out = ended(child, "the job ends on the signal it was passed").await;
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&got).unwrap(),
        "term\n",
        "the job got it"
    );
    assert_eq!(
        registry.inspect("job").await.unwrap().owner,
        None,
        "released"
    );
}

/// A fresh directory under the target dir, for a test's files.
fn tempdir() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "lockctl-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The state letter in `/proc/<pid>/stat` (`None` once the process is gone).
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ...`: the command name may hold spaces and parentheses.
    stat.rfind(')')
        .and_then(|end| stat[end + 1..].trim_start().chars().next())
}

/// Dead: gone from `/proc`, or a zombie nobody has reaped yet.
fn dead(pid: u32) -> bool {
    matches!(state(pid), None | Some('Z' | 'X'))
}

/// The pids a job wrote to `path`, one a line, once `count` of them are there.
async fn pids_written(path: &std::path::Path, count: usize) -> Vec<u32> {
    lock_tests::eventually(PATIENCE, "the job wrote its pids", || async {
        std::fs::read_to_string(path).is_ok_and(|s| s.lines().count() >= count && s.ends_with('\n'))
    })
    .await;
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| line.trim().parse().expect("a pid"))
        .collect()
}

/// Fails if any of `pids` still lives, after killing those that do (no stray process outlives
/// a failed test).
fn assert_all_dead(pids: &[u32], what: &str) {
    let alive: Vec<u32> = pids.iter().copied().filter(|&pid| !dead(pid)).collect();
    for &pid in &alive {
        lock_tests::signal(pid, "KILL");
    }
    assert!(alive.is_empty(), "{what}: {alive:?} still alive");
}

/// The job is its whole process tree: a background worker left in its process group and one
/// that left it (`setsid`, orphaned by a subshell) keep the lock held after the command itself
/// has exited, so that a second run waits for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_holds_the_lock_until_every_process_of_the_job_has_ended() {
    let server = RedisServer::start();
    let url = server.url();
    let registry = Registry::from_url(&url).unwrap();
    let dir = tempdir();
    let (go, log, shell) = (dir.join("go"), dir.join("log"), dir.join("shell"));
    let worker = |name: &str| {
        format!(
            "until [ -e {go} ]; do sleep 0.05; done; echo {name} >> {log}",
            go = go.display(),
            log = log.display()
        )
    };
    let job = format!(
        "({in_group}) & (setsid sh -c '{detached}' &); echo $$ > {shell}; exit 0",
        in_group = worker("in-group"),
        detached = worker("detached"),
        shell = shell.display()
    );
    let first = spawn_run(&url, &["job:bg", "--ttl", "5"], &sh(&job));
    let shell_pid = pids_written(&shell, 1).await[0];
    lock_tests::eventually(PATIENCE, "the command itself exited", || async {
        dead(shell_pid)
    })
    .await;

    let second_job = format!("echo second >> {}", log.display());
    let second = spawn_run(&url, &["job:bg", "--wait", "60"], &sh(&second_job));
    lock_tests::eventually(PATIENCE, "the second run queued, or ran", || async {
        std::fs::read_to_string(&log).is_ok_and(|s| s.contains("second"))
            || registry.inspect("job:bg").await.unwrap().waiters == 1
    })
    .await;
    std::fs::write(&go, "").unwrap();

    let out = ended(first, "lockctl ends once its workers have").await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = ended(
        second,
        "the second run gets the lock once the first lets go",
    )
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 3, "both workers and the second run: {lines:?}");
    assert_eq!(
        lines[2], "second",
        "the second run ran only after the first job's workers ended: {lines:?}"
    );
}

/// After a loss, lockctl exits only once every process of the job is dead: processes that
/// ignore SIGTERM, in the job's process group or outside it, are killed after `--grace`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_after_a_loss_kills_every_process_of_the_job_before_it_exits() {
    let server = RedisServer::start();
    let url = server.url();
    let registry = Registry::from_url(&url).unwrap();
    let dir = tempdir();
    let pids = dir.join("pids");
    let stubborn = format!(
        "trap \"\" TERM; echo $$ >> {}; exec sleep 300 >/dev/null 2>&1",
        pids.display()
    );
    // Not holding lockctl's output open: its end is seen as soon as it comes.
    let job = format!("sh -c '{stubborn}' & setsid sh -c '{stubborn}' & wait");
    let child = spawn_run(&url, &["job", "--ttl", "1", "--grace", "0.5"], &sh(&job));
    let stubborn = pids_written(&pids, 2).await;
    assert!(registry.force_unlock("job").await.unwrap());
    let out = ended(child, "lockctl ends once the job is stopped").await;
    assert_eq!(code(&out), 79, "{}", stderr(&out));
    assert_all_dead(&stubborn, "when lockctl exited after the loss");
}

/// `lockctl` killed with SIGKILL (no chance to pass anything on) takes its command with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_killed_takes_its_command_with_it() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = tempdir();
    let pid = dir.join("pid");
    // Not holding lockctl's output open: its end is seen as soon as it comes.
    let job = format!(
        "echo $$ > {}; exec sleep 300 >/dev/null 2>&1",
        pid.display()
    );
    let child = spawn_run(&url, &["job"], &sh(&job));
    let command = pids_written(&pid, 1).await[0];
    lock_tests::signal(child.id().unwrap(), "KILL");
    ended(child, "lockctl dies of SIGKILL").await;
    let died = tokio::time::timeout(PATIENCE, async {
        while !dead(command) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_all_dead(&[command], "the command after lockctl was killed");
    assert!(died.is_ok());
}

/// Ctrl-Z (SIGTSTP) must not stop lockctl while its job runs (its renewals would stop, the job
/// would not): refused, with a word on stderr; SIGTTIN and SIGTTOU do not stop it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_to_stop_on_ctrl_z_while_its_job_runs() {
    let server = RedisServer::start();
    let url = server.url();
    let registry = Registry::from_url(&url).unwrap();
    let dir = tempdir();
    let (ready, go) = (dir.join("ready"), dir.join("go"));
    let job = format!(
        "touch {}; until [ -e {} ]; do sleep 0.05; done",
        ready.display(),
        go.display()
    );
    let mut child = spawn_run(&url, &["job"], &sh(&job));
    let pid = child.id().unwrap();
    let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let said = said.clone();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut said = said.lock().unwrap();
                said.push_str(&line);
                said.push('\n');
            }
        })
    };
    lock_tests::eventually(PATIENCE, "the job started", || async { ready.exists() }).await;

    lock_tests::signal(pid, "TSTP");
    lock_tests::eventually(
        PATIENCE,
        "lockctl stopped, or said it would not",
        || async { state(pid) == Some('T') || said.lock().unwrap().contains("SIGTSTP") },
    )
    .await;
    let stopped = state(pid) == Some('T');
    if stopped {
        lock_tests::signal(pid, "CONT");
    }
    assert!(!stopped, "lockctl stopped on SIGTSTP");
    lock_tests::signal(pid, "TTIN");
    lock_tests::signal(pid, "TTOU");
    std::fs::write(&go, "").unwrap();
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("lockctl ends with its job: not stopped by SIGTTIN or SIGTTOU")
        .unwrap();
    reader.await.unwrap();
    let said = said.lock().unwrap().clone();
    assert_eq!(status.code(), Some(0), "{said}");
    assert!(said.contains("SIGTSTP"), "{said}");
    assert_eq!(
        registry.inspect("job").await.unwrap().owner,
        None,
        "released"
    );
}

/// A command that reads from (or sets up) the terminal stops in the background, where lockctl
/// runs it; lockctl says so, ends it and releases instead of renewing the lock forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_ends_a_job_that_stops_to_use_the_terminal() {
    let server = RedisServer::start();
    let url = server.url();
    let registry = Registry::from_url(&url).unwrap();
    for (command, said) in [
        (
            &["cat"][..],
            "cannot read from the terminal; redirect its input",
        ),
        (&["stty", "sane"], "cannot change the terminal's settings"),
    ] {
        let mut args = vec!["--url", &url, "run", "tty:job", "--"];
        args.extend(command);
        let out = on_terminal(&args, "").await;
        let screen = stdout(&out);
        assert_eq!(out.status.code(), Some(66), "{command:?}: {screen}");
        assert!(screen.contains(said), "{command:?}: {screen}");
        assert_eq!(
            registry.inspect("tty:job").await.unwrap().owner,
            None,
            "released"
        );
    }
}

/// LOCK_REDIS_PASSWORD, and a Redis URL variable that carries a password, are lockctl's
/// credentials: not in the job's environment unless `--pass-credentials` asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_keeps_its_credentials_from_the_job_unless_asked() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let url = server.url();
    let with_login = format!("redis://:s3cret@127.0.0.1:{}/", server.port());
    let plain = "redis://127.0.0.1:1/";
    let show =
        sh("echo \"${LOCK_REDIS_PASSWORD-unset} ${REDIS_URL-unset} ${LOCK_REDIS_CLUSTER-unset}\"");
    let start = |options: &[&str]| {
        let mut command = lockctl_run(&url, options, &show);
        command
            .env("LOCK_REDIS_PASSWORD", "s3cret")
            .env("REDIS_URL", &with_login)
            .env("LOCK_REDIS_CLUSTER", plain);
        command
    };
    let out = run(&mut start(&["pw:job"])).await;
    assert_eq!(
        stdout(&out).trim(),
        format!("unset unset {plain}"),
        "{}",
        stderr(&out)
    );
    let out = run(&mut start(&["pw:job", "--pass-credentials"])).await;
    assert_eq!(
        stdout(&out).trim(),
        format!("s3cret {with_login} {plain}"),
        "{}",
        stderr(&out)
    );
}

/// `lockctl` signals the job's process group, whose number is the command's pid; once the
/// command has ended and the group is empty (the job's other processes left it), that number
/// may be a new process group's, anybody's. A loss then stops the job without signalling that
/// group. Run in a PID namespace of its own (`unshare`), where the test recycles the pid at once
/// (`ns_last_pid`) and touches no other process on the machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_never_signals_a_process_group_that_took_the_ended_commands_number() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = tempdir();
    let script = r#"
set -u
"$LOCKCTL" --url "$URL" run job:reused --ttl 1 --grace 0.5 -- sh -c \
  'echo $$ > "$DIR/cmd"; setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$DIR/daemon"; exit 0' \
  2>"$DIR/err" &
LP=$!
until [ -s "$DIR/daemon" ]; do sleep 0.05; done
P=$(cat "$DIR/cmd")
while [ -e /proc/$P ]; do sleep 0.05; done
echo $((P - 1)) > /proc/sys/kernel/ns_last_pid
setsid sleep 300 </dev/null >/dev/null 2>&1 &
V=$!
[ "$V" = "$P" ] || { echo "the pid was not recycled: $V, not $P"; kill -9 $V "$(cat "$DIR/daemon")"; exit 2; }
"$LOCKCTL" --url "$URL" unlock job:reused --yes >/dev/null
wait $LP
echo "lockctl exited $?"
if [ "$(awk '{print $3}' /proc/$V/stat)" = S ]; then echo "group $V: alive"; kill $V; else echo "group $V: signalled"; fi
"#;
    let out = Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "sh",
            "-c",
            script,
        ])
        .env("LOCKCTL", env!("CARGO_BIN_EXE_lockctl"))
        .env("URL", &url)
        .env("DIR", &dir)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PATIENCE, out)
        .await
        .expect("the script ends")
        .expect("unshare runs (user and PID namespaces)");
    let said = stdout(&out);
    let err = std::fs::read_to_string(dir.join("err")).unwrap_or_default();
    assert!(
        said.contains("lockctl exited 79"),
        "{said}{}\nlockctl: {err}",
        stderr(&out)
    );
    assert!(
        said.contains(": alive"),
        "lockctl's SIGTERM reached a process group that took the ended command's pid:\n{said}\
         lockctl: {err}"
    );
}

/// `lockctl run .. 2>&1 | head -1`, once `head` has exited: `lockctl`'s stderr is a pipe nobody
/// reads. Its messages fail, and it goes on holding (renewing) the lock for the job's processes
/// that outlive the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_its_stderr_gone_still_holds_the_lock_for_the_job() {
    let server = RedisServer::start();
    let url = server.url();
    let registry = Registry::from_url(&url).unwrap();
    let dir = tempdir();
    let (go, shell) = (dir.join("go"), dir.join("shell"));
    let job = format!(
        "setsid sh -c 'until [ -e {go} ]; do sleep 0.05; done' </dev/null >/dev/null 2>&1 & \
         echo $$ > {shell}; exit 0",
        go = go.display(),
        shell = shell.display()
    );
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut first = lockctl_run(&url, &["job:stderr", "--ttl", "1"], &sh(&job))
        .stdout(Stdio::null())
        .stderr(writer)
        .spawn()
        .expect("start lockctl run");
    let shell_pid = pids_written(&shell, 1).await[0];
    lock_tests::eventually(PATIENCE, "the command itself exited", || async {
        dead(shell_pid)
    })
    .await;
    // Renewed (its lease back up) while the job's worker runs, or let go of.
    let seen = registry.inspect("job:stderr").await.unwrap().remaining;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let renewed = loop {
        let info = registry.inspect("job:stderr").await.unwrap();
        match (info.owner, info.remaining) {
            (None, _) => break false,
            (Some(_), Some(left)) if seen.is_some_and(|seen| left > seen) => break true,
            _ => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "neither renewed nor gone"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    std::fs::write(&go, "").unwrap();
    let status = tokio::time::timeout(PATIENCE, first.wait())
        .await
        .expect("lockctl ends once its worker has")
        .unwrap();
    assert!(
        renewed,
        "the lock was let go of while the job's worker ran (lockctl: {status})"
    );
}

/// What an operator asks during an incident, one command each, on Redis: every lock one owner
/// holds (by process, or by a candidate's identity), the longest queues, and the same as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_finds_one_owners_locks_and_the_longest_queues() {
    let server = RedisServer::start();
    let registry = Registry::from_url(&server.url()).unwrap();
    incident_questions(&["--url", &server.url()], &registry).await;
}

/// The same on Postgres, whose `list` reads the store's table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_on_postgres_finds_one_owners_locks_and_the_longest_queues() {
    let server = PostgresServer::start();
    let url = server.url();
    let registry = Registry::builder().postgres(&url).build().unwrap();
    incident_questions(&["--postgres", &url], &registry).await;
}

/// Until the store shows that `key`'s owner has held it for at least `least`.
async fn held_at_least(registry: &Registry, key: &str, least: Duration) {
    lock_tests::eventually(PATIENCE, &format!("{key} held {least:?}"), || async {
        registry
            .inspect(key)
            .await
            .unwrap()
            .held_for
            .is_some_and(|held| held >= least)
    })
    .await;
}

/// The keys of a `list` table's rows, in order.
fn listed(listing: &str) -> Vec<&str> {
    let mut lines = listing.lines();
    assert!(
        lines.next().is_some_and(|h| h.starts_with("KEY")),
        "{listing}"
    );
    lines
        .take_while(|l| !l.contains(" under "))
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

/// Whether `text` holds 32 hex digits in a row: the random part of a token, which must never be
/// shown whole.
fn has_a_whole_token(text: &str) -> bool {
    text.as_bytes()
        .split(|b| !b.is_ascii_hexdigit())
        .any(|run| run.len() >= 32)
}

async fn incident_questions(on: &[&str], registry: &Registry) {
    let list = |args: &[&str]| lockctl(&[on, &["list"], args].concat());
    let first = hold(registry, "deploy:1", true).await;
    let second = hold(registry, "deploy:2", false).await;
    let leader = registry
        .election("scheduler")
        .ttl(TTL)
        .identity("web-9")
        .campaign()
        .await
        .unwrap();
    // Another process's lock: a job under `lockctl run`.
    let mut job = lockctl(&[on, &["run", "job:nightly", "--", "sleep", "600"]].concat());
    let job = job.stdout(Stdio::null()).spawn().unwrap();
    let job_pid = job.id().unwrap();
    lock_tests::eventually(PATIENCE, "the job holds its lock", || async {
        registry
            .inspect("job:nightly")
            .await
            .unwrap()
            .owner
            .is_some()
    })
    .await;
    // Queued one after the other, so that they are served in the order awaited below.
    let mut waiters = Vec::new();
    for (key, queued_then) in [("deploy:1", 1), ("deploy:1", 2), ("deploy:2", 1)] {
        waiters.push(queue_for(registry, key));
        queued(registry, key, queued_then).await;
    }

    let host = lock_runtime::protocol::TokenOwner::parse(first.token())
        .unwrap()
        .host
        .to_owned();
    let ours = format!("{host}:{}", std::process::id());
    let out = succeeded(&run(&mut list(&["--owner", &ours])).await);
    assert_eq!(listed(&out), ["deploy:1", "deploy:2", "scheduler"], "{out}");
    assert!(
        out.contains(&format!("3 locks held by {ours} under lock:")),
        "{out}"
    );
    let theirs = format!("{host}:{job_pid}");
    let out = succeeded(&run(&mut list(&["--owner", &theirs])).await);
    assert_eq!(listed(&out), ["job:nightly"], "{out}");
    let out = succeeded(&run(&mut list(&["--owner", "web-9"])).await);
    assert_eq!(
        listed(&out),
        ["scheduler"],
        "by the candidate's identity: {out}"
    );
    // An owner as `list` shows it, copied from its OWNER column.
    let out = succeeded(&run(&mut list(&["--owner", &shown(second.token())])).await);
    assert_eq!(listed(&out), ["deploy:2"], "{out}");
    let out = succeeded(&run(&mut list(&["--owner", "web-8"])).await);
    assert_eq!(out.trim(), "no locks held by web-8 under lock:", "{out}");

    let out = succeeded(&run(&mut list(&["--queued"])).await);
    assert_eq!(
        listed(&out),
        ["deploy:1", "deploy:2"],
        "the longest first: {out}"
    );
    assert!(row(&out, "deploy:1").ends_with(" 2"), "{out}");
    let out = succeeded(&run(&mut list(&["--queued", "--top", "1"])).await);
    assert_eq!(listed(&out), ["deploy:1"], "{out}");

    // The oldest holders: one lock taken a second before another, each shown with its time
    // held once the store knows it (on Redis, after the holder's first renewal). The second
    // is far more than two reads' answers can differ by under load.
    let early = registry
        .lock("shift:early")
        .ttl(RENEWED_TTL)
        .acquire()
        .await
        .unwrap();
    held_at_least(registry, "shift:early", Duration::from_secs(1)).await;
    let late = registry
        .lock("shift:late")
        .ttl(RENEWED_TTL)
        .acquire()
        .await
        .unwrap();
    held_at_least(registry, "shift:late", Duration::ZERO).await;
    let oldest = |args: &[&str]| list(&[&["shift:", "--oldest"], args].concat());
    let out = succeeded(&run(&mut oldest(&[])).await);
    assert_eq!(listed(&out), ["shift:early", "shift:late"], "{out}");
    assert!(
        out.contains("2 locks whose time held is known under lock:shift:"),
        "{out}"
    );
    let out = succeeded(&run(&mut oldest(&["--top", "1"])).await);
    assert_eq!(listed(&out), ["shift:early"], "{out}");
    let out = succeeded(&run(&mut oldest(&["--json"])).await);
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let held: Vec<u64> = json["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["held_for_ms"].as_u64().expect("known"))
        .collect();
    assert!(held.len() == 2 && held[0] >= held[1], "{out}");
    let out = run(&mut oldest(&["--queued"])).await;
    assert!(!out.status.success(), "one order at a time");
    early.release().await.unwrap();
    late.release().await.unwrap();

    let out = succeeded(&run(&mut list(&["--owner", "web-9", "--json"])).await);
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let locks = json["locks"].as_array().expect("locks");
    assert_eq!(locks.len(), 1, "{out}");
    assert_eq!(locks[0]["key"], "scheduler", "{out}");
    assert_eq!(locks[0]["owner"]["identity"], "web-9", "{out}");
    assert_eq!(locks[0]["owner"]["host"], host.as_str(), "{out}");
    assert_eq!(locks[0]["owner"]["pid"], std::process::id(), "{out}");
    assert_eq!(locks[0]["fence"], leader.term().unwrap(), "{out}");
    assert!(!has_a_whole_token(&out), "never a whole token: {out}");
    let out = succeeded(&run(&mut list(&["--queued", "--json"])).await);
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let waiting: Vec<_> = json["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["key"].as_str().unwrap(), l["waiters"].as_u64().unwrap()))
        .collect();
    assert_eq!(waiting, [("deploy:1", 2), ("deploy:2", 1)], "{out}");
    assert_eq!(json["locks"][0]["queue"].as_array().map(Vec::len), Some(2));

    let out = succeeded(
        &run(&mut lockctl(
            &[on, &["show", "deploy:1", "--json"]].concat(),
        ))
        .await,
    );
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(json["state"], "held", "{out}");
    assert_eq!(json["fence"], first.fence().unwrap(), "{out}");
    assert_eq!(json["owner"]["shown"], shown(first.token()), "{out}");
    assert!(json["remaining_ms"].as_u64() > Some(0), "{out}");

    drop(job);
    first.release().await.unwrap();
    second.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap().release().await.unwrap();
    }
    leader.resign().await.unwrap();
}
