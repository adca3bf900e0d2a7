#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", registry = "")]
async fn empty_registry() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", crate = "lock runtime")]
async fn not_a_path() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
