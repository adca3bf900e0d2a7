#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

// Each option of a lock's tenure that a leader's term does not have, reported on its token.
#[distributed_lock(
    key = "scheduler",
    leader = true,
    wait = "5s",
    on_lost = "continue",
    min_hold = "1m",
    max_hold = "1h",
    fencing = true
)]
async fn scheduler() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "cron", leader = true, renew = false)]
async fn cron() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "reader", leader = true, mode = "read")]
async fn reader() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "pool", leader = true, permits = 2)]
async fn pool() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(keys = ["a", "b"], leader = true)]
async fn two_keys() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
