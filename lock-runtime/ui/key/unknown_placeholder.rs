#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "deploy:<idd>:<env>")]
async fn deploy(id: u64, env: &str) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "nightly:<date>")]
async fn nightly() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "tenant:<self.name>")]
async fn not_a_method(name: &str) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
