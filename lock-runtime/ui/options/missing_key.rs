#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(ttl = "60s")]
async fn no_key(id: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock]
async fn no_arguments(id: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
