//! What only the Postgres store offers: a lock checked inside the application's own
//! transaction (`TransactionCheck`), against a throwaway cluster each test starts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockGuard, LostReason, Registry, TransactionCheck};
use lock_tests::postgres::PostgresServer;
use lock_tests::proxy::Proxy;
use lock_tests::{assert_lost, eventually};

const LIMIT: Duration = Duration::from_secs(20);

/// Creates the role `app`, which may use the schema's tables but not change the schema, and
/// returns a maker of registries that log in as it.
fn app_registries(server: &PostgresServer) -> impl Fn() -> Registry + '_ {
    server.psql(
        "CREATE ROLE app LOGIN; \
         GRANT USAGE ON SCHEMA distributed_lock TO app; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA distributed_lock TO app; \
         GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA distributed_lock TO app",
    );
    move || {
        Registry::builder()
            .postgres(server.url().replace("postgres@", "app@"))
            .build()
            .expect("a registry on Postgres")
    }
}

/// The application's own connection to the database.
async fn app(server: &PostgresServer) -> tokio_postgres::Client {
    lock_tests::postgres::connect(&server.url()).await
}

fn registry(server: &PostgresServer) -> Registry {
    Registry::builder()
        .postgres(server.url())
        .build()
        .expect("a registry on Postgres")
}

/// A registry that has connected and made its schema, so that a short lease taken next is
/// timed from a statement alone (a first attempt's lease also counts the connecting).
async fn connected(server: &PostgresServer) -> Registry {
    let registry = registry(server);
    registry.inspect("warm").await.expect("connects");
    registry
}

/// A holder whose lease ran out before its transaction checked the lock (stopped past its
/// lease, as by a pause) cannot commit: the next holder's write stands alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_past_its_lease_cannot_commit_its_transaction() {
    let server = PostgresServer::start();
    server.psql("CREATE TABLE ledger (holder text NOT NULL)");
    let (a, b) = (connected(&server).await, registry(&server));
    let first = a
        .lock("invoice:7")
        .ttl(Duration::from_millis(1000))
        .renew(false)
        .acquire()
        .await
        .expect("a free lock");
    let check = first.transaction_check().expect("a Postgres lock checks");
    let mut app_a = app(&server).await;
    let tx_a = app_a.transaction().await.expect("begin");
    tx_a.execute("INSERT INTO ledger VALUES ('a')", &[])
        .await
        .expect("write");
    // The first holder stalls here past its lease; the next one takes the lock and commits.
    assert_lost(&first.lost().await, LostReason::NotRenewed);
    let next = b.lock("invoice:7").wait(LIMIT).acquire().await;
    let next = next.expect("free once the lease ran out");
    let mut app_b = app(&server).await;
    let tx_b = app_b.transaction().await.expect("begin");
    tx_b.execute("INSERT INTO ledger VALUES ('b')", &[])
        .await
        .expect("write");
    check_in(&tx_b, &next).await;
    tx_b.commit().await.expect("the holder commits");

    let refused = tx_a
        .execute(
            TransactionCheck::STATEMENT,
            &[&check.keys(), &check.token()],
        )
        .await
        .expect_err("a holder past its lease is refused");
    assert_eq!(
        refused.code().map(|c| c.code()),
        Some("55000"),
        "{refused:?}"
    );
    let message = refused.as_db_error().map(|e| e.message().to_owned());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("lock:invoice:7")),
        "names the lock: {message:?}"
    );
    // Postgres answers a COMMIT of a failed transaction with a rollback: nothing of it stays.
    let _ = tx_a.commit().await;
    assert_eq!(
        server.psql("SELECT string_agg(holder, ',') FROM ledger"),
        "b"
    );
    next.release().await.expect("release");
    drop(first);
}

/// A transaction that checked its lock while it was held keeps the next holder out until it
/// ends, even once the lease ran out: its commit comes before anything the next holder does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_that_checked_its_lock_holds_off_the_next_holder_until_it_ends() {
    let server = PostgresServer::start();
    server.psql("CREATE TABLE ledger (n serial, holder text NOT NULL)");
    let (a, b) = (connected(&server).await, registry(&server));
    // Connected first: the check below must come within the lease, on a loaded machine too.
    let mut app_a = app(&server).await;
    let tx_a = app_a.transaction().await.expect("begin");
    let first = a
        .lock("invoice:8")
        .ttl(Duration::from_millis(2000))
        .renew(false)
        .acquire()
        .await
        .expect("a free lock");
    let check = first.transaction_check().expect("checks");
    tx_a.execute(
        TransactionCheck::STATEMENT,
        &[&check.keys(), &check.token()],
    )
    .await
    .expect("held: the check passes");
    tx_a.execute("INSERT INTO ledger (holder) VALUES ('a')", &[])
        .await
        .expect("write");
    assert_lost(&first.lost().await, LostReason::NotRenewed);

    let committed = Arc::new(AtomicBool::new(false));
    let next = tokio::spawn({
        let (b, committed) = (b.clone(), committed.clone());
        async move {
            let guard = b.lock("invoice:8").wait(LIMIT).acquire().await;
            let guard = guard.expect("the next holder gets the lock");
            (guard, committed.load(Ordering::SeqCst))
        }
    });
    // The next holder's attempt is held up by the first transaction's hold on the lease row:
    // it waits for that transaction to end.
    eventually(LIMIT, "an attempt waits for the lease row", || async {
        assert!(
            !next.is_finished(),
            "the next holder got in while the row was held"
        );
        server
            .psql("SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'")
            != "0"
    })
    .await;
    committed.store(true, Ordering::SeqCst);
    tx_a.commit()
        .await
        .expect("the checked transaction commits");
    let (guard, after_commit) = next.await.expect("task");
    assert!(
        after_commit,
        "the next holder got the lock before the commit"
    );
    guard.release().await.expect("release");
    drop(first);
}

/// Other stores offer no transaction check; a Postgres guard's never shows its token.
#[tokio::test]
async fn only_a_postgres_lock_checks_transactions_and_its_check_hides_the_token() {
    let memory = Registry::in_memory();
    let held = memory.lock("job").acquire().await.expect("free");
    assert!(held.transaction_check().is_none());
    held.release().await.expect("release");

    let server = PostgresServer::start();
    let registry = registry(&server);
    let held = registry.lock("job").acquire().await.expect("free");
    let check = held.transaction_check().expect("checks");
    assert_eq!(check.keys(), ["lock:job"]);
    let shown = format!("{check:?}");
    assert!(!shown.contains(held.token()), "{shown}");
    held.release().await.expect("release");
}

/// What the workers saw: sections whose bodies overlapped here, commits and refusals.
#[derive(Default)]
struct Board {
    inside: std::sync::atomic::AtomicUsize,
    most_inside: std::sync::atomic::AtomicUsize,
    committed: std::sync::atomic::AtomicUsize,
    refused: std::sync::atomic::AtomicUsize,
}

/// One body inside, for as long as it lives (a cancelled body leaves when it is dropped).
struct Inside<'a>(&'a Board);

