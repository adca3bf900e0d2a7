use lock_runtime::LockError;

#[allow(unused_imports)]
mod renamed {
    pub use lock_runtime as runtime;
}

#[lock_runtime::distributed_lock(key = "job", crate = "crate::renamed::rt")]
async fn wrong_path() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
