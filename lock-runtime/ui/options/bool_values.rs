#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", renew = "false", fencing = 1)]
async fn quoted_bool() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", fencing)]
async fn bare_flag() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
