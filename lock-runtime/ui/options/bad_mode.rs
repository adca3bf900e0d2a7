#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
// `mode` is "read" or "write"; readers take no permits and no fencing tokens.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "catalog", mode = "upgrade")]
async fn unknown_mode() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "catalog", mode = "read", permits = 2)]
async fn readers_with_permits() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "catalog", mode = "read", fencing = true)]
async fn fenced_reader() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