impl<'a> Inside<'a> {
    fn enter(board: &'a Board) -> Self {
        let now = board.inside.fetch_add(1, Ordering::SeqCst) + 1;
        board.most_inside.fetch_max(now, Ordering::SeqCst);
        Self(board)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One fenced section: reads the register's last fence, writes the next row, checks the lock
/// inside the transaction and commits. Every step may fail while a fault is on.
async fn section(registry: &Registry, url: &str, board: &Board, who: &str) {
    let request = registry
        .lock("register")
        .ttl(Duration::from_millis(1000))
        .fencing(true)
        .wait(Duration::from_secs(3));
    let outcome = request
        .run(async {
            let _inside = Inside::enter(board);
            let held = lock_runtime::current().expect("inside the body");
            let (fence, check) = (held.fence().expect("fenced"), held.transaction_check());
            let check = check.expect("a Postgres lock");
            let Ok((mut app, connection)) =
                tokio_postgres::connect(url, tokio_postgres::NoTls).await
            else {
                return Ok::<_, lock_runtime::LockError>(());
            };
            tokio::spawn(connection);
            let Ok(tx) = app.transaction().await else {
                return Ok(());
            };
            let fence = i64::try_from(fence).expect("a fence fits");
            let written = async {
                tx.execute(
                    "INSERT INTO register (fence, holder) VALUES ($1, $2)",
                    &[&fence, &who],
                )
                .await?;
                tx.execute(
                    TransactionCheck::STATEMENT,
                    &[&check.keys(), &check.token()],
                )
                .await?;
                tx.commit().await
            };
            match tokio::time::timeout(Duration::from_secs(2), written).await {
                Ok(Ok(())) => board.committed.fetch_add(1, Ordering::SeqCst),
                Ok(Err(e)) if e.code().is_some_and(|c| c.code() == "55000") => {
                    board.refused.fetch_add(1, Ordering::SeqCst)
                }
                _ => 0,
            };
            Ok(())
        })
        .await;
    drop(outcome);
}

/// The fault workload's promise on Postgres: one body at a time, and the register's committed
/// rows in rising fence order, through the server killed with -9 and restarted, paused
/// (`SIGSTOP`), every client connection cut, and a statement hung on the leases' table, each
/// twice; after each fault the lock is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_holder_at_a_time_through_kills_pauses_cut_connections_and_a_hung_statement() {
    let server = Arc::new(PostgresServer::start());
    server.psql("CREATE TABLE register (n serial PRIMARY KEY, fence bigint NOT NULL, holder text)");
    let url = server.url();
    let board = Arc::new(Board::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..4 {
        // A registry each: four processes, as far as the database can tell.
        let (registry, url, board, stop) =
            (registry(&server), url.clone(), board.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let who = format!("w{w}");
            while !stop.load(Ordering::SeqCst) {
                section(&registry, &url, &board, &who).await;
            }
        }));
    }
    let progress = |after: usize, what: &'static str| {
        let board = board.clone();
        async move {
            eventually(Duration::from_secs(60), what, || async {
                board.committed.load(Ordering::SeqCst) >= after + 5
            })
            .await;
        }
    };
    progress(0, "sections commit before any fault").await;
    type Fault = Arc<dyn Fn(&PostgresServer) + Send + Sync>;
    let faults: [(&str, Fault); 4] = [
        (
            "kill -9 and restart",
            Arc::new(PostgresServer::kill_and_restart),
        ),
        (
            "paused 3 s",
            Arc::new(|s: &PostgresServer| {
                s.pause();
                std::thread::sleep(Duration::from_secs(3));
                s.resume();
            }),
        ),
        (
            "every client connection cut",
            Arc::new(PostgresServer::terminate_clients),
        ),
        (
            "the leases' table locked 3 s",
            Arc::new(|s: &PostgresServer| {
                s.psql(
                    "BEGIN; LOCK TABLE distributed_lock.holders IN ACCESS EXCLUSIVE MODE; \
                     SELECT pg_sleep(3); COMMIT;",
                );
            }),
        ),
    ];
    // Each fault twice, the second time on a database that has been through all of them.
    for (what, fault) in faults.iter().chain(faults.iter()) {
        let before = board.committed.load(Ordering::SeqCst);
        let (s, fault) = (server.clone(), fault.clone());
        tokio::task::spawn_blocking(move || fault(&s))
            .await
            .expect("the fault");
        eprintln!("fault: {what}; {} sections committed before it", before);
        progress(before, "sections commit after the fault").await;
    }
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.expect("worker");
    }
    let most = board.most_inside.load(Ordering::SeqCst);
    assert_eq!(most, 1, "{most} bodies inside at once");
    let fences = server.psql("SELECT string_agg(fence::text, ',' ORDER BY n) FROM register");
    let fences: Vec<u64> = fences
        .split(',')
        .map(|f| f.parse().expect("a fence"))
        .collect();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "committed fences rise with every holder: {fences:?}"
    );
    eprintln!(
        "{} sections committed, {} refused by the transaction check",
        board.committed.load(Ordering::SeqCst),
        board.refused.load(Ordering::SeqCst)
    );
}

/// Through PgBouncer in transaction mode (statements) with waiters listening on the database
/// itself: exclusion with rising fences from two registries, a waiter handed the lock by the
/// release and woken at once, and the transaction check inside an application's transaction
/// that also goes through the pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_locks_through_pgbouncer_in_transaction_mode() {
    let server = PostgresServer::start();
    let bouncer = lock_tests::postgres::PgBouncer::transaction_mode(&server);
    let pooled = || {
        Registry::builder()
            .postgres_pooled(bouncer.url(), server.url())
            .build()
            .expect("a registry behind the pooler")
    };
    let (a, b) = (pooled(), pooled());
    let mut last = 0;
    for registry in [&a, &b, &a, &b] {
        let guard = registry.lock("invoice").fencing(true).acquire().await;
        let guard = guard.expect("a free lock");
        assert!(registry
            .lock("invoice")
            .acquire()
            .await
            .unwrap_err()
            .is_busy());
        let fence = guard.fence().expect("fenced");
        assert!(fence > last, "{fence} after {last}");
        last = fence;
        guard.release().await.expect("release");
    }

    let held = a.lock("queue").ttl(Duration::from_secs(30)).acquire().await;
    let held = held.expect("a free lock");
    let waiter = tokio::spawn(b.lock("queue").wait(LIMIT).acquire());
    eventually(LIMIT, "the waiter queued and listens", || async {
        a.inspect("queue").await.expect("inspect").waiters == 1 && server.listeners() == 1
    })
    .await;
    let released = std::time::Instant::now();
    held.release().await.expect("release");
    let next = waiter.await.expect("task").expect("handed over");
    assert!(
        released.elapsed() < LIMIT / 4,
        "woken by the release, not by its lease's end"
    );

    // The application's own connection goes through the pooler too.
    let mut app = lock_tests::postgres::connect(&bouncer.url()).await;
    let tx = app.transaction().await.expect("begin");
    let check = next.transaction_check().expect("checks");
    tx.execute(
        TransactionCheck::STATEMENT,
        &[&check.keys(), &check.token()],
    )
    .await
    .expect("held: the check passes through the pooler");
    tx.commit().await.expect("commit");
    next.release().await.expect("release");
}

/// What the library warned of, across the process (its listener warns from its I/O thread).
fn warnings() -> Arc<std::sync::Mutex<Vec<String>>> {
    use tracing_subscriber::layer::SubscriberExt;
    static SEEN: std::sync::OnceLock<Arc<std::sync::Mutex<Vec<String>>>> =
        std::sync::OnceLock::new();
    SEEN.get_or_init(|| {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let layer = Warnings(seen.clone());
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("the only subscriber of this test binary");
        seen
    })
    .clone()
}

struct Warnings(Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={value:?} ", field.name()));
            }
        }
        if *event.metadata().level() == tracing::Level::WARN {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            self.0.lock().expect("warnings").push(fields.0);
        }
    }
}

