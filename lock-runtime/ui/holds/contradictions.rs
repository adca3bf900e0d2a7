#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

// The first lease already lasts `ttl`: a shorter `max_hold` could never take effect.
#[distributed_lock(key = "job", ttl = "60s", max_hold = "30s")]
async fn max_hold_shorter_than_ttl() -> Result<(), LockError> {
    Ok(())
}

// The default ttl is 30s.
#[distributed_lock(key = "job", max_hold = "10s")]
async fn max_hold_shorter_than_default_ttl() -> Result<(), LockError> {
    Ok(())
}

// Without renewal the key expires after `ttl`, whatever `min_hold` says.
#[distributed_lock(key = "job", ttl = "1m", renew = false, min_hold = "1h")]
async fn min_hold_beyond_unrenewed_ttl() -> Result<(), LockError> {
    Ok(())
}

// Nothing to limit when renewal is off.
#[distributed_lock(key = "job", renew = false, max_hold = "10m")]
async fn max_hold_without_renewal() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", min_hold = "1h", max_hold = "10m")]
async fn min_hold_beyond_max_hold() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
