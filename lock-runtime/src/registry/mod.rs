//! Registries: the handle, how one is built (in code or from the environment), and the
//! process-wide default and named ones.

mod builder;
mod env;
mod globals;
mod handle;

pub use builder::RegistryBuilder;
pub use globals::{named, registry};
pub use handle::{HeldLock, Registry};