/// A listening session that cannot `LISTEN` (here a role without the schema; a hot standby
/// refuses it too) leaves the waiters polling: the listener connects again after a growing
/// pause, not at once (which would also wake every waiter each time), and warns once, naming
/// the node. The waiter still gets the lock when it is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_cannot_listen_backs_off_and_says_so() {
    let warnings = warnings();
    let server = PostgresServer::start_with("-c log_connections=on");
    server.psql("CREATE ROLE nobody LOGIN");
    let holder = connected(&server).await;
    let waiting = Registry::builder()
        .postgres_pooled(server.url(), server.url().replace("postgres@", "nobody@"))
        .build()
        .expect("a registry");
    let held = holder
        .lock("k")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await;
    let held = held.expect("a free lock");
    let waiter = tokio::spawn(waiting.lock("k").wait(LIMIT).acquire());
    let listener = "user=nobody";
    eventually(LIMIT, "the listener connected", || async {
        server.log_lines_with(listener) >= 1
    })
    .await;
    // Two seconds of the listener trying: pauses from 5 ms doubling to at most 1 s allow
    // about 9 connections, connecting at once hundreds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    held.release().await.expect("release");
    let next = waiter.await.expect("task");
    next.expect("the waiter polls its way to the lock")
        .release()
        .await
        .expect("release");
    let connections = server.log_lines_with(listener);
    assert!(
        connections <= 15,
        "the listener connected {connections} times in about 2 s"
    );
    let warned: Vec<String> = warnings
        .lock()
        .expect("warnings")
        .iter()
        .filter(|w| w.contains("LISTEN") && w.contains(&format!("127.0.0.1:{}", server.port())))
        .cloned()
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("permission denied"), "{warned:?}");
}

/// Longer than anything below waits for: a missed notification costs a waiter a third of its
/// own ttl (its queue place is kept that often) or the holder's lease, whichever comes first.
const LONG: Duration = Duration::from_secs(60);

/// How long a waiter may take, after the release, to get a lock whose release it should have
/// been told of (or, where no notification can come, found by polling: at most 1 s apart).
const HAND_OVER: Duration = Duration::from_secs(5);

/// How long the reconnections are counted.
const WINDOW: Duration = Duration::from_secs(4);

/// The statement of a lock attempt (the holder's and the waiter's).
const ATTEMPT: &str = "distributed_lock.acquire(";

/// A registry whose statements go to `server` directly and whose listener connects to
/// `listen_url`.
fn listening_at(server: &PostgresServer, listen_url: String) -> Registry {
    Registry::builder()
        .postgres_pooled(server.url(), listen_url)
        .build()
        .expect("a registry")
}

fn proxied_url(proxy: &Proxy) -> String {
    format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port())
}

/// Ends the session that listens (the one whose last statement was the store's `LISTEN`).
fn terminate_listener(server: &PostgresServer) -> u64 {
    server
        .psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE query LIKE 'SELECT distributed_lock.listen(%' AND pid <> pg_backend_pid()",
        )
        .parse()
        .expect("a count")
}

/// Lock attempts running on the server now.
fn attempts_running(server: &PostgresServer) -> u64 {
    server
        .psql(
            "SELECT count(*) FROM pg_stat_activity WHERE state <> 'idle' \
             AND query LIKE '%distributed_lock.acquire(%' AND pid <> pg_backend_pid()",
        )
        .parse()
        .expect("a count")
}

/// Waits until a waiter has made its attempts up to `attempts` logged lock attempts in all
/// (holder's included) and none is running: it is waiting for a notification now.
async fn waiting_after(server: &PostgresServer, attempts: u64) {
    eventually(LIMIT, "the waiter waits", || async {
        server.statements_with(ATTEMPT) >= attempts && attempts_running(server) == 0
    })
    .await;
}

/// `holder` holds `k` for a minute, and a waiter of `waiting` waits for it, its listener
/// listening: the guard, and the waiter's task.
async fn waiting_for_k(
    server: &PostgresServer,
    holder: &Registry,
    waiting: &Registry,
) -> (
    lock_runtime::LockGuard,
    tokio::task::JoinHandle<Result<lock_runtime::LockGuard, lock_runtime::LockError>>,
) {
    let held = holder.lock("k").ttl(LONG).acquire().await;
    let held = held.expect("a free lock");
    let waiter = tokio::spawn(waiting.lock("k").ttl(LONG).wait(LONG).acquire());
    eventually(LIMIT, "the listener listens", || async {
        server.listeners() == 1
    })
    .await;
    // The holder's attempt, the waiter's first and the one after its channel was followed.
    waiting_after(server, 3).await;
    (held, waiter)
}

/// The waiter gets the lock within [`HAND_OVER`] of its release at `released_at`, else `what`
/// failed.
async fn handed_over_soon(
    mut waiter: tokio::task::JoinHandle<Result<lock_runtime::LockGuard, lock_runtime::LockError>>,
    released_at: tokio::time::Instant,
    what: &str,
) {
    let Ok(got) = tokio::time::timeout(HAND_OVER, &mut waiter).await else {
        let late = waiter.await.expect("task").map(|_| ());
        panic!(
            "not so: {what}; it got the lock {:?} after the release ({late:?})",
            released_at.elapsed()
        );
    };
    let next = got.expect("task").expect("the lock");
    next.release().await.expect("release");
}

/// The listener's warnings that name `node`.
fn warned_about(warnings: &std::sync::Mutex<Vec<String>>, node: &str) -> Vec<String> {
    warnings
        .lock()
        .expect("warnings")
        .iter()
        .filter(|w| w.contains("LISTEN") && w.contains(node))
        .cloned()
        .collect()
}

/// A listener that lost its session wakes every waiter, for what it may have missed, once its
/// new session listens, not before: a release between a waiter woken earlier and that `LISTEN`
/// would be told to nobody, and the waiter, relying on notifications, would wait out a third of
/// its ttl (or the holder's lease) for a free lock (found by the attack on the listener; 20 s
/// here). The `LISTEN` is held back by a proxy over the waiter's chance to try and the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_a_reconnected_listener_is_not_yet_listening_wakes_the_waiter() {
    let server = PostgresServer::start_logging();
    let proxy = Proxy::start(server.port());
    let holder = connected(&server).await;
    // A command timeout long enough that the held LISTEN is not given up on meanwhile.
    let waiting = Registry::builder()
        .postgres_pooled(server.url(), proxied_url(&proxy))
        .command_timeout(Duration::from_secs(15))
        .build()
        .expect("a registry");
    let (held, waiter) = waiting_for_k(&server, &holder, &waiting).await;

    let listen = b"distributed_lock.listen(";
    proxy.hold_requests_from(listen);
    let before = server.statements_with(ATTEMPT);
    assert_eq!(terminate_listener(&server), 1);
    // The listener connected again (through the proxy) and sent its LISTEN, held there.
    tokio::time::timeout(LIMIT, proxy.held_at_least(listen, 1))
        .await
        .expect("the listener connected again and sent LISTEN");
    // A listener that wakes its waiters before it listens has woken this one by now: it tries
    // again, finds the lock taken, and waits for the release's notification. (One that wakes
    // them once it listens has not: nothing comes, and the release follows all the same.)
    let woken = tokio::time::timeout(Duration::from_secs(1), waiting_after(&server, before + 1))
        .await
        .is_ok();

    held.release().await.expect("release");
    let released_at = tokio::time::Instant::now();
    proxy.release_requests();
    let what = format!("the waiter (woken before the LISTEN: {woken}) was told of the release");
    handed_over_soon(waiter, released_at, &what).await;
}

