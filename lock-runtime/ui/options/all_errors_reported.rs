#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
// One build reports every mistake in the attribute, and the fn still exists for the caller.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job:<jobid>", ttl = "0s", wait = "5 s", on_lost = "retry", fencing = "yes")]
async fn many_mistakes(job_id: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {
    // No error here: the original fn is still emitted next to the errors.
    let _future = many_mistakes(1);
}
