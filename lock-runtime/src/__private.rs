//! What `#[distributed_lock]` expands to, and what `lockctl` shares with the library. Not
//! public API: only the macro, `lockctl` (and their tests) may use it.

use std::future::Future;

pub use crate::key::KeyBuilder;
pub use crate::{error::LockError, options::LockOptions, options::Mode, options::OnLost};
pub use core::time::Duration;

/// A Postgres connection string as tokio-postgres can read it, as the library reads it: libpq's
/// `sslmode=verify-full` and `verify-ca` (the parameter only, never a password that spells one)
/// as `require`, which checks the server's certificate.
#[cfg(feature = "postgres")]
#[must_use]
pub fn postgres_readable(url: &str) -> String {
    crate::backend::postgres::tls::readable(url)
}

/// Looks up the registry (`None`: the default) and runs `body` under the lock, exactly as
/// `registry.lock_all(keys).options(options).run(body)` does (one key: a plain lock).
///
/// Generic over the fn's return type `R` rather than over `Result<T, E>`: a return type that is
/// not a [`LockResult`] then fails only the `R: LockResult` bound, with its
/// `on_unimplemented` message, instead of adding type-mismatch errors about the async block.
///
/// # Errors
/// As [`LockRequest::run`](crate::LockRequest::run), plus [`LockError::NotConfigured`].
pub async fn run<R, F>(
    registry: Option<&'static str>,
    keys: Vec<String>,
    options: LockOptions,
    body: F,
) -> R
where
    R: LockResult,
    F: Future<Output = R>,
{
    let result = match lookup(registry) {
        Ok(registry) => {
            registry
                .lock_all(keys)
                .options(options)
                .run(async move { body.await.into_result() })
                .await
        }
        Err(error) => Err(error.into()),
    };
    R::from_result(result)
}

/// The registry an attribute names (`None`: the default).
fn lookup(registry: Option<&'static str>) -> Result<crate::registry::Registry, LockError> {
    match registry {
        None => crate::registry(),
        Some(name) => crate::registry::named(name),
    }
}

/// The return type of a `#[distributed_lock]` fn: a `Result` whose error a [`LockError`]
/// converts into.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` needs the fn to return `Result<T, E>` where `E: From<lock_runtime::LockError>`, not `{Self}`",
    label = "lock failures (busy, lost, Redis down) must be able to return through this type",
    note = "return `Result<_, E>` and implement `From<lock_runtime::LockError>` for `E` (thiserror: `#[error(transparent)] Lock(#[from] lock_runtime::LockError)`)"
)]
pub trait LockResult: Sized {
    /// The success type.
    type Ok;
    /// The error type.
    type Err: From<LockError>;
    /// As a `Result`.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
    /// Back from a `Result`.
    fn from_result(result: Result<Self::Ok, Self::Err>) -> Self;
}

impl<T, E: From<LockError>> LockResult for Result<T, E> {
    type Ok = T;
    type Err = E;

    fn into_result(self) -> Self {
        self
    }

    fn from_result(result: Self) -> Self {
        result
    }
}

/// Compile-time check that `R` is a [`LockResult`], quoted at the user's return type.
pub const fn assert_lock_result<R: LockResult>() {}

/// The shortest lease, which the attribute enforces at compile time with a copy of it.
pub const MIN_TTL: Duration = crate::options::MIN_TTL;

/// The longest lease, which the attribute enforces at compile time with a copy of it.
pub const MAX_TTL: Duration = crate::options::MAX_TTL;

/// Looks up the registry (`None`: the default) and leads the election on `key` whenever
/// elected, running `work` for each term, as [`Election::lead`](crate::Election::lead) does,
/// with the registry's identity and `ttl` when given. Ends with `Ok(())` at shutdown.
///
/// # Errors
/// As [`Election::lead`](crate::Election::lead), plus [`LockError::NotConfigured`].
pub async fn lead<R, F, Fut>(
    registry: Option<&'static str>,
    key: String,
    ttl: Option<Duration>,
    mut work: F,
) -> R
where
    R: LockResult<Ok = ()>,
    R::Err: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
{
    let result = match lookup(registry) {
        Ok(registry) => {
            let mut election = registry.election(key);
            if let Some(ttl) = ttl {
                election = election.ttl(ttl);
            }
            election
                .lead(|_| {
                    let term = work();
                    async move { term.await.into_result() }
                })
                .await
                .map_err(Into::into)
        }
        Err(error) => Err(error.into()),
    };
    R::from_result(result)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// The attribute checks options at compile time against its own copies of the runtime's
    /// default and bounds: they must agree.
    #[test]
    fn the_attributes_default_ttl_and_bounds_are_the_runtimes() {
        let (default, min, max): (u64, u64, u64) = lock_macros::__limits!();
        assert_eq!(
            Duration::from_millis(default),
            crate::LockOptions::new().get_ttl(),
            "default ttl"
        );
        assert_eq!(Duration::from_millis(min), super::MIN_TTL, "shortest ttl");
        assert_eq!(
            Duration::from_millis(max),
            super::MAX_TTL,
            "longest duration"
        );
    }
}
