#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job:<id>", ttl = "60s", ttl = "90s")]
async fn twice(id: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
