use lock_runtime::{distributed_lock, LockError};

struct Connection;

// Each term runs the body afresh on clones of the arguments: one that is not `Clone` is
// reported on its name.
#[distributed_lock(key = "scheduler", leader = true)]
async fn scheduler(connection: Connection) -> Result<(), LockError> {
    let _ = connection;
    Ok(())
}

// A leader's loop ends with `Ok(())` at shutdown: it returns nothing else.
#[distributed_lock(key = "reporter", leader = true)]
async fn reporter() -> Result<u32, LockError> {
    Ok(1)
}

fn main() {}
