#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

// "1","23" and "12","3" would render the same key.
#[distributed_lock(key = "job:<a><b>")]
async fn adjacent(a: u32, b: u32) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job:<a>-<b>")]
async fn no_separator(a: u32, b: u32) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
