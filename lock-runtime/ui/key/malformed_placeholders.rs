#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job:<>")]
async fn empty(id: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job:<id")]
async fn unclosed(id: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job:<req.>:<a b>")]
async fn bad_paths(req: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "")]
async fn empty_key() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