/// The listen endpoint goes away (a session-mode pooler down, say) while the statements still
/// work: the listener warns that waiters poll until it can listen, and a waiter it followed
/// before is told so, and polls its way to a lock released meanwhile (before, it kept relying on
/// notifications and waited out a third of its ttl: 20 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_the_listen_endpoint_is_down_is_found_by_polling() {
    let warnings = warnings();
    let server = PostgresServer::start_logging();
    let proxy = Proxy::start(server.port());
    let node = format!("127.0.0.1:{}", proxy.port());
    let holder = connected(&server).await;
    let waiting = listening_at(&server, proxied_url(&proxy));
    let (held, waiter) = waiting_for_k(&server, &holder, &waiting).await;

    // The listen endpoint is gone: its session reset, new connections refused.
    drop(proxy);
    eventually(
        LIMIT,
        "the listener warned that it cannot listen",
        || async { !warned_about(&warnings, &node).is_empty() },
    )
    .await;

    held.release().await.expect("release");
    let released_at = tokio::time::Instant::now();
    let what = format!(
        "the waiter was told of the release or polled for it (the listener warned {:?})",
        warned_about(&warnings, &node)
    );
    handed_over_soon(waiter, released_at, &what).await;
}

/// A server that ends the listening session soon after its `LISTEN` (here the listening
/// role's `idle_session_timeout`; a firewall or pooler that closes idle connections, or a
/// job that ends idle sessions, does the same). Each session listened, which once started the
/// pauses over: the listener connected again at once, every time, waking every waiter each
/// time. Four seconds of it, counted in the server's log.
async fn sessions_closed_at_once(
    window: Duration,
) -> (PostgresServer, u64, u64, tokio::task::JoinHandle<()>) {
    let server = PostgresServer::start_with("-c log_connections=on -c log_statement=all");
    let holder = connected(&server).await;
    server.psql("CREATE ROLE listener LOGIN");
    server.psql("GRANT USAGE ON SCHEMA distributed_lock TO listener");
    server.psql("ALTER ROLE listener SET idle_session_timeout = '50ms'");
    let waiting = listening_at(&server, server.url().replace("postgres@", "listener@"));
    let held = holder
        .lock("k")
        .ttl(LONG)
        .acquire()
        .await
        .expect("a free lock");
    let waiter = tokio::spawn(waiting.lock("k").ttl(LONG).wait(LONG).acquire());
    let listener = "user=listener";
    eventually(LIMIT, "the listener connected", || async {
        server.log_lines_with(listener) >= 1
    })
    .await;
    waiting_after(&server, 3).await;
    let (connections, attempts) = (
        server.log_lines_with(listener),
        server.statements_with(ATTEMPT),
    );
    tokio::time::sleep(window).await;
    let connections = server.log_lines_with(listener) - connections;
    let attempts = server.statements_with(ATTEMPT) - attempts;
    let finish = tokio::spawn(async move {
        held.release().await.expect("release");
        let next = waiter.await.expect("task").expect("the lock");
        next.release().await.expect("release");
        drop(waiting);
    });
    (server, connections, attempts, finish)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_whose_sessions_are_closed_at_once_backs_off_and_wakes_its_waiter_once_a_turn() {
    let (server, connections, attempts, finish) = sessions_closed_at_once(WINDOW).await;
    finish.await.expect("the waiter gets the lock");
    drop(server);
    // Pauses from 10 ms doubling to 1 s allow about 10 connections in 4 s (connecting again
    // at once, about 40); each wakes the one waiter of a lock nobody released once, for what it
    // may have missed (about 40 tries when each lost session also sent it polling).
    assert!(
        connections <= 15,
        "the listener connected {connections} times in {WINDOW:?}"
    );
    assert!(
        attempts <= 15,
        "a waiter of a lock nobody released tried {attempts} times in {WINDOW:?} (the \
         listener connected {connections} times)"
    );
}

/// A lock survives a crash of a server that commits asynchronously (as the test servers do,
/// `synchronous_commit=off`): the store's own transactions commit synchronously, so a granted
/// lease (and the fencing sequence behind it) is never lost with the WAL buffers. Found by the
/// attack on the store: with the server's setting, the next caller got the lock, with the same
/// fencing token, while the first still held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_lock_survives_a_crash_of_a_server_that_commits_asynchronously() {
    let server = PostgresServer::start();
    assert_eq!(server.psql("SHOW synchronous_commit"), "off");
    let (a, b) = (registry(&server), registry(&server));
    let held = a
        .lock("crash")
        .ttl(Duration::from_secs(60))
        .fencing(true)
        .acquire()
        .await
        .expect("a free lock");
    server.kill_and_restart();
    let err = b.lock("crash").acquire().await.unwrap_err();
    assert!(err.is_busy(), "the lease survived the crash: {err:?}");
    let info = b.inspect("crash").await.expect("inspect");
    assert_eq!(info.owner.as_deref(), Some(held.token()));
    let before = held.fence();
    held.release().await.expect("still the holder's");
    let next = b.lock("crash").fencing(true).acquire().await.expect("free");
    assert!(next.fence() > before, "{:?} after {before:?}", next.fence());
    next.release().await.expect("release");
}

/// Takes and releases a free lock: the schema is made on first use.
async fn lock_once(registry: &Registry) {
    registry
        .lock("k")
        .acquire()
        .await
        .expect("free")
        .release()
        .await
        .expect("release");
}

/// A schema that disappeared (dropped by an operator, lost in a restore) is made again at the
/// next attempt, not refused for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_that_disappeared_is_made_again() {
    let server = PostgresServer::start();
    let a = registry(&server);
    lock_once(&a).await;
    server.psql("DROP SCHEMA distributed_lock CASCADE");
    let again = a.lock("k").wait(LIMIT).acquire().await;
    again
        .expect("the schema made again")
        .release()
        .await
        .expect("release");
    assert_eq!(
        server.psql("SELECT max(version) FROM distributed_lock.schema_version"),
        "1"
    );
}

/// A schema made by a library from before elections handed over by name (no `release_to`):
/// a registry whose role may adds the function, and hands over by name; one whose role may
/// not (it can only use the schema) still leads and steps down, its hand-over going to the
/// next candidate in line. Likewise without `stand_aside`, whose candidate leaves the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_without_hand_over_by_name_or_standing_aside_gains_them_or_does_without() {
    let server = PostgresServer::start();
    lock_once(&registry(&server)).await;
    let has_release_to = || {
        server.psql(
            "SELECT to_regprocedure('distributed_lock.release_to(text, text, text, text)') \
             IS NOT NULL",
        )
    };
    let drop_release_to = "DROP FUNCTION distributed_lock.release_to(text, text, text, text)";
    server.psql(drop_release_to);
    assert_eq!(has_release_to(), "f");
    // A new registry of the owner finds it missing, and adds it.
    handed_over(&registry(&server), &registry(&server), "a", true).await;
    assert_eq!(has_release_to(), "t");

    // A role that can use the schema but not change it.
    server.psql(drop_release_to);
    let app = app_registries(&server);
    handed_over(&app(), &app(), "b", false).await;
    assert_eq!(has_release_to(), "f", "the role could not add it");

    // Nor `stand_aside`: a candidate standing aside leaves the line instead, and is not elected
    // until it rejoins.
    server.psql(
        "DROP FUNCTION distributed_lock.stand_aside(text, text, text, bigint, boolean, integer)",
    );
    let (leader, other) = (app(), app());
    let leading = leader.election("c").identity("leader").campaign().await;
    let leading = leading.expect("elected alone");
    let draining = other.election("c").identity("draining");
    let standing = tokio::spawn(draining.campaign());
    queued(&leader, "c", 1).await;
    draining.stand_aside();
    queued(&leader, "c", 0).await;
    leading.resign().await.expect("resign");
    assert_eq!(draining.leader().await.expect("look"), None);
    draining.rejoin();
    let elected = tokio::time::timeout(LIMIT, standing)
        .await
        .expect("elected in time once it rejoins")
        .expect("task")
        .expect("elected");
    assert_eq!(elected.identity(), "draining");
}

