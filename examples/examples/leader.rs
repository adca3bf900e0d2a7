//! Leader election: three replica processes campaign for `scheduler`; the leader runs the
//! scheduler loop, and the others wait in line. The parent observes the election, kills the
//! leader (SIGKILL: no release), then stops the next one cleanly, and checks what followed.
//!
//! `cargo run --release -p lock-examples --example leader`. Without
//! `LOCK_REDIS_URL`/`REDIS_URL` it starts a throwaway redis-server.
//!
//! - A killed leader's lease runs out (ttl 2 s), and the next candidate leads within ttl and a
//!   small bound; a leader that stops cleanly steps down (`Election::step_down`: its loop
//!   finishes its tick and returns) and hands over at once, then leaves (`Registry::shutdown`).
//! - The observer (`Election::observe`) sees each change, woken by the election's
//!   notifications and by the end of a crashed leader's lease.
//! - Each leader's loop appends its term to a Redis list every 50 ms. From that history, in
//!   the server's order, the parent checks that no two terms overlap (terms only grow down the
//!   list) and that each term has one leader; it exits non-zero otherwise.

use std::process::Stdio;
use std::time::Duration;

use lock_runtime::{Leader, Registry, Term};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const REPLICAS: u32 = 3;
/// The leader's lease: how long a crashed leader keeps the others waiting.
const TTL: Duration = Duration::from_secs(2);
/// How much later than its lease's end a crashed leader's successor may come: the candidates
/// wake at the end of the lease they saw, plus a round trip and scheduling.
const TAKEOVER_BOUND: Duration = Duration::from_secs(1);
/// How often a leader's loop does its work.
const TICK: Duration = Duration::from_millis(50);
/// Bounds every wait for an event, so a broken run fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(20);

fn history_key(run: &str) -> String {
    format!("leader-example:{run}:history")
}

/// The leader's work, for as long as its term lasts: `lead` drops it when the term is lost.
async fn schedule(
    term: Term,
    mut con: MultiplexedConnection,
    history: String,
) -> Result<(), redis::RedisError> {
    let number = term.number().unwrap_or_default();
    println!("elected: term {number}");
    // Until asked to step down: then the tick under way finishes, and returning resigns.
    while !term.is_stepping_down() {
        // A real scheduler would also hold back new work while `term.is_at_risk()`, and hand
        // `number` to the storage it writes as a fence. An error ends the term: the next
        // candidate leads, and this one campaigns again.
        let () = con
            .rpush(&history, format!("{number} {}", term.identity()))
            .await?;
        tokio::select! {
            () = tokio::time::sleep(TICK) => {}
            () = term.stepping_down() => {}
        }
    }
    println!("term {number}: stepping down");
    Ok(())
}

/// A replica: leads whenever elected, until told to stop on stdin.
async fn replica(n: u32, run: &str, url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let registry = Registry::from_url(url)?;
    let con = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let election = registry
        .election(format!("scheduler:{run}"))
        .identity(format!("replica-{n}"))
        .ttl(TTL);
    let history = history_key(run);
    println!("READY");
    let leading = tokio::spawn({
        let election = election.clone();
        async move {
            election
                .lead(|term| schedule(term, con.clone(), history.clone()))
                .await
        }
    });
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    // Told to stop (or the parent went away): step down, so that the next candidate leads at
    // once, then leave the line.
    let _ = stdin.next_line().await;
    if let Some(ended) = election.step_down(Duration::from_secs(5)).await? {
        println!(
            "stepped down from term {:?} (finished: {})",
            ended.term, ended.finished
        );
    }
    registry.shutdown().await;
    leading.await??;
    println!("stopped cleanly");
    Ok(())
}

/// A replica process, as the parent sees it.
struct Replica {
    identity: String,
    child: Child,
}

