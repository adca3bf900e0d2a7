#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key "job")]
async fn missing_equals() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
