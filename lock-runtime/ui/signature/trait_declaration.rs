#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::{distributed_lock, LockError};

trait Job {
    #[distributed_lock(key = "job:<id>")]
    async fn run(&self, id: u64) -> Result<(), LockError>;
}

fn main() {}
