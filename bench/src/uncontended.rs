//! Items 1 and 2: the PING round trip on each library's kind of client, and the uncontended
//! acquire + release of one key, interleaved so that both see the same machine state.
//!
//! Next to lock-runtime's cycle the same two commands are also sent without any library on a
//! plain `MultiplexedConnection`: `SET key token NX PX ttl` and lock-runtime's release script (its
//! wire protocol). That is the floor the protocol itself sets, whatever the client does. They
//! are sent a second time on a connection made on a thread of its own, as lock-runtime's
//! connections are made on its I/O thread: what the driver's wake-ups on another thread cost.

use lock_runtime::protocol::RELEASE_LUA;

use crate::libs::{remote_connection, Client, Lib, PerLib, Pinger};
use crate::redis_stats::server_median_usec;
use crate::stats::Samples;

pub struct Uncontended {
    pub rtt: PerLib<Samples>,
    pub cycle: PerLib<Samples>,
    /// lock-runtime's two commands sent by hand.
    pub raw: Samples,
    /// The same on a connection whose driver runs on a thread of its own.
    pub raw_remote: Samples,
    /// Server time per call (median), µs: PING, `SET NX PX`, the release script.
    pub server_usec: [f64; 3],
}

/// `SET NX PX` and the release script on a plain connection.
async fn raw_cycle(con: &mut Pinger, release: &Release) -> std::time::Duration {
    let Pinger::Multiplexed(con) = con else {
        unreachable!("lock-runtime uses a MultiplexedConnection")
    };
    let started = std::time::Instant::now();
    let set: Option<String> = redis::cmd("SET")
        .arg("lock:cycle:raw")
        .arg(RAW_TOKEN)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(con)
        .await
        .expect("SET");
    assert!(set.is_some(), "the raw key is free");
    let released: i64 = match release {
        Release::DelIfEq => redis::cmd("DELIFEQ")
            .arg("lock:cycle:raw")
            .arg(RAW_TOKEN)
            .query_async(con)
            .await
            .expect("DELIFEQ"),
        Release::Script(script) => script
            .key("lock:cycle:raw")
            .arg(RAW_TOKEN)
            .arg("PUBLISH")
            .invoke_async(con)
            .await
            .expect("release script"),
    };
    assert_eq!(released, 1);
    started.elapsed()
}

/// A token shaped as lock-runtime's (`host:pid:` and 32 hex digits): its release, like the
/// library's, is the plain one for a lock nobody waited for.
const RAW_TOKEN: &str = "bench:1:0123456789abcdef0123456789abcdef";

/// How lock-runtime releases a lock nobody waited for on this server.
enum Release {
    /// Valkey 9+.
    DelIfEq,
    Script(redis::Script),
}