/// `leader` leads the election `key`, `first` then `second` (on `others`) queue, and the
/// leader hands over to the second: which leads next says whether the store named it
/// (`by_name`) or served the line in order.
async fn handed_over(leader: &Registry, others: &Registry, key: &str, by_name: bool) {
    let election = leader.election(key).identity("leader");
    // Held by hand: nothing resigns it but the hand-over, when its short grace has passed.
    let _held = election.campaign().await.expect("elected alone");
    let first = tokio::spawn(others.election(key).identity("first").campaign());
    queued(leader, key, 1).await;
    let second = tokio::spawn(others.election(key).identity("second").campaign());
    queued(leader, key, 2).await;
    let ended = election
        .hand_over("second", Duration::from_millis(100))
        .await
        .expect("hand over")
        .expect("it led");
    assert_eq!(ended.to_successor, by_name, "{ended:?}");
    let (next, passed) = if by_name {
        (second, first)
    } else {
        (first, second)
    };
    let next = tokio::time::timeout(LIMIT, next)
        .await
        .expect("elected in time")
        .expect("task")
        .expect("elected");
    assert!(!passed.is_finished(), "the other waits on");
    next.resign().await.expect("resign");
    let last = tokio::time::timeout(LIMIT, passed)
        .await
        .expect("elected in time")
        .expect("task")
        .expect("elected");
    last.resign().await.expect("resign");
}

/// What the tests of `held_for` allow between the server's reading of how long a lock has been
/// held and the test's own: the server rounds milliseconds up, and reads its wall clock, not
/// the test's monotonic one.
const SLACK: Duration = Duration::from_millis(5);

/// How long the owner of `key` has held it, as `inspect` tells (the owner checked).
async fn held_for(registry: &Registry, key: &str, owner: &str) -> Option<Duration> {
    let info = registry.inspect(key).await.expect("inspect");
    assert_eq!(info.owner.as_deref(), Some(owner), "{key}: {info:?}");
    info.held_for
}

/// `inspect` tells how long the owner has held a lock: from its acquire on, growing, kept
/// through the library's renewals; nothing for a free lock or one held shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_tells_how_long_the_owner_has_held_the_lock_through_its_renewals() {
    let server = PostgresServer::start_logging();
    let registry = connected(&server).await;
    assert_eq!(
        registry.inspect("held").await.expect("inspect").held_for,
        None
    );
    let asked = std::time::Instant::now();
    let held = registry
        .lock("held")
        .ttl(Duration::from_millis(900))
        .acquire()
        .await;
    let held = held.expect("a free lock");
    let taken = std::time::Instant::now();
    let first = held_for(&registry, "held", held.token()).await;
    let first = first.expect("known from the acquire on");
    let bound = asked.elapsed();
    assert!(first <= bound + SLACK, "{first:?}, asked for {bound:?} ago");

    // Two renewals by the library (a third of the ttl apart): neither starts it over.
    let renew = "distributed_lock.renew(";
    let renewals = server.statements_with(renew);
    eventually(LIMIT, "the holder renewed twice", || async {
        server.statements_with(renew) >= renewals + 2
    })
    .await;
    let renewed = taken.elapsed();
    let second = held_for(&registry, "held", held.token()).await;
    let second = second.expect("still known");
    let bound = asked.elapsed();
    assert!(second >= first, "{second:?} after {first:?}");
    assert!(
        second + SLACK >= renewed && second <= bound + SLACK,
        "{second:?}: taken {renewed:?} before the renewals were seen, asked for {bound:?} ago"
    );
    held.release().await.expect("release");
    assert_eq!(
        registry.inspect("held").await.expect("inspect").held_for,
        None
    );

    let read = registry
        .lock("shared")
        .mode(lock_runtime::Mode::Read)
        .acquire();
    let read = read.await.expect("a free lock");
    let info = registry.inspect("shared").await.expect("inspect");
    assert_eq!((info.readers, info.held_for), (Some(1), None), "{info:?}");
    read.release().await.expect("release");
}

/// A lock handed over to its waiter is held by the waiter from the hand-over on, not from when
/// the first owner took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handed_over_is_held_by_its_new_owner_from_the_hand_over_on() {
    let server = PostgresServer::start();
    let (a, b) = (connected(&server).await, connected(&server).await);
    let held = a
        .lock("handed")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await;
    let held = held.expect("a free lock");
    let waiter = tokio::spawn(b.lock("handed").wait(LIMIT).acquire());
    queued(&a, "handed", 1).await;
    // The first owner holds on a while (only for time to pass): a new owner's time counted
    // from its acquire would show at least this much.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let first = held_for(&a, "handed", held.token()).await.expect("known");
    assert!(first + SLACK >= Duration::from_secs(1), "{first:?}");
    let released = std::time::Instant::now();
    held.release().await.expect("release");
    let next = tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("handed over in time")
        .expect("task")
        .expect("handed over");
    let handed = held_for(&b, "handed", next.token()).await;
    let handed = handed.expect("known from the hand-over on");
    let bound = released.elapsed();
    assert!(
        handed <= bound + SLACK,
        "{handed:?}, released {bound:?} ago (the first owner had held it {first:?} by then)"
    );
    next.release().await.expect("release");
}

/// A holder asking for its lock again (an attempt retried after its answer was lost) and its
/// renewals, both through the store's functions, keep when it took the lock (and its fence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asking_again_and_renewing_keep_how_long_the_owner_has_held_the_lock() {
    let server = PostgresServer::start();
    let registry = connected(&server).await;
    let held = registry
        .lock("again")
        .ttl(Duration::from_secs(60))
        .renew(false)
        .fencing(true)
        .acquire()
        .await
        .expect("a free lock");
    let taken = std::time::Instant::now();
    // Only for time to pass: an owner's time started over would show less.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = taken.elapsed();
    let check = held.transaction_check().expect("checks");
    let (key, token) = (&check.keys()[0], check.token());
    let fence = i64::try_from(held.fence().expect("fenced")).expect("fits");
    let client = app(&server).await;
    let again = client
        .query_one(
            "SELECT acquired, fence FROM distributed_lock.acquire($1, $2, \
             (SELECT tenure FROM distributed_lock.holders WHERE key = $1 AND token = $2), \
             60000, true, false, 1, '', 2147483647)",
            &[key, &token],
        )
        .await
        .expect("acquire again");
    assert!(again.get::<_, bool>(0), "the holder's own lock");
    assert_eq!(
        again.get::<_, Option<i64>>(1),
        Some(fence),
        "its fence kept"
    );
    let renewed = client
        .query_one(
            "SELECT distributed_lock.renew(ARRAY[$1::text], ARRAY[$2::text], \
             ARRAY[60000::bigint], ARRAY[$3::bigint])",
            &[key, &token, &fence],
        )
        .await
        .expect("renew");
    assert_eq!(renewed.get::<_, Vec<String>>(0), ["yes"]);
    let after = held_for(&registry, "again", held.token())
        .await
        .expect("known");
    assert!(
        after + SLACK >= before,
        "{after:?}, taken {before:?} before it asked again and renewed"
    );
    held.release().await.expect("release");
}

