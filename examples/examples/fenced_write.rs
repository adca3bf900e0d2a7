//! A holder paused past its lease, whose late write is refused by the data itself.
//!
//! A lock alone cannot stop a process that stalls (a GC pause, a swap storm, a `SIGSTOP`) in
//! the middle of its work: its lease runs out, the next holder takes the lock and writes, and
//! then the stalled one wakes up and writes too, believing it still holds the lock. A fencing
//! token makes that write refusable, if the store checks it: `FencedKey` is that check for
//! Redis data.
//!
//! Holder A is a process of its own: it takes the lock (`fencing = true`, ttl 1 s), and the
//! example stops it with `SIGSTOP` before it writes. Its renewals stop with it; once its lease
//! has run out, holder B (this process) takes the lock and writes. Then A is continued and
//! writes its stale value. Once with a plain `SET`: A's write overwrites B's. Once through
//! `FencedKey`: refused, and B's write stays.
//!
//! `cargo run --release -p lock-examples --example fenced_write`. Without
//! `LOCK_REDIS_URL`/`REDIS_URL` it starts a throwaway redis-server. It exits non-zero unless
//! the plain write was lost and the fenced one was kept.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use lock_runtime::{FencedKey, FencedWrite, Registry};
use redis::AsyncCommands;

const TTL: Duration = Duration::from_secs(1);

async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis")
}

/// Holder A, in a process of its own: takes the lock, says so, writes when told (after its
/// stop), and says what came of it.
async fn holder(url: &str, run: &str, fenced: bool) {
    let registry = Registry::from_url(url).expect("a Redis URL");
    let guard = registry
        .lock(format!("account:{run}"))
        .ttl(TTL)
        .fencing(true)
        .acquire()
        .await
        .expect("the lock is free");
    let fence = guard.fence().expect("fencing");
    println!("HOLDING {fence}");
    // The parent stops this process here, and continues it once B has written.
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("the parent");
    let mut con = connect(url).await;
    let balance = format!("balance:{run}");
    if fenced {
        match FencedKey::new(balance)
            .write::<()>(&mut con, fence, "SET", "A")
            .await
        {
            Ok(FencedWrite::Written(())) => println!("WROTE {fence}"),
            Ok(FencedWrite::Refused { highest }) => println!("REFUSED {fence} {highest}"),
            Err(e) => println!("ERROR {e}"),
        }
    } else {
        let () = con.set(balance, "A").await.unwrap();
        println!("WROTE {fence}");
    }
    // Lost while stopped: nothing to release (the drop releases only what is still ours).
    drop(guard);
}

/// One round: A takes the lock and is stopped; B takes it when A's lease has run out and
/// writes "B"; A is continued and writes "A". Returns the balance and what A said.
async fn round(url: &str, run: &str, fenced: bool) -> (String, String) {
    let mut a = Command::new(std::env::current_exe().unwrap())
        .env("FENCED_HOLDER", if fenced { "fenced" } else { "plain" })
        .env("FENCED_RUN", run)
        .env("LOCK_REDIS_URL", url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start holder A");
    let mut said = BufReader::new(a.stdout.take().unwrap()).lines();
    let holding = said.next().expect("A says it holds").unwrap();
    let a_fence = holding.strip_prefix("HOLDING ").expect("HOLDING <fence>");
    lock_tests::signal(a.id(), "STOP");
    println!("  A holds the lock with fence {a_fence}, and is stopped (SIGSTOP) before it writes");

    let registry = Registry::from_url(url).expect("a Redis URL");
    let b = registry
        .lock(format!("account:{run}"))
        .ttl(TTL)
        .fencing(true)
        .wait(TTL * 5)
        .acquire()
        .await
        .expect("B gets the lock once A's lease has run out");
    let b_fence = b.fence().expect("fencing");
    let mut con = connect(url).await;
    let balance = format!("balance:{run}");
    if fenced {
        let written = FencedKey::new(&balance)
            .write::<()>(&mut con, b_fence, "SET", "B")
            .await
            .unwrap();
        assert_eq!(written, FencedWrite::Written(()));
    } else {
        let () = con.set(&balance, "B").await.unwrap();
    }
    println!("  A's lease ran out; B took the lock with fence {b_fence} and wrote \"B\"");
    b.release().await.unwrap();

    lock_tests::signal(a.id(), "CONT");
    writeln!(a.stdin.take().unwrap(), "write").unwrap();
    let outcome = said.next().expect("A says what came of its write").unwrap();
    assert!(a.wait().unwrap().success(), "holder A failed");
    let value: String = con.get(&balance).await.unwrap();
    let _: () = con
        .del(vec![
            balance.clone(),
            FencedKey::new(&balance).record_key().to_owned(),
        ])
        .await
        .unwrap();
    (value, outcome)
}

#[tokio::main]
async fn main() {
    if let Ok(mode) = std::env::var("FENCED_HOLDER") {
        let url = std::env::var("LOCK_REDIS_URL").expect("set by the parent");
        let run = std::env::var("FENCED_RUN").expect("set by the parent");
        holder(&url, &run, mode == "fenced").await;
        return;
    }
    let (_server, url) = lock_examples::redis_url();
    let run = format!("{:x}", std::process::id());

    println!("\nwithout a fence (a plain SET):");
    let (plain, said) = round(&url, &format!("{run}-plain"), false).await;
    println!("  A was continued and wrote \"A\" ({said}): the balance is {plain:?}");
    println!("\nwith FencedKey (the write carries the token, the data checks it):");
    let (fenced, said) = round(&url, &format!("{run}-fenced"), true).await;
    let refused = said.starts_with("REFUSED ");
    println!(
        "  A was continued and wrote \"A\": {}; the balance is {fenced:?}",
        if refused {
            "refused, a higher token was written first"
        } else {
            "accepted"
        }
    );

    let ok = plain == "A" && fenced == "B" && refused;
    println!(
        "\n{}",
        if ok {
            "the plain write lost B's update; the fenced one kept it"
        } else {
            "UNEXPECTED: see above"
        }
    );
    if !ok {
        std::process::exit(1);
    }
}