pub async fn measure(url: &str, iterations: usize) -> Uncontended {
    let mut clients = Vec::new();
    let mut pingers = Vec::new();
    for lib in Lib::ALL {
        clients.push(Client::connect(lib, url).await);
        pingers.push(Pinger::connect(lib, url).await);
    }
    let mut raw_con = Pinger::connect(Lib::Runtime, url).await;
    let release = {
        let Pinger::Multiplexed(con) = &mut raw_con else {
            unreachable!("lock-runtime uses a MultiplexedConnection")
        };
        let info: Vec<redis::Value> = redis::cmd("COMMAND")
            .arg("INFO")
            .arg("DELIFEQ")
            .query_async(con)
            .await
            .expect("COMMAND INFO");
        if matches!(info.as_slice(), [] | [redis::Value::Nil]) {
            Release::Script(redis::Script::new(RELEASE_LUA))
        } else {
            Release::DelIfEq
        }
    };
    let mut remote_con = remote_connection(url);
    let mut raw = Vec::with_capacity(iterations);
    let mut raw_remote = Vec::with_capacity(iterations);
    let keys: Vec<String> = Lib::ALL
        .iter()
        .map(|l| format!("cycle:{}", l.id()))
        .collect();
    // Connections, scripts and the lease keepers are started on first use: warm them up.
    for _ in 0..200 {
        for lib in Lib::ALL {
            let i = lib as usize;
            pingers[i].ping().await;
            clients[i].cycle(&keys[i]).await.expect("warm-up cycle");
        }
        raw_cycle(&mut raw_con, &release).await;
        raw_cycle(&mut remote_con, &release).await;
    }
    let mut rtt = PerLib::<Vec<_>>::default();
    let mut cycle = PerLib::<Vec<_>>::default();
    for n in 0..iterations {
        // Rotate who goes first, so no library always follows another's burst.
        for k in 0..Lib::ALL.len() {
            let lib = Lib::ALL[(n + k) % Lib::ALL.len()];
            let i = lib as usize;
            rtt.get_mut(lib).push(pingers[i].ping().await);
            let started = std::time::Instant::now();
            clients[i].cycle(&keys[i]).await.expect("uncontended cycle");
            cycle.get_mut(lib).push(started.elapsed());
            if lib == Lib::Runtime {
                raw.push(raw_cycle(&mut raw_con, &release).await);
                raw_remote.push(raw_cycle(&mut remote_con, &release).await);
            }
        }
    }
    // What each command costs the server itself, measured alone: the median from the server's
    // own latency histogram (a mean would count every preemption of redis-server by other
    // processes on this machine).
    let mut stats = lock_tests::connection(url);
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut stats)
        .expect("CONFIG RESETSTAT");
    for _ in 0..1000 {
        raw_con.ping().await;
        raw_cycle(&mut raw_con, &release).await;
    }
    let server_usec = ["ping", "set", "evalsha"].map(|c| server_median_usec(&mut stats, c));
    Uncontended {
        server_usec,
        rtt: PerLib(rtt.0.map(Samples::new)),
        cycle: PerLib(cycle.0.map(Samples::new)),
        raw: Samples::new(raw),
        raw_remote: Samples::new(raw_remote),
    }
}

/// `--profile wakeups N`, second part: N uncontended cycles back to back, lock-runtime's against
/// its two commands by hand on a connection driven on the calling runtime and on one driven on
/// a thread of its own; the median and each thread's parkings per cycle.
pub async fn profile(url: &str, server_pid: u32, samples: usize) {
    use crate::handoff::{parkings, Span};
    let client = Client::connect(Lib::Runtime, url).await;
    let mut local = Pinger::connect(Lib::Runtime, url).await;
    let release = match redis::cmd("COMMAND")
        .arg("INFO")
        .arg("DELIFEQ")
        .query::<Vec<redis::Value>>(&mut lock_tests::connection(url))
        .expect("COMMAND INFO")
        .as_slice()
    {
        [] | [redis::Value::Nil] => Release::Script(redis::Script::new(RELEASE_LUA)),
        _ => Release::DelIfEq,
    };
    let mut remote = remote_connection(url);
    for _ in 0..200 {
        client.cycle("cycle:profile").await.expect("warm-up cycle");
        raw_cycle(&mut local, &release).await;
        raw_cycle(&mut remote, &release).await;
    }
    let mut library = Span::default();
    let mut by_hand = Span::default();
    let mut by_hand_remote = Span::default();
    for _ in 0..samples {
        let before = parkings(server_pid);
        let started = std::time::Instant::now();
        client.cycle("cycle:profile").await.expect("cycle");
        library.add(started.elapsed(), &before, &parkings(server_pid));
        let before = parkings(server_pid);
        let took = raw_cycle(&mut local, &release).await;
        by_hand.add(took, &before, &parkings(server_pid));
        let before = parkings(server_pid);
        let took = raw_cycle(&mut remote, &release).await;
        by_hand_remote.add(took, &before, &parkings(server_pid));
    }
    library.print("lock-runtime uncontended cycle", samples);
    by_hand.print(
        "the same two commands by hand, driver on the calling runtime",
        samples,
    );
    by_hand_remote.print(
        "the same two commands by hand, driver on a thread of its own",
        samples,
    );
}