/// Whether the schema has `held_since` and its holders the `since` column.
fn has_held_since(server: &PostgresServer) -> String {
    server.psql(
        "SELECT to_regprocedure('distributed_lock.held_since(text)') IS NOT NULL \
         AND EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'distributed_lock.holders'::regclass \
         AND attname = 'since' AND NOT attisdropped)",
    )
}

/// A schema made before `held_since`, as far as this library can tell.
const WITHOUT_HELD_SINCE: &str = "DROP FUNCTION distributed_lock.held_since(text); \
     ALTER TABLE distributed_lock.holders DROP COLUMN since";

/// Runs `guard`'s `TransactionCheck` in `tx`, which then keeps the lock's row (and its table
/// from an `ALTER`) until it ends.
async fn check_in(tx: &tokio_postgres::Transaction<'_>, guard: &LockGuard) {
    let check = guard.transaction_check().expect("checks");
    tx.execute(
        TransactionCheck::STATEMENT,
        &[&check.keys(), &check.token()],
    )
    .await
    .expect("held: the check passes");
}

/// A schema as a library from before `held_since` left it, on a server of its own (named as
/// warnings name it), with `key` held for a minute by the registry returned, taken before.
async fn held_before_held_since(key: &str) -> (PostgresServer, String, Registry, LockGuard) {
    let server = PostgresServer::start();
    let node = format!("127.0.0.1:{}", server.port());
    let first = connected(&server).await;
    let held = first.lock(key).ttl(Duration::from_secs(60)).acquire().await;
    let held = held.expect("a free lock");
    server.psql(WITHOUT_HELD_SINCE);
    assert_eq!(has_held_since(&server), "f");
    (server, node, first, held)
}

/// The library's warnings that name `node` and the time a lock has been held.
fn warned_of_held_for(warnings: &std::sync::Mutex<Vec<String>>, node: &str) -> Vec<String> {
    warnings
        .lock()
        .expect("warnings")
        .iter()
        .filter(|w| w.contains("--oldest") && w.contains(node))
        .cloned()
        .collect()
}

/// A schema made by a library from before `held_since`: a registry whose role may adds it
/// (a lock held from before shows no time, one taken since does); one whose role may not
/// shows none, says so once, and locks, waits and hands over all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_without_held_since_gains_it_or_does_without() {
    let warnings = warnings();
    let (server, node, _first, old) = held_before_held_since("old").await;

    // A new registry of the owner finds it missing, and adds it.
    let owner = registry(&server);
    let new = owner.lock("new").acquire().await.expect("a free lock");
    assert_eq!(has_held_since(&server), "t");
    let known = held_for(&owner, "new", new.token()).await;
    assert!(known.is_some_and(|d| d < LIMIT), "{known:?}");
    assert_eq!(
        held_for(&owner, "old", old.token()).await,
        None,
        "taken before"
    );
    new.release().await.expect("release");
    old.release().await.expect("release");
    assert!(warned_of_held_for(&warnings, &node).is_empty());

    // A role that can use the schema but not change it.
    server.psql(WITHOUT_HELD_SINCE);
    let app = app_registries(&server);
    let (a, b) = (app(), app());
    let held = a
        .lock("k")
        .ttl(Duration::from_secs(60))
        .fencing(true)
        .acquire();
    let held = held.await.expect("a free lock");
    assert_eq!(held_for(&a, "k", held.token()).await, None);
    let waiter = tokio::spawn(b.lock("k").fencing(true).wait(LIMIT).acquire());
    queued(&a, "k", 1).await;
    let fence = held.fence();
    held.release().await.expect("release");
    let next = tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("handed over in time")
        .expect("task")
        .expect("handed over");
    assert!(next.fence() > fence, "{:?} after {fence:?}", next.fence());
    assert_eq!(held_for(&b, "k", next.token()).await, None);
    next.release().await.expect("release");
    assert_eq!(has_held_since(&server), "f", "the role could not add it");
    let warned = warned_of_held_for(&warnings, &node);
    // One per registry that found it missing and could not add it.
    assert_eq!(warned.len(), 2, "{warned:?}");
    assert!(warned[0].contains("permission denied"), "{warned:?}");
}

/// Adding `since` to the holders' table waits for that table's lock, which an application's
/// transaction that checked its lock (`hold`) keeps until it ends, and meanwhile holds up every
/// lock statement behind it: it gives up after a second, and the registry does without. The
/// next registry, once the transaction ended, adds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_held_since_waits_at_most_a_second_behind_an_application_transaction() {
    let warnings = warnings();
    let (server, node, _first, held) = held_before_held_since("busy").await;
    let mut app_client = app(&server).await;
    let tx = app_client.transaction().await.expect("begin");
    check_in(&tx, &held).await;

    // Without a bound its schema check would wait for the transaction past its own timeout,
    // and fail this call.
    let late = registry(&server);
    let began = std::time::Instant::now();
    let info = tokio::time::timeout(LIMIT, late.inspect("busy"))
        .await
        .expect("answered in time")
        .expect("inspect");
    let took = began.elapsed();
    assert_eq!(info.owner.as_deref(), Some(held.token()));
    assert_eq!(info.held_for, None, "{info:?}");
    assert!(
        took >= Duration::from_secs(1),
        "waited for the table's lock: {took:?}"
    );
    assert_eq!(has_held_since(&server), "f");
    let warned = warned_of_held_for(&warnings, &node);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("55P03"), "a lock timeout: {warned:?}");
    // It locks all the same.
    let other = late.lock("other").acquire().await.expect("a free lock");
    other.release().await.expect("release");

    tx.commit().await.expect("commit");
    let next = registry(&server);
    let info = next.inspect("busy").await.expect("inspect");
    assert_eq!(has_held_since(&server), "t");
    assert_eq!(info.held_for, None, "taken before: {info:?}");
    let new = next.lock("new").acquire().await.expect("a free lock");
    assert!(held_for(&next, "new", new.token()).await.is_some());
    new.release().await.expect("release");
    held.release().await.expect("release");
}

/// The advisory lock that serialises the sessions creating the schema (`link.rs`).
const SCHEMA_LOCK: i64 = 0x0064_6c6f_636b;

/// A `psql` session holding the schema's creation lock for `seconds`, once it holds it.
async fn another_session_creating_the_schema(
    server: &PostgresServer,
    seconds: f64,
) -> std::process::Child {
    let creating = server.client().spawn(
        &format!(
            "BEGIN; SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); SELECT pg_sleep({seconds}); \
             COMMIT"
        ),
        "creating",
    );
    eventually(LIMIT, "the other session creates the schema", || async {
        server.psql(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
             WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'creating'",
        ) == "1"
    })
    .await;
    creating
}

/// A registry whose round (a connection and a command) is under a second.
fn quick_registry(server: &PostgresServer) -> Registry {
    lock_tests::with_timeouts(
        Registry::builder().postgres(server.url()),
        Duration::from_millis(400),
    )
}

/// Creating the schema waits for another session creating it for as long as that takes: only
/// its statements' waits for a table's lock are bounded (a second), not this one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_the_schema_waits_for_another_session_creating_it() {
    let server = PostgresServer::start();
    let mut creating = another_session_creating_the_schema(&server, 1.5).await;
    let began = std::time::Instant::now();
    lock_once(&registry(&server)).await;
    let took = began.elapsed();
    assert!(took >= Duration::from_millis(500), "it waited: {took:?}");
    assert!(creating.wait().expect("psql").success());
}

