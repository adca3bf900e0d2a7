#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::distributed_lock;

#[derive(Debug)]
struct DeployError;

#[distributed_lock(key = "deploy:<id>")]
async fn deploy(id: u64) -> Result<(), DeployError> {
    Ok(())
}

fn main() {}
