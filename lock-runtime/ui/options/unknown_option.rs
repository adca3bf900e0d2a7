#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job:<id>", tll = "60s")]
async fn typo(id: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job:<id>", timeout = "60s")]
async fn unrelated(id: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
