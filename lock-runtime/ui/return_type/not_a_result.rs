#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::distributed_lock;

#[distributed_lock(key = "job:<id>")]
async fn returns_count(id: u64) -> u32 {
    id as u32
}

fn main() {}
