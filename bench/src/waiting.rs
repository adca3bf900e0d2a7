//! Item 4: the Redis commands one blocked waiter sends per second behind a live holder.
//!
//! The holder is the benchmark itself: `SET key holder PX 3000`, renewed with `PEXPIRE` every
//! second (a 3 s lease renewed at a third of it, as a lease keeper does). `MONITOR` tells who
//! sent what, so the holder's renewals and the markers are left out, and so are commands run
//! inside scripts (one script call is one command on the wire). The count starts after a
//! settling time (subscribing, the first attempts) and covers a fixed window.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::libs::{Client, Lib, PerLib};
use crate::redis_stats::Monitor;

/// The holder's lease.
pub const HOLDER_TTL: Duration = Duration::from_secs(3);
const SETTLE: Duration = Duration::from_millis(500);

#[derive(Clone, Debug, Default)]
pub struct Waiting {
    pub window: Duration,
    /// Commands sent in the window, per command name.
    pub commands: BTreeMap<String, u64>,
    /// Commands sent while starting to wait (before the window).
    pub setup: BTreeMap<String, u64>,
}

impl Waiting {
    pub fn per_second(&self) -> f64 {
        self.commands.values().sum::<u64>() as f64 / self.window.as_secs_f64()
    }

    pub fn breakdown(map: &BTreeMap<String, u64>) -> String {
        if map.is_empty() {
            return "none".to_owned();
        }
        map.iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

pub async fn measure(url: &str, port: u16, window: Duration) -> PerLib<Waiting> {
    let monitor = Monitor::start(port);
    let mut ctl = lock_tests::raw(url).await;
    let info: String = redis::cmd("CLIENT")
        .arg("INFO")
        .query_async(&mut ctl)
        .await
        .expect("CLIENT INFO");
    let ctl_addr: Vec<String> = info
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("addr="))
        .map(str::to_owned)
        .into_iter()
        .collect();
    let ttl_ms = u64::try_from(HOLDER_TTL.as_millis()).expect("small");
    for lib in Lib::ALL {
        let key = format!("wait:{}", lib.id());
        let lock_key = match lib {
            Lib::Runtime => format!("lock:{key}"),
            Lib::Rslock | Lib::Arl => key.clone(),
        };
        let waiter = Client::connect(lib, url).await;
        waiter.cycle("wait:warm").await.expect("warm-up");
        let () = redis::cmd("SET")
            .arg(&lock_key)
            .arg("bench-holder")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut ctl)
            .await
            .expect("SET holder");
        let mut renew_con = ctl.clone();
        let renewing_key = lock_key.clone();
        let holder = tokio::spawn(async move {
            loop {
                tokio::time::sleep(HOLDER_TTL / 3).await;
                let _: i64 = redis::cmd("PEXPIRE")
                    .arg(&renewing_key)
                    .arg(ttl_ms)
                    .query_async(&mut renew_con)
                    .await
                    .expect("PEXPIRE");
            }
        });
        mark(&mut ctl, &format!("bench-setup-{}", lib.id())).await;
        let waiter_key = key.clone();
        let waiting = tokio::spawn(async move {
            let outcome = waiter
                .acquire(&waiter_key, HOLDER_TTL, Duration::from_secs(3600))
                .await;
            panic!("the waiter should still be waiting: {}", outcome.is_ok());
        });
        tokio::time::sleep(SETTLE).await;
        mark(&mut ctl, &format!("bench-start-{}", lib.id())).await;
        tokio::time::sleep(window).await;
        mark(&mut ctl, &format!("bench-end-{}", lib.id())).await;
        waiting.abort();
        holder.abort();
        let _ = waiting.await;
        let _ = holder.await;
        let _: i64 = redis::cmd("DEL")
            .arg(&lock_key)
            .query_async(&mut ctl)
            .await
            .expect("DEL");
    }
    let monitor = tokio::task::spawn_blocking(move || {
        let mut out = PerLib::<Waiting>::default();
        for lib in Lib::ALL {
            let id = lib.id();
            *out.get_mut(lib) = Waiting {
                window,
                setup: monitor.count_between(
                    &format!("bench-setup-{id}"),
                    &format!("bench-start-{id}"),
                    &ctl_addr,
                ),
                commands: monitor.count_between(
                    &format!("bench-start-{id}"),
                    &format!("bench-end-{id}"),
                    &ctl_addr,
                ),
            };
        }
        out
    });
    monitor.await.expect("count MONITOR lines")
}

async fn mark(con: &mut MultiplexedConnection, text: &str) {
    let _: String = redis::cmd("ECHO")
        .arg(text)
        .query_async(con)
        .await
        .expect("ECHO");
}
