#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

// A lease's local deadline is ttl minus ttl/100 + 2 ms: below 10 ms it would be lost at once.
#[distributed_lock(key = "job", ttl = "9ms")]
async fn too_short() -> Result<(), LockError> {
    Ok(())
}

// The minimum itself is accepted.
#[distributed_lock(key = "job", ttl = "10ms")]
async fn shortest() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
