//! A holder paused past its lease, whose late transaction is refused by Postgres itself.
//!
//! As in `fenced_write`: a process that stalls in the middle of its work (a GC pause, a swap
//! storm, a `SIGSTOP`) wakes up believing it still holds the lock, after its lease ran out and
//! the next holder wrote. On Postgres the lock can be checked inside the application's own
//! transaction (`TransactionCheck`): the check fails unless the lock is still held, and once it
//! passed nobody can take the lock over until that transaction ends. So the stalled holder's
//! commit is refused, and a holder that checked before it stalled keeps the next one out until
//! it commits: the two transactions never interleave.
//!
//! Holder A is a process of its own: it takes the lock (ttl 1 s) and opens a transaction, and
//! the example stops it with `SIGSTOP` before it writes. Its renewals stop with it; once its
//! lease has run out, holder B (this process) takes the lock, writes "B" and commits. Then A is
//! continued, writes "A" and commits. Once without the check: A's commit overwrites B's write.
//! Once with it: refused, and B's write stays.
//!
//! `cargo run --release -p lock-examples --example postgres_transaction`. Without
//! `LOCK_POSTGRES_URL` it starts a throwaway Postgres cluster. It exits non-zero unless the
//! unchecked commit lost B's write and the checked one was refused.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use lock_runtime::{Registry, TransactionCheck};

const TTL: Duration = Duration::from_secs(1);

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to Postgres");
    tokio::spawn(connection);
    client
}

fn registry(url: &str) -> Registry {
    Registry::builder()
        .postgres(url)
        .build()
        .expect("a Postgres URL")
}

/// Holder A, in a process of its own: takes the lock and opens a transaction, says so, writes
/// and commits when told (after its stop), and says what came of it.
async fn holder(url: &str, run: &str, checked: bool) {
    let guard = registry(url)
        .lock(format!("account:{run}"))
        .ttl(TTL)
        .acquire()
        .await
        .expect("the lock is free");
    let check = guard.transaction_check().expect("a Postgres lock");
    let mut app = connect(url).await;
    let tx = app.transaction().await.expect("begin");
    println!("HOLDING");
    // The parent stops this process here, and continues it once B has committed.
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("the parent");
    let update = format!("UPDATE accounts SET balance = 'A' WHERE id = '{run}'");
    tx.execute(update.as_str(), &[]).await.expect("write");
    if checked {
        let held = tx
            .execute(
                TransactionCheck::STATEMENT,
                &[&check.keys(), &check.token()],
            )
            .await;
        if let Err(e) = held {
            let why = e
                .as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_owned());
            println!("REFUSED {why}");
            return;
        }
    }
    tx.commit().await.expect("commit");
    println!("COMMITTED");
    // Lost while stopped: nothing to release (the drop releases only what is still ours).
    drop(guard);
}

/// One round: A takes the lock and is stopped; B takes it when A's lease has run out and
/// commits "B"; A is continued and commits "A" (checked or not). Returns the balance and what A
/// said.
async fn round(url: &str, run: &str, checked: bool) -> (String, String) {
    let app = connect(url).await;
    let insert = format!("INSERT INTO accounts VALUES ('{run}', '')");
    app.execute(insert.as_str(), &[]).await.expect("an account");
    let mut a = Command::new(std::env::current_exe().unwrap())
        .env("TX_HOLDER", if checked { "checked" } else { "plain" })
        .env("TX_RUN", run)
        .env("LOCK_POSTGRES_URL", url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start holder A");
    let mut said = BufReader::new(a.stdout.take().unwrap()).lines();
    let holding = said.next().expect("A says it holds").unwrap();
    assert_eq!(holding, "HOLDING");
    lock_tests::signal(a.id(), "STOP");
    println!(
        "  A holds the lock, has begun its transaction, and is stopped (SIGSTOP) before it writes"
    );

    let b = registry(url)
        .lock(format!("account:{run}"))
        .ttl(TTL)
        .wait(TTL * 5)
        .acquire()
        .await
        .expect("B gets the lock once A's lease has run out");
    let mut app_b = connect(url).await;
    let tx = app_b.transaction().await.expect("begin");
    let update = format!("UPDATE accounts SET balance = 'B' WHERE id = '{run}'");
    tx.execute(update.as_str(), &[]).await.expect("write");
    let check = b.transaction_check().expect("a Postgres lock");
    tx.execute(
        TransactionCheck::STATEMENT,
        &[&check.keys(), &check.token()],
    )
    .await
    .expect("B holds the lock");
    tx.commit().await.expect("commit");
    println!("  A's lease ran out; B took the lock and committed \"B\"");
    b.release().await.unwrap();

    lock_tests::signal(a.id(), "CONT");
    writeln!(a.stdin.take().unwrap(), "write").unwrap();
    let outcome = said
        .next()
        .expect("A says what came of its commit")
        .unwrap();
    assert!(a.wait().unwrap().success(), "holder A failed");
    let select = format!("SELECT balance FROM accounts WHERE id = '{run}'");
    let balance: String = app.query_one(select.as_str(), &[]).await.unwrap().get(0);
    (balance, outcome)
}

#[tokio::main]
async fn main() {
    if let Ok(mode) = std::env::var("TX_HOLDER") {
        let url = std::env::var("LOCK_POSTGRES_URL").expect("set by the parent");
        let run = std::env::var("TX_RUN").expect("set by the parent");
        holder(&url, &run, mode == "checked").await;
        return;
    }
    let (_server, url) = lock_examples::postgres_url();
    let setup = connect(&url).await;
    setup
        .batch_execute("CREATE TABLE IF NOT EXISTS accounts (id text PRIMARY KEY, balance text)")
        .await
        .expect("the accounts table");
    let run = format!("{:x}", std::process::id());

    println!("\nwithout a check (A's transaction commits as it is):");
    let (plain, said) = round(&url, &format!("{run}-plain"), false).await;
    println!("  A was continued and committed \"A\" ({said}): the balance is {plain:?}");
    println!("\nwith TransactionCheck (A's transaction checks the lock before it commits):");
    let (checked, said) = round(&url, &format!("{run}-checked"), true).await;
    let refused = said.starts_with("REFUSED ");
    println!(
        "  A was continued and wrote \"A\": {}; the balance is {checked:?}",
        match said.strip_prefix("REFUSED ") {
            Some(why) => format!("its check failed ({why}), and nothing of it was committed"),
            None => "committed".to_owned(),
        }
    );

    let ok = plain == "A" && checked == "B" && refused;
    println!(
        "\n{}",
        if ok {
            "the unchecked commit lost B's update; the checked one was refused and kept it"
        } else {
            "UNEXPECTED: see above"
        }
    );
    if !ok {
        std::process::exit(1);
    }
}
