#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl = "60sec", wait = "1d", min_hold = "60", max_hold = "1.5h")]
async fn units() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
