//! What only the Postgres store offers: a lock checked inside the application's own
//! transaction (`TransactionCheck`), against a throwaway cluster each test starts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LostReason, Registry, TransactionCheck};
use lock_tests::postgres::PostgresServer;
use lock_tests::{assert_lost, eventually};

const LIMIT: Duration = Duration::from_secs(20);

/// The application's own connection to the database.
async fn app(server: &PostgresServer) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("the application connects");
    tokio::spawn(connection);
    client
}

fn registry(server: &PostgresServer) -> Registry {
    Registry::builder()
        .postgres(server.url())
        .build()
        .expect("a registry on Postgres")
}

/// A holder whose lease ran out before its transaction checked the lock (stopped past its
/// lease, as by a pause) cannot commit: the next holder's write stands alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_past_its_lease_cannot_commit_its_transaction() {
    let server = PostgresServer::start();
    server.psql("CREATE TABLE ledger (holder text NOT NULL)");
    let (a, b) = (registry(&server), registry(&server));
    let first = a
        .lock("invoice:7")
        .ttl(Duration::from_millis(500))
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
    let checked = next.transaction_check().expect("checks");
    tx_b.execute(
        TransactionCheck::STATEMENT,
        &[&checked.keys(), &checked.token()],
    )
    .await
    .expect("the holder's check passes");
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
    let (a, b) = (registry(&server), registry(&server));
    let first = a
        .lock("invoice:8")
        .ttl(Duration::from_millis(500))
        .renew(false)
        .acquire()
        .await
        .expect("a free lock");
    let check = first.transaction_check().expect("checks");
    let mut app_a = app(&server).await;
    let tx_a = app_a.transaction().await.expect("begin");
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
