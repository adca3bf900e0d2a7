//! `--spans`: what the lock spans cost (`lock_runtime::guide::tracing`). A lock cycle on the
//! in-memory store (nothing but the library's own work), under a caller's span, in a process of
//! its own per subscriber, as an application has it (one global subscriber, so the callsites'
//! interest is cached as it would be there):
//!
//! - `none`: no subscriber at all;
//! - `filtered`: a subscriber whose filter leaves the library's spans out (`WARN`);
//! - `recording`: a subscriber that records every span (`tracing-subscriber`'s registry: each
//!   span stored, its parent looked up, closed).
//!
//! The three run in turns, several rounds, and the medians are compared side by side.

use std::process::Command;
use std::time::{Duration, Instant};

use tracing::level_filters::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;

const KINDS: [&str; 3] = ["none", "filtered", "recording"];

/// The parent: runs each kind in a child process, in turns, and prints ns per cycle.
pub fn run(quick: bool) {
    let (rounds, cycles) = if quick { (3, 20_000) } else { (5, 200_000) };
    let exe = std::env::current_exe().expect("own path");
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); KINDS.len()];
    for round in 0..rounds {
        for (i, kind) in KINDS.iter().enumerate() {
            let out = Command::new(&exe)
                .args(["--child-spans", kind, &cycles.to_string()])
                .output()
                .expect("a child");
            assert!(out.status.success(), "{kind}: {out:?}");
            let line = String::from_utf8_lossy(&out.stdout);
            let per_cycle: f64 = line.trim().parse().expect("ns per cycle");
            eprintln!(
                "[lock-bench] spans round {}: {kind} {per_cycle:.0} ns",
                round + 1
            );
            ns[i].push(per_cycle);
        }
    }
    let medians: Vec<f64> = ns.iter_mut().map(|v| median(v)).collect();
    println!("lock cycle on the in-memory store, under a caller's span ({rounds} rounds of {cycles} cycles, medians):\n");
    println!("| subscriber | ns per cycle | against none |");
    println!("|---|---|---|");
    for (kind, m) in KINDS.iter().zip(&medians) {
        println!("| {kind} | {m:.0} | {:.3} |", m / medians[0]);
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A child: `cycles` lock cycles under the kind's global subscriber; prints ns per cycle.
pub fn child(args: &[String]) {
    let [kind, cycles] = args else {
        panic!("usage: --child-spans <none|filtered|recording> <cycles>");
    };
    let cycles: u32 = cycles.parse().expect("cycles");
    match kind.as_str() {
        "none" => {}
        "filtered" => tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(LevelFilter::WARN),
        )
        .expect("the only subscriber"),
        "recording" => tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(LevelFilter::INFO),
        )
        .expect("the only subscriber"),
        _ => panic!("unknown subscriber kind {kind}"),
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let took = runtime.block_on(async {
        let registry = lock_runtime::Registry::in_memory();
        let cycle = || async {
            let span = tracing::info_span!("request");
            tracing::Instrument::instrument(
                registry
                    .lock("bench:spans")
                    .template("bench:<kind>")
                    .run(async { Ok::<_, lock_runtime::LockError>(()) }),
                span,
            )
            .await
            .expect("an uncontended lock");
        };
        for _ in 0..cycles / 10 {
            cycle().await;
        }
        let started = Instant::now();
        for _ in 0..cycles {
            cycle().await;
        }
        started.elapsed()
    });
    println!("{}", per_cycle_ns(took, cycles));
}

fn per_cycle_ns(took: Duration, cycles: u32) -> f64 {
    took.as_nanos() as f64 / f64::from(cycles)
}
