//! The `#[distributed_lock]` attribute. Use it through `lock_runtime::distributed_lock`:
//! the expansion calls into `lock_runtime`, which re-exports this crate at an exact version.

mod args;
mod boxed;
mod ctxt;
mod duration;
mod expand;
mod template;
mod validate;

use proc_macro::TokenStream;

/// Runs an `async fn` while holding a Redis lock: renders the key from the arguments, acquires
/// the lock through the process-wide registry, renews it while the body runs and releases it
/// afterwards (also when the future is dropped).
///
/// Use it as `lock_runtime::distributed_lock`; the generated code calls into `lock_runtime`.
///
/// ```
/// use lock_runtime::{distributed_lock, LockError, Registry};
///
/// #[derive(Debug)]
/// enum DeployError {
///     Lock(LockError),
/// }
///
/// impl From<LockError> for DeployError {
///     fn from(error: LockError) -> Self {
///         DeployError::Lock(error)
///     }
/// }
///
/// #[distributed_lock(key = "deploy:<id>", ttl = "60s")]
/// async fn deploy(id: u64, env: &str) -> Result<String, DeployError> {
///     // Runs only while this process holds the Redis key `lock:deploy:<id>`.
///     let held = lock_runtime::current().expect("inside the locked body");
///     Ok(format!("{env} under {}", held.redis_key()))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), DeployError> {
/// // In production: Registry::from_url("redis://10.0.0.5:6379/")?, or set LOCK_REDIS_URL.
/// Registry::in_memory().install_default();
/// assert_eq!(deploy(7, "prod").await?, "prod under lock:deploy:7");
/// # Ok(())
/// # }
/// ```
///
/// # Equivalent code without the attribute
///
/// The attribute is sugar over the manual API; the fn above behaves exactly like this one (the
/// generated code reaches the same calls through `lock_runtime::__private`):
///
/// ```
/// # use lock_runtime::{LockError, LockOptions, KeyBuilder, Registry};
/// # use std::time::Duration;
/// # #[derive(Debug)] enum DeployError { Lock(LockError) }
/// # impl From<LockError> for DeployError { fn from(e: LockError) -> Self { DeployError::Lock(e) } }
/// async fn deploy(id: u64, env: &str) -> Result<String, DeployError> {
///     // The key is rendered once, before acquisition; values are escaped.
///     let mut key = KeyBuilder::new(32);
///     key.literal("deploy:");
///     key.value(&id);
///     let key = key.finish();
///     // `registry = "name"` would look up `lock_runtime::named("name")` instead.
///     lock_runtime::registry()?
///         .lock(key)
///         .options(LockOptions::new().ttl(Duration::from_millis(60_000)))
///         .run(async move {
///             // The original body, unchanged: `return` and `?` work as before.
///             let held = lock_runtime::current().expect("inside the locked body");
///             Ok(format!("{env} under {}", held.redis_key()))
///         })
///         .await
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), DeployError> {
/// # Registry::in_memory().install_default();
/// # assert_eq!(deploy(7, "prod").await?, "prod under lock:deploy:7");
/// # Ok(())
/// # }
/// ```
///
/// The signature is kept as written; only the body is replaced. So methods (`&self`,
/// `&mut self`, `self`), generics and `where` clauses, lifetimes, `impl Trait` arguments,
/// destructured parameters, `async fn` in traits, and parameters named like the expansion's own
/// locals (`key`, `guard`, `lock`, ...) all work. The futures are `Send` when the body is.
///
/// # Options
///
/// | option | value | default |
/// |---|---|---|
/// | `key` | key template, see [below](#key-templates) | required |
/// | `keys` | instead of `key`: one lock over several key templates, all or none | none |
/// | `ttl` | lease length: how long the lock outlives a crashed holder | `"30s"` |
/// | `wait` | how long to wait for a busy lock; `"0s"` tries once | `"0s"` |
/// | `renew` | `false` turns renewal off: the lock then simply expires after `ttl` | `true` |
/// | `on_lost` | `"cancel"` or `"continue"`, see below | `"cancel"` |
/// | `min_hold` | keep the key at least this long after a successful run | none |
/// | `max_hold` | stop renewing after this long | none |
/// | `fencing` | issue a fencing token with each acquisition | `false` |
/// | `mode` | `"read"`: beside other readers; `"write"`: alone | `"write"` |
/// | `permits` | make the key a semaphore: up to this many holders at once | none (exclusive) |
/// | `leader` | `true`: a leader's loop, run for each term won in the election on `key` | `false` |
/// | `registry` | name of a registry installed with `Registry::install_as` | the default registry |
/// | `crate` | path to `lock_runtime` when it is renamed or re-exported | `"::lock_runtime"` |
///
/// Durations are a whole number and a unit: `ms`, `s`, `m` or `h` (`"250ms"`, `"60s"`, `"10m"`,
/// `"12h"`), at most 365 days (`"8760h"`, also the runtime's limit). They are checked at compile
/// time: zero (except for `wait`), too long, a missing or unknown unit, and fractions (`"1.5s"`:
/// write `"1500ms"`) are errors on the literal.
///
/// ## `key`
///
/// The lock's name, rendered from the arguments; the registry adds its prefix (`lock:` by
/// default).
///
/// ```
/// # use lock_runtime::{distributed_lock, LockError, Registry};
/// struct Order { id: u64, shop: &'static str }
///
/// #[distributed_lock(key = "{shop:<order.shop>}:pay:<order.id>")]
/// async fn pay(order: &Order) -> Result<String, LockError> {
///     Ok(lock_runtime::current().unwrap().redis_key().to_owned())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # Registry::in_memory().install_default();
/// let order = Order { id: 7, shop: "eu:1" };
/// assert_eq!(pay(&order).await?, "lock:{shop:eu%3A1}:pay:7");
/// # Ok(())
/// # }
/// ```
///
/// ## `ttl`
///
/// How long the lock outlives a holder that crashed. With renewal on (the default) it does not
/// bound how long the body may run: the lease is renewed every `ttl / 3`. At least `"10ms"`:
/// the lease's local deadline is its ttl minus a drift margin of ttl/100 + 2 ms.
///
/// ```
/// # use lock_runtime::{distributed_lock, LockError, Registry};
/// #[distributed_lock(key = "rebuild:<cache>", ttl = "10s")]
/// async fn rebuild(cache: &str) -> Result<(), LockError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # Registry::in_memory().install_default();
/// rebuild("products").await?;
/// # Ok(())
/// # }
/// ```
///
/// ## `wait`
///
/// How long to wait for a busy lock before failing with `LockError::Busy`. Waiting is notified by
/// the holder's release, not polled. `"0s"` (the default) tries once.
///
/// ```
/// # use std::time::Duration;
/// # use lock_runtime::{distributed_lock, LockError, Registry};
/// #[distributed_lock(key = "stock:<sku>")]
/// async fn try_once(sku: u32) -> Result<(), LockError> {
///     Ok(())
/// }
///
/// #[distributed_lock(key = "stock:<sku>", wait = "5s")]
/// async fn queue_up(sku: u32) -> Result<(), LockError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let registry = Registry::in_memory();
/// registry.install_default();
/// let other_holder = registry.lock("stock:1").acquire().await?;
/// assert!(matches!(try_once(1).await, Err(LockError::Busy { .. })));
/// // Waits until the other holder releases, then runs.
/// let (queued, released) = tokio::join!(queue_up(1), other_holder.release());
/// queued?;
/// released?;
/// # Ok(())
/// # }
/// ```
///
/// ## `renew`
///
/// `renew = false` turns the lease keeper off for this lock: it expires after `ttl` even while
/// the body still runs (and `on_lost` then applies).
///
/// ```
/// # use lock_runtime::{distributed_lock, LockError, Registry};
/// #[distributed_lock(key = "ping", ttl = "5s", renew = false)]
/// async fn ping() -> Result<(), LockError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # Registry::in_memory().install_default();
/// ping().await?;
/// # Ok(())
/// # }
/// ```
///
/// ## `on_lost`
///
/// When the lease can no longer be guaranteed (Redis says the token is gone, or renewal did not
/// get through before the local deadline):
///
/// - `"cancel"` (default): the body's future is dropped before the key can expire on the server,
///   and the call returns the user's error built from `LockError::Lost`.
/// - `"continue"`: the body finishes; `lock_runtime::current()` reports the loss through
///   `is_lost()` and `lost().await`, so it can stop at a safe point itself.
///
/// ```
/// # use lock_runtime::{distributed_lock, LockError, Registry};
/// #[distributed_lock(key = "export:<day>", on_lost = "continue")]
/// async fn export(day: u32) -> Result<u32, LockError> {
///     let held = lock_runtime::current().unwrap();
///     let mut written = 0;
///     for _batch in 0..3 {
///         if held.is_lost() {
///             break; // a safe point: stop before the next write
///         }
///         written += 1;
///     }
///     Ok(written)
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # Registry::in_memory().install_default();
/// assert_eq!(export(1).await?, 3);
/// # Ok(())
/// # }
/// ```
///
/// ## `min_hold`
///
/// Keeps the key at least this long after acquisition, even when the body ends earlier, so a
/// job scheduled on every replica runs once per period (like ShedLock's `lockAtLeastFor`). After
/// an error return the lock is released at once, so another replica can retry.
///
/// ```
/// # use lock_runtime::{distributed_lock, LockError, Registry};
/// #[distributed_lock(key = "report:daily", min_hold = "12h")]
/// async fn daily_report() -> Result<(), LockError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let registry = Registry::in_memory();
/// registry.install_default();
/// daily_report().await?;
/// // Still held: the other replicas skip today's run.
/// assert!(matches!(daily_report().await, Err(LockError::Busy { .. })));
/// # Ok(())
/// # }
/// ```
///
/// ## `max_hold`
///
/// Stops renewing after this long, so a hung holder cannot keep the lock forever; the lock then
/// expires within `ttl` and `on_lost` applies.
///
/// ```
/// # use lock_runtime::{distributed_lock, LockError, Registry};
/// #[distributed_lock(key = "migrate", ttl = "30s", max_hold = "10m")]
/// async fn migrate() -> Result<(), LockError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # Registry::in_memory().install_default();
/// migrate().await?;
/// # Ok(())
/// # }
/// ```
///
/// Combinations that cannot do what they say are compile errors, on the offending literal:
///
/// - `max_hold` shorter than `ttl` (the default `"30s"` when `ttl` is not given): the first
///   lease already lasts `ttl`, so the limit could never take effect;
/// - `max_hold` with `renew = false`: there is no renewal to stop;
/// - `min_hold` longer than `ttl` with `renew = false`: the key expires after `ttl` anyway;
/// - `min_hold` longer than `max_hold`: the key cannot be kept longer than it may be held.
///
/// ## `fencing`
///
/// Takes a fencing token with each acquisition: a number that strictly increases per key. Pass it
/// to the storage you write to and have it reject writes carrying a lower token than one it has
/// seen; that is what makes a lock safe against a holder that paused past its lease.
///
/// ```
/// # use lock_runtime::{distributed_lock, LockError, Registry};
/// #[distributed_lock(key = "invoice:<id>", fencing = true)]
/// async fn write_invoice(id: u64) -> Result<u64, LockError> {
///     let fence = lock_runtime::current().unwrap().fence().expect("fencing = true");
///     // storage.write_if_newer(id, fence, ...)
///     Ok(fence)
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # Registry::in_memory().install_default();
/// let first = write_invoice(1).await?;
/// assert!(write_invoice(1).await? > first);
/// # Ok(())
/// # }
/// ```
///
/// ## `keys`
///
/// One lock over several keys, taken all or none in one step: money moved between two
/// accounts, stock between two warehouses. Each template is checked like `key`. The rendered
/// keys are sorted by name (as text: `account:10` before `account:9`), so two calls that name
/// them in opposite orders never wait for each other in turn. In Redis Cluster they must share a hash tag (`{accounts}:<from>`), else the call
/// fails with `LockError::InvalidKey` naming that fix. Not with `key`, `permits` or
/// `mode = "read"` (compile errors).
///
/// ```
/// # use lock_runtime::{distributed_lock, LockError, Registry};
/// #[distributed_lock(keys = ["account:<from>", "account:<to>"])]
/// async fn transfer(from: u64, to: u64, cents: u64) -> Result<(), LockError> {
///     let held = lock_runtime::current().unwrap();
///     assert_eq!(held.key(), format!("account:{} + account:{}", from.min(to), from.max(to)));
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # Registry::in_memory().install_default();
/// transfer(9, 7, 100).await?;
/// # Ok(())
/// # }
/// ```
///
/// ## `mode`
///
/// Makes the key a read-write lock: `mode = "read"` bodies run side by side, each with a lease of
/// its own, while a `"write"` body (the default: every plain lock is a write lock) runs alone. A
/// waiting writer holds off new readers, so readers cannot starve it (on single servers,
/// Sentinel, Cluster and memory; not on Redlock or with `confirm_replicas`). A reader that calls a writer of the same key
/// gets `LockError::InvalidOptions` (an upgrade would wait for itself); a writer that calls a
/// reader re-enters its lock. Not with `permits` or `fencing = true` (compile errors).
///
/// ```
/// # use lock_runtime::{distributed_lock, LockError, Registry};
/// #[distributed_lock(key = "catalog:<shop>", mode = "read")]
/// async fn price(shop: u32, sku: &str) -> Result<u32, LockError> {
///     Ok(42) // many readers at once
/// }
///
/// #[distributed_lock(key = "catalog:<shop>")]
/// async fn reprice(shop: u32) -> Result<(), LockError> {
///     Ok(()) // alone
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # Registry::in_memory().install_default();
/// reprice(1).await?;
/// assert_eq!(price(1, "tea").await?, 42);
/// # Ok(())
/// # }
/// ```
///
/// ## `permits`
///
/// Makes the key a semaphore: up to `permits` bodies run at once across every replica, each
/// holding one permit with a lease of its own (renewed while the body runs, released when it
/// ends; a crashed holder's permit comes back within `ttl`). Every caller of one key must name
/// the same number: a caller that names another gets `LockError::InvalidOptions` at run time,
/// never a silent mix of pool sizes. A nested call on the same key inside a body shares that
/// body's permit. Not with `fencing = true` (a compile error): permits are held side by side,
/// so a token would order nothing.
///
/// ```
/// # use lock_runtime::{distributed_lock, LockError, Registry};
/// #[distributed_lock(key = "gpu-pool", permits = 4, wait = "30s")]
/// async fn render(frame: u32) -> Result<u32, LockError> {
///     // At most four renders hold a GPU at any moment, whichever replica runs them.
///     Ok(frame)
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # Registry::in_memory().install_default();
/// assert_eq!(render(7).await?, 7);
/// # Ok(())
/// # }
/// ```
///
/// ## `leader`
///
/// Makes the fn a leader-only service loop: calling it campaigns in the election on `key`
/// (`Registry::election`), runs the body for each term this process wins, and campaigns again
/// after a term ends (the body returned, failed, or its lease was lost, in which case the body
/// is dropped before the lease can expire), until the registry shuts down; then the call
/// returns `Ok(())`. Each term runs the body afresh on clones of the arguments (so they must be
/// `Clone`: `&self` and shared references are), and `lock_runtime::current()` inside it gives the
/// term (`fence()`), whether it is at risk, and whether the leader was asked to step down
/// (`stepping_down()`: `Election::step_down` or `hand_over` on the same key, from anywhere in the
/// process; the body then finishes what it has and returns, and the term goes to the next
/// candidate). The identity observers see is the registry's
/// (`RegistryBuilder::identity`), else `host:pid`. The fn returns `Result<(), E>` with
/// `E: From<LockError> + Display` (a failed term is logged). Only `key`, `ttl` (default
/// `"10s"`), `registry` and `crate` go with it: the others are compile errors.
///
/// ```
/// # use lock_runtime::{distributed_lock, LockError, Registry};
/// #[distributed_lock(key = "scheduler", ttl = "10s", leader = true)]
/// async fn schedule(registry: &Registry) -> Result<(), LockError> {
///     let term = lock_runtime::current().expect("leading");
///     println!("leading term {:?}", term.fence());
///     // ... the scheduler's loop; here it ends by shutting the registry down ...
///     registry.shutdown().await;
///     std::future::pending().await
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let registry = Registry::in_memory();
/// registry.install_default();
/// schedule(&registry).await?;
/// # Ok(())
/// # }
/// ```
///
/// ## `registry`
///
/// Uses the registry installed under that name instead of the default one. A name that was never
/// installed is `LockError::NotConfigured` at run time.
///
/// ```
/// # use lock_runtime::{distributed_lock, LockError, Registry};
/// #[distributed_lock(key = "refund:<id>", registry = "payments")]
/// async fn refund(id: u64) -> Result<(), LockError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// // E.g. Registry::from_url("redis://payments-redis:6379/")?
/// Registry::in_memory().install_as("payments");
/// refund(3).await?;
/// # Ok(())
/// # }
/// ```
///
/// ## `crate`
///
/// The path to `lock_runtime` for the generated code, when your crate uses it under another
/// name or through a re-export.
///
/// ```
/// mod platform {
///     pub use lock_runtime as locks;
/// }
///
/// use platform::locks::{distributed_lock, LockError, Registry};
///
/// #[distributed_lock(key = "job", crate = "crate::platform::locks")]
/// async fn job() -> Result<(), LockError> {
///     Ok(())
/// }
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> Result<(), LockError> {
///     Registry::in_memory().install_default();
///     job().await
/// }
/// ```
///
/// # Key templates
///
/// - `<name>` interpolates a parameter, including names bound by a destructuring pattern;
///   `<name.field.sub>` a field path (`<pair.0>` for tuples); `<self.field>` a field of the
///   receiver. Values are written through `Display`, once, before acquisition.
/// - `<<` is a literal `<`. Everything else is literal text, braces included, so Redis Cluster
///   hash tags work: `"{tenant:<t>}:job"` keeps all of a tenant's locks in one slot.
/// - Interpolated values are escaped: `%`, `:`, `/`, `{`, `}` and ASCII control characters are
///   percent-encoded (`eu:west` → `eu%3Awest`). Literal text is verbatim.
/// - Two placeholders must be separated by literal text containing `:`, `/`, `{` or `}`:
///   `"<a><b>"` or `"<a>-<b>"` are compile errors, because `("1", "23")` and `("12", "3")` would
///   render the same key. With a separator, different arguments never share a key.
///
/// A placeholder naming no parameter, an empty `<>` or an unclosed `<` is a compile error on the
/// key literal, listing the parameters it could name.
///
/// # Return type
///
/// The fn must return `Result<T, E>` where `E: From<lock_runtime::LockError>`: that is how a
/// busy or lost lock, or a failing Redis, reaches the caller. Any other return type is a compile
/// error pointing at it. Type aliases such as `anyhow::Result<T>` work when their error type
/// converts from `LockError`.
///
/// # With other attributes
///
/// - `#[tracing::instrument]` can go above or below `#[distributed_lock]`; above, its span also
///   covers waiting for the lock.
/// - `#[async_trait]`: put `#[distributed_lock]` on the method inside the `#[async_trait]` impl
///   (or trait, for a default method) as usual. async-trait expands first; the attribute
///   recognises its `Box::pin(async move { .. })` and locks the body inside it, so parameters,
///   destructured ones included, can be used in the key.
///
/// ```
/// use async_trait::async_trait;
/// use lock_runtime::{distributed_lock, LockError, Registry};
///
/// #[async_trait]
/// trait Job {
///     async fn run(&self, id: u64) -> Result<String, LockError>;
/// }
///
/// struct Nightly {
///     tenant: String,
/// }
///
/// #[async_trait]
/// impl Job for Nightly {
///     #[distributed_lock(key = "nightly:<self.tenant>:<id>")]
///     async fn run(&self, id: u64) -> Result<String, LockError> {
///         Ok(lock_runtime::current().unwrap().key().to_owned())
///     }
/// }
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> Result<(), LockError> {
///     Registry::in_memory().install_default();
///     let job: Box<dyn Job> = Box::new(Nightly { tenant: "acme".into() });
///     assert_eq!(job.run(1).await?, "nightly:acme:1");
///     Ok(())
/// }
/// ```
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    match distributed_lock_impl(args.into(), item.clone()) {
        Ok(expanded) => expanded.into(),
        Err(error) => {
            // Keep the fn as written next to the errors, so rust-analyzer and the rest of the
            // crate still see it and only the attribute's own errors are reported.
            let mut output = item;
            output.extend(error.to_compile_error());
            output.into()
        }
    }
}

fn distributed_lock_impl(
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    let mut errors = ctxt::Errors::default();
    let args = args::parse(args, &mut errors);
    let item = match syn::parse2::<syn::ItemFn>(item.clone()) {
        Ok(item) => item,
        Err(parse_error) => {
            errors.push(not_a_fn(item, parse_error));
            return errors
                .finish()
                .map(|()| unreachable!("an error was just recorded"));
        }
    };
    let lock = validate::validate(args, item, &mut errors);
    errors.finish()?;
    Ok(expand::expand(
        lock.expect("validation without errors yields a lock"),
    ))
}

/// The error for an item that is not a fn with a body: a trait's fn declaration, another kind
/// of item, or a fn syn cannot read (then syn's own error, on the token it stopped at).
fn not_a_fn(item: proc_macro2::TokenStream, parse_error: syn::Error) -> syn::Error {
    if let Ok(method) = syn::parse2::<syn::TraitItemFn>(item.clone()) {
        return syn::Error::new_spanned(
            method.sig.ident,
            "`#[distributed_lock]` needs a fn body to run under the lock; put the attribute \
             on the fn in each `impl` of the trait instead of on its declaration",
        );
    }
    match syn::parse2::<syn::Item>(item) {
        Ok(syn::Item::Fn(_) | syn::Item::Verbatim(_)) | Err(_) => parse_error,
        Ok(_) => syn::Error::new(
            proc_macro2::Span::call_site(),
            "`#[distributed_lock]` applies to an `async fn` that returns `Result<T, E>`",
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use quote::quote;

    /// The attribute checks options at compile time against its own copies of the runtime's
    /// default and bounds (a proc-macro crate cannot depend on the runtime): they must agree.
    #[test]
    fn the_default_ttl_and_the_bounds_are_the_runtimes() {
        use crate::duration::{MAX_MILLIS, MIN_TTL_MILLIS};
        use crate::validate::DEFAULT_TTL_MILLIS;
        assert_eq!(
            Duration::from_millis(DEFAULT_TTL_MILLIS),
            lock_runtime::LockOptions::new().get_ttl(),
            "default ttl"
        );
        assert_eq!(
            Duration::from_millis(MIN_TTL_MILLIS),
            lock_runtime::__private::MIN_TTL,
            "shortest ttl"
        );
        assert_eq!(
            Duration::from_millis(MAX_MILLIS),
            lock_runtime::__private::MAX_TTL,
            "longest duration"
        );
    }

    fn expand(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
        super::distributed_lock_impl(args, item)
            .expect("valid")
            .to_string()
    }

    #[test]
    fn the_signature_is_kept_and_the_body_quoted_once() {
        let expanded = expand(
            quote!(key = "deploy:<id>", ttl = "60s", registry = "jobs"),
            quote! {
                #[doc = "deploys"]
                pub async fn deploy<'a>(&self, id: u64, env: &'a str) -> Result<(), E>
                where
                    E: Send,
                {
                    #![allow(unused)]
                    unique_body_marker(env)
                }
            },
        );
        assert!(expanded.starts_with(
            "# [doc = \"deploys\"] pub async fn deploy < 'a > (& self , id : u64 , env : & 'a str) \
             -> Result < () , E > where E : Send , { # ! [allow (unused)]"
        ));
        assert_eq!(expanded.matches("unique_body_marker").count(), 1);
        assert!(expanded.contains("async move { unique_body_marker (env) }"));
        assert!(expanded.contains(
            ":: lock_runtime :: __private :: run (:: core :: option :: Option :: Some (\"jobs\")"
        ));
        assert!(expanded
            .contains(". ttl (:: lock_runtime :: __private :: Duration :: from_millis (60000))"));
        assert!(expanded.contains("assert_lock_result :: < Result < () , E > > ()"));
    }

    #[test]
    fn only_given_options_are_emitted() {
        let expanded = expand(
            quote!(key = "static", crate = "my::rt"),
            quote!(
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        // The template is always given: it labels the lock's metrics.
        assert!(expanded
            .contains("my :: rt :: __private :: LockOptions :: new () . template (\"static\") ,"));
        assert!(!expanded.contains(":: lock_runtime"));
    }

    #[test]
    fn the_key_templates_as_written_label_the_lock() {
        let expanded = expand(
            quote!(keys = ["account:<from>", "account:<to>"]),
            quote!(
                async fn f(from: u64, to: u64) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(expanded.contains(". template (\"account:<from> + account:<to>\")"));
    }

    /// A fn syn cannot read gets syn's own error, which names the token it stopped at, rather
    /// than "applies to an async fn"; another kind of item gets that.
    #[test]
    fn a_fn_syn_cannot_read_keeps_syns_error() {
        let error = |item: proc_macro2::TokenStream| {
            super::distributed_lock_impl(quote!(key = "job"), item)
                .expect_err("refused")
                .to_string()
        };
        let unreadable = quote!(async fn f(id: u64, ->) -> Result<(), E> {});
        let expected = syn::parse2::<syn::ItemFn>(unreadable.clone())
            .expect_err("not a fn syn reads")
            .to_string();
        assert_eq!(error(unreadable), expected);
        assert!(!expected.contains("applies to"), "{expected}");
        assert!(error(quote!(
            struct Job;
        ))
        .contains("applies to an `async fn`"));
    }

    #[test]
    fn errors_are_collected_across_arguments_and_signature() {
        let error = super::distributed_lock_impl(
            quote!(key = "<nope>", ttl = "0s"),
            quote!(
                fn f() {}
            ),
        )
        .expect_err("invalid");
        let messages: Vec<String> = error.into_iter().map(|e| e.to_string()).collect();
        assert_eq!(messages.len(), 4, "{messages:#?}");
        assert!(messages[0].starts_with("`ttl` must be longer than zero"));
        assert!(messages[1].contains("needs an `async fn`"));
        assert!(messages[2].contains("add a return type"));
        assert!(messages[3].starts_with("`<nope>` names no parameter"));
    }
}
