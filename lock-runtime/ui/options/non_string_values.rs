#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = job, ttl = 60s, wait = 5, registry = jobs, on_lost = cancel, crate = lock_runtime)]
async fn unquoted(job: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
