#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

struct Request {
    id: u64,
}

struct NoDisplay;

#[distributed_lock(key = "req:<req.user>")]
async fn missing_field(req: Request) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "thing:<thing>")]
async fn not_display(thing: NoDisplay) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