/// Timeouts that make a round (a connection and a command) shorter than a second still
/// connect: the socket's keepalive idle time, which the kernel takes in whole seconds, was
/// that round, rounded down to zero and refused (`Invalid argument`, os error 22).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_whose_timeouts_make_a_round_under_a_second_connects() {
    let server = PostgresServer::start();
    // The schema made first, so the short timeouts bound a lock's statements alone.
    connected(&server).await;
    let quick = quick_registry(&server);
    let held = quick.lock("k").acquire().await.expect("connected");
    held.release().await.expect("release");
}

/// A schema check that outlasts its bound (another session is creating the schema) and then
/// fails on the server (its `ALTER` gives up behind an application's transaction) leaves its
/// session in the failed transaction: the registry does not go on with that connection, whose
/// every statement would be refused, but makes a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_check_that_timed_out_then_failed_leaves_no_connection_refusing_every_call() {
    let (server, _node, _first, held) = held_before_held_since("busy").await;
    let mut app_client = app(&server).await;
    let tx = app_client.transaction().await.expect("begin");
    check_in(&tx, &held).await;
    let mut creating = another_session_creating_the_schema(&server, 2.0).await;
    let late = quick_registry(&server);
    let err = late
        .inspect("busy")
        .await
        .expect_err("its schema check outlasts its bound");
    assert!(err.to_string().contains("no answer within"), "{err}");
    assert!(creating.wait().expect("psql").success());
    // Its batch goes on, and its `ALTER` gives up after a second behind the transaction: the
    // session is left in the failed transaction, or gone with its connection.
    eventually(LIMIT, "the late check's batch ended", || async {
        server.psql(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE query LIKE 'BEGIN; SET LOCAL synchronous_commit%' \
             AND state IN ('active', 'idle in transaction')",
        ) == "0"
    })
    .await;
    tx.commit().await.expect("commit");
    let info = late.inspect("busy").await.expect("a connection that works");
    assert_eq!(info.owner.as_deref(), Some(held.token()));
    let other = late.lock("other").acquire().await.expect("a free lock");
    other.release().await.expect("release");
    held.release().await.expect("release");
}

/// A schema that cannot be created (a role without the right to) fails each call with that
/// reason, not the first one only: the failed creation is rolled back, not left open on the
/// connection to refuse every later statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_that_cannot_be_created_fails_each_call_with_the_reason() {
    let server = PostgresServer::start();
    server.psql("CREATE ROLE nobody LOGIN");
    let nobody = Registry::builder()
        .postgres(server.url().replace("postgres@", "nobody@"))
        .build()
        .expect("a registry on Postgres");
    for attempt in 0..2 {
        let err = nobody
            .lock("k")
            .acquire()
            .await
            .expect_err("no schema")
            .to_string();
        assert!(
            err.contains("permission denied"),
            "attempt {attempt}: {err}"
        );
    }
}

/// Until `n` callers are queued for `key`.
async fn queued(registry: &Registry, key: &str, n: u32) {
    eventually(LIMIT, "the candidates queued", || async {
        registry.inspect(key).await.expect("inspect").waiters == n
    })
    .await;
}

/// Keys Postgres cannot hold as text or index (a NUL byte; more than 2,000 bytes with the
/// prefix) are refused before any statement, naming the key and what to do; Redis takes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_postgres_cannot_hold_are_refused_with_a_reason() {
    let server = PostgresServer::start();
    let a = registry(&server);
    let err = a.lock("a\0b").acquire().await.unwrap_err();
    assert!(
        matches!(&err, lock_runtime::LockError::InvalidKey { reason, .. } if reason.contains("NUL")),
        "{err:?}"
    );
    let long = "k".repeat(3000);
    let err = a.lock(&long).acquire().await.unwrap_err();
    assert!(
        matches!(&err, lock_runtime::LockError::InvalidKey { reason, .. } if reason.contains("2000 bytes")),
        "{err:?}"
    );
    let fits = "k".repeat(1990);
    a.lock(&fits)
        .fencing(true)
        .acquire()
        .await
        .expect("a key that fits")
        .release()
        .await
        .unwrap();
}

/// An attempt held up on its way (here, by a proxy) and run by the server after its caller gave
/// up is undone by the release the caller sends after it: the release goes behind the attempt on
/// the same connection, so the lock is not left to a token nobody holds for its whole lease.
/// Found by the attack on the store: the connection was dropped on the timeout and the release
/// overtook the attempt on a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_runs_after_its_caller_gave_up_is_undone() {
    let server = PostgresServer::start_logging();
    let proxy = Proxy::start(server.port());
    let late = Registry::builder()
        .postgres(format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            proxy.port()
        ))
        .command_timeout(Duration::from_millis(300))
        .build()
        .expect("a registry through the proxy");
    let other = connected(&server).await;
    // Its connection made and its functions compiled in its session: a first call beside a
    // loaded machine's can take longer than the 300 ms it allows a statement.
    let tries = std::sync::atomic::AtomicU32::new(0);
    eventually(LIMIT, "a lock cycle through the proxy", || async {
        let n = tries.fetch_add(1, Ordering::SeqCst);
        match late.lock(format!("warm{n}")).acquire().await {
            Ok(guard) => guard.release().await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    let releases = server.statements_with("distributed_lock.release(");
    proxy.hold_requests_from(b"distributed_lock.acquire(");
    // Longer than the test waits below: a lock left to nobody would outlast it.
    let gave_up = late
        .lock("victim")
        .ttl(Duration::from_secs(120))
        .wait(Duration::from_millis(200))
        .acquire()
        .await;
    assert!(gave_up.is_err(), "{gave_up:?}");
    // The caller lets go of what its attempt may have taken: its release must reach the server
    // after the attempt, on the same connection.
    // Before the fix the release went on a new connection, ran first and found nothing.
    eventually(
        LIMIT,
        "the caller's release waits behind its attempt",
        || async { proxy.stats().held_count(b"distributed_lock.release(") > 0 },
    )
    .await;
    assert_eq!(
        server.statements_with("distributed_lock.release("),
        releases,
        "no release overtook the attempt"
    );
    proxy.release_requests();
    let next = other.lock("victim").wait(LIMIT).acquire().await;
    next.expect("free once the late attempt was undone")
        .release()
        .await
        .unwrap();
}

/// Until one session over TLS listens for a key's release (the waiter's listener).
async fn listening_over_tls(server: &PostgresServer, what: &str) {
    let listening = "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                     WHERE s.ssl AND a.client_addr IS NOT NULL \
                     AND a.query LIKE 'SELECT distributed_lock.listen(%'";
    eventually(LIMIT, what, || async { server.psql(listening) == "1" }).await;
}

/// A registry on a server that takes TCP connections only over TLS with a client certificate
/// (`hostssl ... cert`): the statements' and the listener's connections both speak TLS,
/// checked against the registry's CA (`sslmode=verify-full`, read as `require`, which always
/// checks the certificate and host name), and present its client certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_speaks_tls_to_postgres_with_its_ca_and_client_certificate() {
    let certs = lock_tests::server::Certificates::make();
    let server = PostgresServer::start_tls(&certs, "cert");
    let (cert, key) = certs.client_pems("postgres");
    let url = format!("{}?sslmode=verify-full", server.url());
    let registry = Registry::builder()
        .postgres(&url)
        .tls_root_cert(certs.ca_pem())
        .tls_client_cert(cert, key)
        .build()
        .expect("a registry over TLS");
    let held = registry
        .lock("tls:1")
        .fencing(true)
        .acquire()
        .await
        .expect("a lock over TLS");
    assert!(held.fence().is_some(), "a fencing token over TLS");
    // A waiter listens for the release on a connection of its own, also over TLS.
    let waiter = {
        let registry = registry.clone();
        tokio::spawn(async move {
            registry
                .lock("tls:1")
                .wait(LIMIT)
                .acquire()
                .await
                .expect("handed the lock")
        })
    };
    listening_over_tls(&server, "the waiter's listener connected over TLS").await;
    held.release().await.expect("released over TLS");
    let next = tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("the waiter is handed the lock")
        .expect("the waiter's task");
    next.release().await.expect("released");
    let plain = server.psql(
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE NOT s.ssl AND a.client_addr IS NOT NULL",
    );
    assert_eq!(plain, "0", "no TCP session without TLS");
}

/// A server whose certificate the registry cannot check (no CA given, and the system's roots
/// do not know the test's), or which wants a client certificate it was not given, is refused
/// with an error that names the node and what to do; a connection string asking for TLS is
/// never downgraded to plain TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_refuses_what_it_cannot_check_and_says_what_to_give() {
    let certs = lock_tests::server::Certificates::make();
    let server = PostgresServer::start_tls(&certs, "cert");
    let url = format!("{}?sslmode=require", server.url());
    let attempt = |registry: Registry| async move {
        registry
            .lock("tls:2")
            .acquire()
            .await
            .expect_err("refused")
            .to_string()
    };
    let unknown_ca = attempt(
        Registry::builder()
            .postgres(&url)
            .connect_timeout(Duration::from_secs(5))
            .build()
            .expect("a registry"),
    )
    .await;
    let node = format!("127.0.0.1:{}", server.port());
    assert!(unknown_ca.contains(&node), "names the node: {unknown_ca}");
    assert!(
        unknown_ca.contains("tls_root_cert"),
        "says how to trust the server's CA: {unknown_ca}"
    );
    let no_client_cert = attempt(
        Registry::builder()
            .postgres(&url)
            .tls_root_cert(certs.ca_pem())
            .build()
            .expect("a registry"),
    )
    .await;
    assert!(
        no_client_cert.contains("certificate"),
        "says the server wants a client certificate: {no_client_cert}"
    );
    // Without `sslmode=require`, no TLS is tried: the server refuses the plain connection.
    let plain = attempt(
        Registry::builder()
            .postgres(server.url())
            .tls_root_cert(certs.ca_pem())
            .build()
            .expect("a registry"),
    )
    .await;
    assert!(plain.contains("no encryption"), "{plain}");
}