fn start_replica(n: u32, run: &str, url: &str) -> (Replica, tokio::process::ChildStdout) {
    let mut child = Command::new(std::env::current_exe().expect("this example"))
        .env("LEADER_REPLICA", n.to_string())
        .env("LEADER_RUN", run)
        .env("LOCK_REDIS_URL", url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start a replica");
    let stdout = child.stdout.take().expect("piped");
    let identity = format!("replica-{n}");
    (Replica { identity, child }, stdout)
}

/// The next leader the observer reports that is not `previous` (`None`: any leader), within
/// `PATIENCE`; prints every change on the way.
async fn next_leader(
    observer: &mut lock_runtime::Observer,
    started: Instant,
    previous: Option<&str>,
) -> Leader {
    let wait = async {
        loop {
            let seen = observer.next().await.expect("observe the election");
            let at = started.elapsed().as_secs_f64();
            match seen {
                None => println!("{at:>7.3}s  observer: no leader"),
                Some(leader) => {
                    let term = leader.term.unwrap_or_default();
                    println!(
                        "{at:>7.3}s  observer: {} leads, term {term}",
                        leader.identity
                    );
                    if previous != Some(leader.identity.as_str()) {
                        return leader;
                    }
                }
            }
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .expect("a leader within the patience")
}

/// Which replica `identity` is.
fn leader(replicas: &[Replica], identity: &str) -> usize {
    let at = replicas.iter().position(|r| r.identity == identity);
    at.expect("a leader is one of the replicas")
}

#[tokio::main]
async fn main() {
    if let Ok(n) = std::env::var("LEADER_REPLICA") {
        let n: u32 = n.parse().expect("a replica number");
        let run = std::env::var("LEADER_RUN").expect("set by the parent");
        let url = std::env::var("LOCK_REDIS_URL").expect("set by the parent");
        if let Err(e) = replica(n, &run, &url).await {
            eprintln!("replica-{n}: {e}");
            std::process::exit(1);
        }
        return;
    }

    let (_server, url) = lock_examples::redis_url();
    let run = format!("{:x}", std::process::id());
    let started = Instant::now();
    let mut replicas = Vec::new();
    for n in 1..=REPLICAS {
        let (replica, stdout) = start_replica(n, &run, &url);
        let mut lines = BufReader::new(stdout).lines();
        let ready = lines.next_line().await.expect("read a replica");
        assert_eq!(ready.as_deref(), Some("READY"), "replica-{n} did not start");
        let identity = replica.identity.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let at = started.elapsed().as_secs_f64();
                println!("{at:>7.3}s  {identity}: {line}");
            }
        });
        replicas.push(replica);
    }
    println!(
        "{REPLICAS} replicas campaign for scheduler:{run} (ttl {} s); the parent observes\n",
        TTL.as_secs()
    );
    let watcher = Registry::from_url(&url).expect("a registry");
    let mut observer = watcher.election(format!("scheduler:{run}")).observe();
    let mut failures = Vec::new();

    let first = next_leader(&mut observer, started, None).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let at = leader(&replicas, &first.identity);
    replicas[at].child.start_kill().expect("kill the leader");
    let killed = Instant::now();
    println!(
        "{:>7.3}s  parent: killed {} (SIGKILL: no release; its lease runs out)",
        started.elapsed().as_secs_f64(),
        first.identity
    );
    let second = next_leader(&mut observer, started, Some(&first.identity)).await;
    let took = killed.elapsed();
    if took > TTL + TAKEOVER_BOUND {
        failures.push(format!(
            "after the leader was killed, the next one took {took:?}: beyond ttl + {TAKEOVER_BOUND:?}"
        ));
    }

    tokio::time::sleep(Duration::from_millis(500)).await;
    let at = leader(&replicas, &second.identity);
    let mut stdin = replicas[at].child.stdin.take().expect("piped");
    stdin.write_all(b"stop\n").await.expect("tell it to stop");
    let stopped = Instant::now();
    println!(
        "{:>7.3}s  parent: stopping {} cleanly (it steps down)",
        started.elapsed().as_secs_f64(),
        second.identity
    );
    let third = next_leader(&mut observer, started, Some(&second.identity)).await;
    let handed_over_in = stopped.elapsed();
    if handed_over_in > TAKEOVER_BOUND {
        failures.push(format!(
            "a leader that stopped cleanly was followed after {handed_over_in:?}, not at once"
        ));
    }

    tokio::time::sleep(Duration::from_millis(500)).await;
    for replica in &mut replicas {
        if let Some(mut stdin) = replica.child.stdin.take() {
            // The killed one is gone: nothing to tell.
            let _ = stdin.write_all(b"stop\n").await;
        }
    }
    let last = tokio::time::timeout(PATIENCE, observer.next()).await;
    match last {
        Ok(Ok(None)) => println!(
            "{:>7.3}s  observer: no leader",
            started.elapsed().as_secs_f64()
        ),
        other => failures.push(format!(
            "after every replica stopped, the observer saw {other:?}"
        )),
    }
    for replica in &mut replicas {
        let _ = replica.child.wait().await;
    }

    // The server's history: the terms in the order the leaders' writes reached Redis.
    let mut con = redis::Client::open(url.as_str())
        .expect("a client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let history: Vec<String> = con.lrange(history_key(&run), 0, -1).await.expect("read");
    let _: () = con.del(history_key(&run)).await.expect("clean up");
    let mut terms: Vec<(u64, String)> = Vec::new();
    for entry in &history {
        let (term, identity) = entry.split_once(' ').expect("`term identity`");
        let term: u64 = term.parse().expect("a term");
        match terms.last() {
            Some((last, _)) if term < *last => failures.push(format!(
                "term {term} wrote after term {last} had begun: two terms overlapped"
            )),
            Some((last, who)) if term == *last && who != identity => {
                failures.push(format!("term {term} has two leaders: {who} and {identity}"))
            }
            Some((last, _)) if term == *last => {}
            _ => terms.push((term, identity.to_owned())),
        }
    }
    let leaders: Vec<&str> = terms.iter().map(|(_, who)| who.as_str()).collect();
    let expected = [&first, &second, &third].map(|l| l.identity.as_str());
    if leaders != expected {
        failures.push(format!(
            "the history's leaders were {leaders:?}, the observer's {expected:?}"
        ));
    }

    println!(
        "\n{} writes by {} terms, in order: {}",
        history.len(),
        terms.len(),
        terms
            .iter()
            .map(|(term, who)| format!("{who} (term {term})"))
            .collect::<Vec<_>>()
            .join(", then ")
    );
    println!(
        "killed leader followed after {:.2} s (ttl {} s); clean stop handed over in {:.0} ms",
        took.as_secs_f64(),
        TTL.as_secs(),
        handed_over_in.as_secs_f64() * 1000.0
    );
    if !failures.is_empty() {
        for failure in &failures {
            println!("CHECK FAILED: {failure}");
        }
        std::process::exit(1);
    }
    println!("no two terms overlapped, and terms only grew");
}
