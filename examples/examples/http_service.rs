//! An HTTP service whose handler is the locked fn: `POST /orders/{id}/pay` under
//! `#[distributed_lock(key = "order:<order_id>")]`.
//!
//! `cargo run --release -p lock-examples --example http_service`. Without
//! `LOCK_REDIS_URL`/`REDIS_URL` it starts a throwaway redis-server. The example serves on a free
//! loopback port, sends its own concurrent requests with a small hand-written HTTP/1.1 client,
//! prints the answers, and exits non-zero unless:
//!
//! - concurrent payments for the same order ran one after another (and got increasing fencing
//!   tokens),
//! - payments for different orders ran at the same time,
//! - a payment for an order that another replica keeps locked longer than the handler waits
//!   is answered `409 Conflict` with a `Retry-After` header (the holder's remaining lease in
//!   seconds, rounded up),
//! - `GET /metrics` (the `metrics` feature, rendered by `metrics-exporter-prometheus`) counts
//!   exactly those payments under the handler's key template `order:<order_id>`: 6 acquired,
//!   1 busy, 6 holds of at least the provider's 150 ms each, none held now,
//! - the service's leader-only job (an order sweeper, one replica at a time) answers
//!   `GET /ready` 503 while another replica leads and 200 once this one does, `GET /live` 200
//!   throughout, and `/metrics` shows this replica leading one term won.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use lock_runtime::{distributed_lock, Election, LockError, Registry};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long a payment takes at the provider.
const PROVIDER_CALL: Duration = Duration::from_millis(150);
/// The handler's `wait`, repeated for the printout.
const WAIT: Duration = Duration::from_secs(3);

/// What the service remembers of each payment it ran, for the checks.
#[derive(Clone, Default)]
struct App {
    runs: Arc<Mutex<Vec<Run>>>,
    in_flight: Arc<Mutex<(usize, usize)>>,
    /// While set, every payment waits here (holding its order's lock) until the others arrive:
    /// it can only open if the locks of different orders are held at the same time.
    rendezvous: Arc<Mutex<Option<Arc<tokio::sync::Barrier>>>>,
}

#[derive(Clone, Debug)]
struct Run {
    order: u64,
    fence: u64,
    started: Instant,
    ended: Instant,
}

/// The errors the handler can return; each is its own HTTP answer.
#[derive(Debug)]
enum ApiError {
    /// Another request or replica holds the order's lock.
    Busy { retry_after: Option<Duration> },
    /// Redis failed, or the lease was lost mid-payment.
    Unavailable(String),
}

impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        match e {
            LockError::Busy { retry_after, .. } => Self::Busy { retry_after },
            other => Self::Unavailable(other.to_string()),
        }
    }
}

/// `Retry-After` is whole seconds: round up, so a client that obeys never comes back early.
fn retry_after_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            Self::Busy {
                retry_after: Some(after),
            } => (
                StatusCode::CONFLICT,
                [(header::RETRY_AFTER, retry_after_secs(after).to_string())],
                "this order is being paid elsewhere; retry later\n",
            )
                .into_response(),
            // A lock with no expiry (written by another client): no honest hint to give.
            Self::Busy { retry_after: None } => {
                (StatusCode::CONFLICT, "this order is being paid elsewhere\n").into_response()
            }
            Self::Unavailable(why) => {
                (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response()
            }
        }
    }
}

/// The handler: axum's extractors are its parameters, the key comes from the path. Payments for
/// one order queue up for at most `wait`; then the caller gets 409.
#[distributed_lock(key = "order:<order_id>", ttl = "10s", wait = "3s", fencing = true)]
async fn pay(State(app): State<App>, Path(order_id): Path<u64>) -> Result<String, ApiError> {
    let fence = lock_runtime::current()
        .and_then(|held| held.fence())
        .expect("fencing = true");
    let started = Instant::now();
    {
        let mut in_flight = app.in_flight.lock().unwrap();
        in_flight.0 += 1;
        in_flight.1 = in_flight.1.max(in_flight.0);
    }
    let rendezvous = app.rendezvous.lock().unwrap().clone();
    if let Some(all_here) = rendezvous {
        if tokio::time::timeout(WAIT, all_here.wait()).await.is_err() {
            app.in_flight.lock().unwrap().0 -= 1;
            return Err(ApiError::Unavailable(
                "the other orders' payments never ran alongside this one".to_owned(),
            ));
        }
    }
    // The payment provider; it would get `fence` to reject a stale holder's late request.
    tokio::time::sleep(PROVIDER_CALL).await;
    app.in_flight.lock().unwrap().0 -= 1;
    app.runs.lock().unwrap().push(Run {
        order: order_id,
        fence,
        started,
        ended: Instant::now(),
    });
    Ok(format!("paid order {order_id} (fence {fence})\n"))
}

