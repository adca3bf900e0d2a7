#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl = "0s", min_hold = "0ms", max_hold = "0h")]
async fn zero() -> Result<(), LockError> {
    Ok(())
}

// `wait = "0s"` is allowed: it means "try once".
#[distributed_lock(key = "job", wait = "0s")]
async fn try_once() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
