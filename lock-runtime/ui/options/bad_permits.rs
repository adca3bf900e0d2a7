#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
// A semaphore's size: a whole number of at least 1, written as a literal, and not with fencing.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "pool", permits = 0)]
async fn no_permits() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "pool", permits = "4")]
async fn quoted() -> Result<(), LockError> {
    Ok(())
}

const SIZE: u32 = 4;

#[distributed_lock(key = "pool", permits = SIZE)]
async fn not_a_literal() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "pool", permits = 5000000000)]
async fn too_many() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "pool", permits = 4, fencing = true)]
async fn fenced_permits() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