/// With `HTTP_SERVICE_LOAD_FOR=SECONDS`, after the checks: keeps serving for that long while
/// eight clients pay four orders (they queue, some wait past `WAIT` and get 409) and the
/// sweeper's leader steps down every 20 s, so that a dashboard scraping `/metrics` has
/// something to show (`scripts/dashboard-picture`).
async fn load(addr: SocketAddr, sweeper: &Election, duration: Duration) {
    println!(
        "load: serving on http://{addr} for {} s",
        duration.as_secs()
    );
    let until = Instant::now() + duration;
    let clients: Vec<_> = (0..8u64)
        .map(|client| {
            tokio::spawn(async move {
                let mut order = client;
                while Instant::now() < until {
                    order = (order * 7 + 3) % 4;
                    let _ = http_post(addr, &format!("/orders/{}/pay", 10 + order)).await;
                }
            })
        })
        .collect();
    let standby = sweeper.clone().identity("replica-3");
    let standing_by = tokio::spawn({
        let standby = standby.clone();
        async move {
            standby
                .lead(|_term| std::future::pending::<Result<(), std::io::Error>>())
                .await
        }
    });
    while Instant::now() + Duration::from_secs(20) < until {
        tokio::time::sleep(Duration::from_secs(20)).await;
        // Whichever of the two leads hands the term to the other.
        for candidate in [sweeper, &standby] {
            if let Ok(Some(_)) = candidate.step_down(Duration::from_secs(1)).await {
                break;
            }
        }
    }
    for client in clients {
        let _ = client.await;
    }
    standing_by.abort();
}

/// An orchestrator's probe of the sweeper's election: 200 when `check` holds, else 503. Ready:
/// this replica leads (a standby is healthy, never restarted for being one). Live: not at risk,
/// and no term's work outlived its term.
fn probe(
    election: Election,
    check: fn(&Election) -> bool,
) -> impl Fn() -> std::future::Ready<StatusCode> + Clone {
    move || {
        std::future::ready(if check(&election) {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        })
    }
}

/// An HTTP answer as the tiny client reads it.
#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

/// `POST path` with HTTP/1.1 over a fresh connection.
async fn http_post(addr: SocketAddr, path: &str) -> std::io::Result<Answer> {
    http(addr, "POST", path).await
}

/// `method path` with HTTP/1.1 over a fresh connection, `Connection: close`, so the answer is
/// everything until the server closes.
async fn http(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let bad = || std::io::Error::other(format!("not an HTTP answer: {text:?}"));
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let retry_after = lines.find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("retry-after")
            .then(|| value.trim().to_owned())
    });
    Ok(Answer {
        status,
        retry_after,
        body: body.trim().to_owned(),
    })
}

/// Sends all `paths` at once and returns the answers in order.
async fn post_all(addr: SocketAddr, paths: &[String]) -> Vec<Answer> {
    let requests: Vec<_> = paths
        .iter()
        .map(|path| {
            let path = path.clone();
            tokio::spawn(async move { http_post(addr, &path).await })
        })
        .collect();
    let mut answers = Vec::new();
    for request in requests {
        answers.push(request.await.expect("request task").expect("HTTP request"));
    }
    answers
}

