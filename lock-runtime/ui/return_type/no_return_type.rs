#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::distributed_lock;

#[distributed_lock(key = "job:<id>")]
async fn returns_unit(id: u64) {}

fn main() {}
