//! The benchmark of lock-runtime against the Rust peers `rslock` 0.10.0 and
//! `async-redis-lock` 0.4.0, on a throwaway redis-server, all in one run.
//!
//! ```text
//! cargo run --release -p lock-bench            # full run (~3.5 minutes): bench/results.md, bench/latency.svg
//! cargo run --release -p lock-bench -- --quick # shorter windows, fewer samples; files go to a temp dir
//! cargo run --release -p lock-bench -- --only 1,2,3
//! LOCK_TEST_SERVER=$(scripts/ensure-redis --valkey) cargo run --release -p lock-bench -- --renew-ifeq
//! cargo run --release -p lock-bench -- --postgres [--quick]   # the Postgres store against advisory locks
//! cargo run --release -p lock-bench -- --spans [--quick]      # the lock spans' cost, with and without a subscriber
//! ```
//!
//! `--renew-ifeq` prints, on its own, a renewal's cost as the script against `SET .. IFEQ` on
//! a server that has both (see `ifeq`).
//!
//! Not part of the test suite: it prints figures, it does not pass or fail.

mod attribute;
mod chart;
mod contention;
mod handoff;
mod ifeq;
mod libs;
mod memory;
mod postgres;
mod procfs;
mod redis_stats;
mod renewal;
mod report;
mod spans;
mod stats;
mod throughput;
mod uncontended;
mod waiting;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use libs::{Lib, PerLib};
use report::Results;

/// How long and how often each item measures.
struct Plan {
    quick: bool,
    only: Option<Vec<u32>>,
    out: Option<PathBuf>,
    cycles: usize,
    handoffs_notified: usize,
    handoffs_polling: usize,
    waiting_window: Duration,
    throughput_tasks: [usize; 2],
    throughput_window: Duration,
    throughput_rounds: usize,
    contention_tasks: usize,
    contention_window: Duration,
    renewal_secs: u64,
    renewal_locks: usize,
    attribute_calls: usize,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            quick: false,
            only: None,
            out: None,
            cycles: 3000,
            handoffs_notified: 300,
            handoffs_polling: 40,
            waiting_window: Duration::from_secs(10),
            throughput_tasks: [64, 1024],
            throughput_window: Duration::from_secs(1),
            throughput_rounds: 3,
            contention_tasks: 32,
            contention_window: Duration::from_secs(3),
            renewal_secs: 30,
            renewal_locks: 10_000,
            attribute_calls: 3000,
        }
    }

    fn quick(self) -> Plan {
        Plan {
            quick: true,
            cycles: 500,
            handoffs_notified: 60,
            handoffs_polling: 10,
            waiting_window: Duration::from_secs(3),
            throughput_window: Duration::from_millis(500),
            throughput_rounds: 1,
            contention_window: Duration::from_secs(1),
            renewal_secs: 5,
            attribute_calls: 500,
            ..self
        }
    }

    fn runs(&self, item: u32) -> bool {
        self.only.as_ref().is_none_or(|only| only.contains(&item))
    }

    /// Where results go: `bench/` for a full run, a temp dir otherwise (so a quick or partial
    /// run never overwrites the published figures), unless `--out` says.
    fn out_dir(&self) -> PathBuf {
        if let Some(out) = &self.out {
            return out.clone();
        }
        if self.quick || self.only.is_some() {
            std::env::temp_dir().join("lock-bench")
        } else {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        }
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: lock-bench [--quick] [--only 1,2,...] [--out DIR] | --renew-ifeq | --postgres [--quick] | --spans [--quick]\n\
         | --profile WHO TASKS SECS\n\
         | --profile wakeups SAMPLES\n\
         \n  --quick   shorter windows and fewer samples (under a minute)\
         \n  --only    run only these items (1-9; 1 and 2 run together, so do 7 and 9)\
         \n  --out     directory for results.md and latency.svg\
         \n  --renew-ifeq  only: renewal by script against SET IFEQ, on a server with both (Valkey)\
         \n  --spans       only: a lock cycle without a subscriber, filtered out, and recorded\
         \n  --profile     only: item 5 for one client alone (runtime, rslock, arl, or raw: the\
         \n                protocol by hand), to run under a profiler; or `wakeups`: items 2 and 3\
         \n                for lock-runtime and by hand, with each thread's parkings per sample"
    );
    std::process::exit(2);
}

fn parse_args() -> Plan {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child-renewal") {
        renewal::child(&args[1..]);
        std::process::exit(0);
    }
    if args.first().map(String::as_str) == Some("--profile") {
        profile(&args[1..]);
        std::process::exit(0);
    }
    if args.first().map(String::as_str) == Some("--postgres") {
        postgres::run(args.get(1).map(String::as_str) == Some("--quick"));
        std::process::exit(0);
    }
    if args.first().map(String::as_str) == Some("--child-spans") {
        spans::child(&args[1..]);
        std::process::exit(0);
    }
    if args.first().map(String::as_str) == Some("--spans") {
        spans::run(args.get(1).map(String::as_str) == Some("--quick"));
        std::process::exit(0);
    }
    if args.first().map(String::as_str) == Some("--renew-ifeq") {
        ifeq::run();
        std::process::exit(0);
    }
    let mut plan = Plan::full();
    let mut quick = false;
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--only" => {
                let list = it.next().unwrap_or_else(|| usage());
                let items: Result<Vec<u32>, _> =
                    list.split(',').map(|s| s.trim().parse()).collect();
                plan.only = Some(items.unwrap_or_else(|_| usage()));
            }
            "--out" => plan.out = Some(PathBuf::from(it.next().unwrap_or_else(|| usage()))),
            _ => usage(),
        }
    }
    if quick {
        plan = plan.quick();
    }
    plan
}