#[tokio::main]
async fn main() {
    let (_server, url) = lock_examples::redis_url();
    // Installed before the first lock: the library reports through whatever recorder is.
    // Buckets for the `*_seconds` histograms, so that a dashboard can sum quantiles over
    // replicas (`dashboards/distributed-lock.json` reads the `_bucket` series).
    let metrics = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Prefix("distributed_lock_".to_owned()),
            lock_runtime::SECONDS_BUCKETS,
        )
        .expect("buckets")
        .install_recorder()
        .expect("the process's only metrics recorder");
    let registry = Registry::from_url(&url).expect("a valid Redis URL");
    registry.install_default();
    // A leader-only job: one replica at a time sweeps abandoned orders.
    let sweeper = registry
        .election("order-sweeper")
        .identity("replica-1")
        .ttl(Duration::from_secs(10));

    let app = App::default();
    let router = Router::new()
        .route("/orders/{order_id}/pay", post(pay))
        .route("/metrics", get(move || async move { metrics.render() }))
        .route("/ready", get(probe(sweeper.clone(), Election::is_leader)))
        .route("/live", get(probe(sweeper.clone(), Election::is_live)))
        .with_state(app.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    println!(
        "payment service on http://{addr}: POST /orders/{{id}}/pay, locked on order:<id>, \
         waits up to {} s for a busy order; GET /metrics\n",
        WAIT.as_secs()
    );
    let mut failures = Vec::new();
    let runs_of = |order: u64| -> Vec<Run> {
        let mut runs: Vec<Run> = app
            .runs
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.order == order)
            .cloned()
            .collect();
        runs.sort_by_key(|r| r.started);
        runs
    };
    let started = Instant::now();
    let at = |t: Instant| (t - started).as_secs_f64();

    // 1. The same order, three times at once: they queue on the lock.
    let same = 1;
    let paths: Vec<String> = (0..3).map(|_| format!("/orders/{same}/pay")).collect();
    println!("3 payments for order {same} at once:");
    let answers = post_all(addr, &paths).await;
    for a in &answers {
        println!("  {} {}", a.status, a.body);
    }
    let runs = runs_of(same);
    for r in &runs {
        println!(
            "  ran {:.2}-{:.2} s with fence {}",
            at(r.started),
            at(r.ended),
            r.fence
        );
    }
    if answers.iter().any(|a| a.status != 200) || runs.len() != 3 {
        failures.push(format!("order {same}: not every payment succeeded"));
    }
    let serialized = runs
        .windows(2)
        .all(|w| w[0].ended <= w[1].started && w[0].fence < w[1].fence);
    if !serialized {
        failures.push(format!("order {same}: two payments overlapped"));
    }
    println!(
        "  -> {}\n",
        if serialized {
            "one after another, fencing tokens increasing"
        } else {
            "OVERLAPPED"
        }
    );

    // 2. Three different orders at once: three different locks, no waiting.
    let orders: Vec<u64> = vec![2, 3, 4];
    let paths: Vec<String> = orders.iter().map(|o| format!("/orders/{o}/pay")).collect();
    println!(
        "payments for orders {} at once:",
        orders
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    *app.in_flight.lock().unwrap() = (0, 0);
    *app.rendezvous.lock().unwrap() = Some(Arc::new(tokio::sync::Barrier::new(orders.len())));
    let answers = post_all(addr, &paths).await;
    *app.rendezvous.lock().unwrap() = None;
    for a in &answers {
        println!("  {} {}", a.status, a.body);
    }
    let most_at_once = app.in_flight.lock().unwrap().1;
    if answers.iter().any(|a| a.status != 200) {
        failures.push("different orders: not every payment succeeded".to_owned());
    }
    // Each payment waited at the rendezvous while holding its own order's lock, so every 200
    // above means all three locks were held at once; the count is the same fact seen locally.
    if most_at_once < orders.len() {
        failures.push("different orders did not run at the same time".to_owned());
    }
    println!("  -> in parallel: {most_at_once} payments in flight at once\n");

    // 3. Another replica is paying order 5 and keeps it longer than the handler waits.
    let busy = 5;
    let other_replica = Registry::builder()
        .url(&url)
        .name("other-replica")
        .build()
        .expect("a valid Redis URL");
    let held = other_replica
        .lock(format!("order:{busy}"))
        .ttl(Duration::from_secs(20))
        // No renewal: its remaining lease only shrinks, so the check below is exact.
        .renew(false)
        .acquire()
        .await
        .expect("the other replica takes order 5");
    println!("order {busy} while another replica holds order:{busy} (lease 20 s):");
    let answer = http_post(addr, &format!("/orders/{busy}/pay"))
        .await
        .expect("HTTP request");
    let left = other_replica
        .inspect(&format!("order:{busy}"))
        .await
        .expect("inspect")
        .remaining
        .unwrap_or_default();
    println!(
        "  {} Retry-After: {}  {}",
        answer.status,
        answer.retry_after.as_deref().unwrap_or("(none)"),
        answer.body
    );
    let retry_after: Option<u64> = answer.retry_after.as_deref().and_then(|v| v.parse().ok());
    match (answer.status, retry_after) {
        // The hint was the lease left at the handler's last attempt, rounded up: at least
        // what is left now, never more than the lease.
        (409, Some(secs)) if secs >= retry_after_secs(left) && secs <= 20 => println!(
            "  -> busy after waiting {} s: 409, come back in {secs} s (the holder has {:.1} s \
             left)\n",
            WAIT.as_secs(),
            left.as_secs_f64()
        ),
        _ => failures.push(format!(
            "order {busy}: expected 409 with Retry-After >= {} s, got {} {:?}",
            retry_after_secs(left),
            answer.status,
            answer.retry_after
        )),
    }
    held.release().await.expect("the other replica releases");

    // 4. What the service's own metrics say about all of the above.
    let scrape = http(addr, "GET", "/metrics")
        .await
        .expect("HTTP request")
        .body;
    let sample = |name: &str, outcome: &str| -> f64 {
        let labels = r#"registry="default",lock="order:<order_id>""#;
        let labels = if outcome.is_empty() {
            format!("{{{labels}}} ")
        } else {
            format!("{{{labels},outcome=\"{outcome}\"}} ")
        };
        scrape
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}{labels}")))
            .and_then(|value| value.parse().ok())
            .unwrap_or(-1.0)
    };
    let acquired = sample("distributed_lock_acquisitions_total", "acquired");
    let busy_seen = sample("distributed_lock_acquisitions_total", "busy");
    let holds = sample("distributed_lock_hold_seconds_count", "");
    let held_for = sample("distributed_lock_hold_seconds_sum", "");
    let held_now = sample("distributed_lock_held", "");
    println!(
        "GET /metrics for order:<order_id>: {acquired} acquired, {busy_seen} busy, {holds} holds \
         totalling {held_for:.2} s, {held_now} held now"
    );
    let least = 6.0 * PROVIDER_CALL.as_secs_f64();
    if acquired != 6.0 || busy_seen != 1.0 || holds != 6.0 || held_for < least || held_now != 0.0 {
        failures.push(format!(
            "/metrics: expected 6 acquired, 1 busy, 6 holds of >= {least:.2} s in all and none \
             held now:\n{scrape}"
        ));
    }

    // 5. The sweeper: the other replica leads first, so this one is a live standby, not ready;
    // once the other resigns (a rolling deploy, say), this one leads and is ready.
    let theirs = other_replica
        .election("order-sweeper")
        .identity("replica-2")
        .ttl(Duration::from_secs(10))
        .campaign()
        .await
        .expect("the other replica leads the sweeper");
    let leading = tokio::spawn({
        let sweeper = sweeper.clone();
        async move {
            sweeper
                .lead(|_term| async {
                    // ... sweep abandoned orders, for as long as the term lasts ...
                    std::future::pending::<Result<(), std::io::Error>>().await
                })
                .await
        }
    });
    let probes = |when: &'static str| async move {
        let ready = http(addr, "GET", "/ready")
            .await
            .expect("HTTP request")
            .status;
        let live = http(addr, "GET", "/live")
            .await
            .expect("HTTP request")
            .status;
        println!("  {when}: GET /ready {ready}, GET /live {live}");
        (ready, live)
    };
    println!("the order sweeper, a leader-only job:");
    if probes("while replica-2 leads").await != (503, 200) {
        failures.push("a standby must answer /ready 503 and /live 200".to_owned());
    }
    theirs.resign().await.expect("the other replica resigns");
    let mut observer = sweeper.observe();
    let elected = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match observer.next().await {
                Ok(Some(leader)) if leader.identity == "replica-1" => return true,
                Ok(_) => {}
                Err(e) => println!("  observing: {e}"),
            }
        }
    })
    .await
    .unwrap_or(false);
    if !elected || probes("once replica-1 leads").await != (200, 200) {
        failures.push("the leader must answer /ready 200 and /live 200".to_owned());
    }
    let scrape = http(addr, "GET", "/metrics")
        .await
        .expect("HTTP request")
        .body;
    let labels = r#"{registry="default",election="order-sweeper"} "#;
    let sweeper_sample = |name: &str| {
        scrape
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}{labels}")))
            .and_then(|value| value.parse::<f64>().ok())
            .unwrap_or(-1.0)
    };
    let (leader, won) = (
        sweeper_sample("distributed_lock_leader"),
        sweeper_sample("distributed_lock_terms_won_total"),
    );
    println!("  -> GET /metrics: distributed_lock_leader {leader}, terms won {won}\n");
    if leader != 1.0 || won != 1.0 {
        failures.push(format!(
            "/metrics: expected this replica leading the sweeper after one term won:\n{scrape}"
        ));
    }
    if let Some(seconds) = std::env::var("HTTP_SERVICE_LOAD_FOR")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        load(addr, &sweeper, Duration::from_secs(seconds)).await;
    }
    leading.abort();

    let _ = stop.send(());
    server.await.expect("server task").expect("serve");
    if !failures.is_empty() {
        for failure in &failures {
            println!("CHECK FAILED: {failure}");
        }
        std::process::exit(1);
    }
    println!(
        "one attribute on the handler: same order serialized, different orders in parallel, \
         busy answered 409 with Retry-After, all of it counted on /metrics; the sweeper's \
         replica ready only while it leads."
    );
}
