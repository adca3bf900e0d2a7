#![allow(unused_variables)] // on error the fn is emitted unchanged, its parameters unused
use lock_runtime::distributed_lock;

#[distributed_lock(key = "job")]
struct Job;

fn main() {}