/// A password that happens to spell `sslmode=verify-full` reaches the server as written: only
/// the connection string's `sslmode` parameter is read as `require`, which it still is here
/// (the server takes only TLS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_that_spells_an_sslmode_reaches_postgres_unchanged() {
    let certs = lock_tests::server::Certificates::make();
    let server = PostgresServer::start_tls(&certs, "scram-sha-256");
    let password = "pw-sslmode=verify-full";
    server.psql(&format!("ALTER ROLE postgres PASSWORD '{password}'"));
    for url in [
        format!(
            "postgres://postgres:{password}@127.0.0.1:{}/postgres?sslmode=verify-full",
            server.port()
        ),
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres \
             password='{password}' sslmode = 'verify-ca'",
            server.port()
        ),
    ] {
        let registry = Registry::builder()
            .postgres(&url)
            .tls_root_cert(certs.ca_pem())
            .build()
            .expect("a registry over TLS");
        registry
            .lock("tls:password")
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("the password as written: {e}"))
            .release()
            .await
            .expect("released");
    }
}

/// A certificate that does not name the host of the connection string is refused (here the
/// name is another one, the address the server's: `hostaddr`), and so is a server that does
/// not speak TLS at all: never plain TCP instead. Neither error shows the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_refuses_a_certificate_for_another_host_and_a_server_without_tls() {
    let certs = lock_tests::server::Certificates::make();
    let attempt = |url: String| {
        let ca = certs.ca_pem();
        async move {
            Registry::builder()
                .postgres(url)
                .tls_root_cert(ca)
                .connect_timeout(Duration::from_secs(5))
                .build()
                .expect("a registry")
                .lock("tls:3")
                .acquire()
                .await
                .expect_err("refused")
                .to_string()
        }
    };
    let tls = PostgresServer::start_tls(&certs, "trust");
    let other_host = attempt(format!(
        "postgres://postgres:hunter2@db.invalid:{}/postgres?hostaddr=127.0.0.1&sslmode=verify-full",
        tls.port()
    ))
    .await;
    assert!(
        other_host.contains("db.invalid") && other_host.contains("must name the host"),
        "says the certificate does not name the host: {other_host}"
    );
    assert!(!other_host.contains("hunter2"), "{other_host}");
    let plain = PostgresServer::start();
    let no_tls = attempt(format!(
        "postgres://postgres:hunter2@127.0.0.1:{}/postgres?sslmode=require",
        plain.port()
    ))
    .await;
    assert!(
        no_tls.contains("does not support TLS"),
        "says the server speaks no TLS: {no_tls}"
    );
    assert!(!no_tls.contains("hunter2"), "{no_tls}");
}

/// After the server restarts, the registry's new connections (its statements' and its
/// waiters' listener's) speak TLS again: the server takes no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_reconnects_to_postgres_over_tls_after_a_restart() {
    let certs = lock_tests::server::Certificates::make();
    let server = Arc::new(PostgresServer::start_tls(&certs, "trust"));
    let registry = Registry::builder()
        .postgres(format!("{}?sslmode=require", server.url()))
        .tls_root_cert(certs.ca_pem())
        .build()
        .expect("a registry over TLS");
    let held = registry.lock("tls:4").acquire().await.expect("a lock");
    let restarted = server.clone();
    tokio::task::spawn_blocking(move || restarted.kill_and_restart())
        .await
        .expect("the restart");
    let waiter = {
        let registry = registry.clone();
        tokio::spawn(async move {
            // The first call after the restart may meet the old, broken connection.
            loop {
                match registry.lock("tls:4").wait(LIMIT).acquire().await {
                    Ok(next) => return next,
                    Err(e) if e.is_busy() => panic!("the waiter gave up: {e}"),
                    Err(_) => tokio::task::yield_now().await,
                }
            }
        })
    };
    listening_over_tls(&server, "the waiter's listener connected again over TLS").await;
    held.release()
        .await
        .expect("released over a new TLS connection");
    let next = tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("the waiter is handed the lock")
        .expect("the waiter's task");
    next.release().await.expect("released");
}

/// libpq's certificate parameters in the connection string (as a managed database's
/// instructions give them), which tokio-postgres does not read, are refused at `build` with
/// the builder's options that do what they meant.
#[test]
fn libpq_certificate_parameters_are_refused_naming_the_options_to_use() {
    for (parameter, option) in [
        ("sslrootcert=/etc/ssl/ca.pem", "tls_root_cert"),
        ("sslcert=/etc/ssl/client.pem", "tls_client_cert"),
        ("sslkey=/etc/ssl/client.key", "tls_client_cert"),
    ] {
        let url = format!("postgres://u:hunter2@db:5432/app?sslmode=verify-full&{parameter}");
        let e = Registry::builder()
            .postgres(url)
            .build()
            .expect_err("refused")
            .to_string();
        assert!(e.contains(option), "{parameter}: {e}");
        assert!(!e.contains("hunter2"), "{e}");
    }
}
