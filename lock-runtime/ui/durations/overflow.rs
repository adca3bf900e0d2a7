#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl = "8761h")]
async fn beyond_the_bound() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", wait = "18446744073709551616ms")]
async fn beyond_u64() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