/// `--profile WHO TASKS SECS`: item 5 for one client alone; `--profile wakeups SAMPLES`: items 2
/// and 3 with each thread's parkings. Under a multi-thread runtime as in the full run.
fn profile(args: &[String]) {
    let server = lock_tests::RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let url = server.url();
    match args {
        [what, samples] if what == "wakeups" => {
            let samples: usize = samples.parse().unwrap_or_else(|_| usage());
            runtime.block_on(async {
                handoff::profile(&url, server.pid(), samples).await;
                uncontended::profile(&url, server.pid(), samples).await;
            });
        }
        [who, tasks, secs] => {
            let tasks: usize = tasks.parse().unwrap_or_else(|_| usage());
            let secs: f64 = secs.parse().unwrap_or_else(|_| usage());
            runtime.block_on(throughput::profile(
                &url,
                who,
                tasks,
                Duration::from_secs_f64(secs),
            ));
        }
        _ => usage(),
    }
}

fn step(what: &str) {
    eprintln!("[lock-bench] {what}");
}

fn main() {
    let plan = parse_args();
    let load_before = procfs::loadavg();
    let started = Instant::now();
    let server = lock_tests::RedisServer::start();
    let url = server.url();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut results = runtime.block_on(measure(&plan, &url, server.port()));
    if plan.runs(7) || plan.runs(9) {
        let mut renewals = PerLib::default();
        for lib in Lib::ALL {
            step(&format!(
                "7, 9: {} locks held for {} s by {} (own process)",
                plan.renewal_locks,
                plan.renewal_secs,
                lib.name()
            ));
            *renewals.get_mut(lib) = renewal::run(lib, &url, plan.renewal_secs, plan.renewal_locks);
        }
        results.renewal = Some(renewals);
    }
    let load_after = procfs::loadavg();
    let elapsed = started.elapsed();
    drop(runtime);
    drop(server);

    let table = results.table();
    println!("{table}");
    let header = header(&plan, &load_before, &load_after, elapsed);
    let markdown = format!(
        "{header}\n{table}\n![latency](latency.svg)\n\n## Details\n\n{}{}",
        results.details(),
        report::METHOD
    );
    let out = plan.out_dir();
    std::fs::create_dir_all(&out).expect("create the output directory");
    let md = out.join("results.md");
    std::fs::write(&md, markdown).expect("write results.md");
    eprintln!("[lock-bench] wrote {}", md.display());
    if let (Some(u), Some(h)) = (&results.uncontended, &results.handoff) {
        let svg = out.join("latency.svg");
        chart::render(&svg, &u.rtt, &u.cycle, &h.samples, &h.cold_rtt).expect("render the chart");
        eprintln!("[lock-bench] wrote {}", svg.display());
    }
}

async fn measure(plan: &Plan, url: &str, port: u16) -> Results {
    let mut results = Results::default();
    if plan.runs(1) || plan.runs(2) {
        step(&format!(
            "1, 2: PING and uncontended cycle, {} rounds",
            plan.cycles
        ));
        results.uncontended = Some(uncontended::measure(url, plan.cycles).await);
    }
    if plan.runs(3) {
        step("3: handoff");
        results.handoff =
            Some(handoff::measure(url, plan.handoffs_notified, plan.handoffs_polling).await);
    }
    if plan.runs(4) {
        step(&format!(
            "4: waiting cost, {:?} per library",
            plan.waiting_window
        ));
        results.waiting = Some(waiting::measure(url, port, plan.waiting_window).await);
    }
    if plan.runs(5) {
        for tasks in plan.throughput_tasks {
            step(&format!("5: throughput with {tasks} tasks"));
            let t = throughput::measure(url, tasks, plan.throughput_window, plan.throughput_rounds)
                .await;
            results.throughput.push((tasks, t));
        }
    }
    if plan.runs(6) {
        step(&format!(
            "6: contention, {} tasks on one key",
            plan.contention_tasks
        ));
        let c = contention::measure(url, plan.contention_tasks, plan.contention_window).await;
        results.contention = Some((plan.contention_tasks, c));
    }
    if plan.runs(8) {
        step("8: attribute against the manual API");
        results.attribute = Some(attribute::measure(url, plan.attribute_calls).await);
    }
    results
}

fn header(plan: &Plan, load_before: &str, load_after: &str, elapsed: Duration) -> String {
    // The binary the fixture started (`LOCK_TEST_SERVER`, e.g. Valkey), by name and version.
    let binary = lock_tests::server_binary();
    let name = std::path::Path::new(&binary)
        .file_name()
        .map_or_else(|| binary.clone(), |n| n.to_string_lossy().into_owned());
    let redis = std::process::Command::new(&binary)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            v.split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(str::to_owned))
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(|| "unknown date".to_owned(), |d| d.trim().to_owned());
    format!(
        "# lock-bench results\n\n\
         `cargo run --release -p lock-bench`{quick} — {date}, {elapsed:.0} s. \
         {cpus} × {model}, {kernel}, {name} {redis} (own process, loopback, no persistence). \
         Load average (1/5/15 min) before: {load_before}; after: {load_after}.\n",
        quick = if plan.quick { " -- --quick" } else { "" },
        elapsed = elapsed.as_secs_f64(),
        cpus = procfs::cpus(),
        model = procfs::cpu_model(),
        kernel = procfs::kernel(),
    )
}
