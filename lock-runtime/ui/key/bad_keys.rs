#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
// `keys` is an array of key templates, not beside `key`, and exclusive only.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "account:<from>", keys = ["account:<from>", "account:<to>"])]
async fn both_key_and_keys(from: u64, to: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(keys = [])]
async fn no_keys() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(keys = "account:<from>")]
async fn not_an_array(from: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(keys = ["account:<from>", 7])]
async fn not_a_template(from: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(keys = ["account:<from>", "account:<too>"])]
async fn unknown_placeholder(from: u64, to: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], mode = "read")]
async fn shared_keys(from: u64, to: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
