//! The second process of `attr_locking::processes_never_hold_the_same_key_at_once`: calls an
//! annotated fn on the same key as the test and exits 0 when the outcome is the expected one.
//! Usage: `attr-cron <redis-url> busy|acquired`.

use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "cron:<job>", registry = "attr_processes")]
async fn cron(job: &str) -> Result<u32, LockError> {
    Ok(std::process::id())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (url, expect) = (
        args.next().expect("url"),
        args.next().expect("busy|acquired"),
    );
    lock_runtime::Registry::from_url(&url)
        .expect("registry")
        .install_as("attr_processes");
    match (expect.as_str(), cron("backup").await) {
        ("busy", Err(LockError::Busy { .. })) => println!("busy, as expected"),
        ("acquired", Ok(pid)) if pid == std::process::id() => println!("acquired in pid {pid}"),
        (expect, outcome) => {
            eprintln!("expected {expect}, got {outcome:?}");
            std::process::exit(1);
        }
    }
}
