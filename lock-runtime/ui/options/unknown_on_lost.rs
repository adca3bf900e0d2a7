#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", on_lost = "abort")]
async fn abort() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
