//! Every fn shape `#[distributed_lock]` must accept compiles here, lint-clean under
//! `clippy::pedantic`, and runs under its lock (in-memory registry: no Redis needed).
#![deny(warnings, clippy::pedantic)]

use std::fmt::{self, Display};

use lock_runtime::{current, distributed_lock, LockError, Registry};

const REGISTRY: &str = "attr_shapes";

#[derive(Debug)]
enum JobError {
    Lock(LockError),
    Parse(std::num::ParseIntError),
    Rejected,
}

impl From<LockError> for JobError {
    fn from(error: LockError) -> Self {
        JobError::Lock(error)
    }
}

impl From<std::num::ParseIntError> for JobError {
    fn from(error: std::num::ParseIntError) -> Self {
        JobError::Parse(error)
    }
}

impl Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::Lock(error) => write!(f, "{error}"),
            JobError::Parse(error) => write!(f, "bad input: {error}"),
            JobError::Rejected => f.write_str("rejected"),
        }
    }
}

type JobResult<T> = Result<T, JobError>;

/// The key of the lock the body runs under.
fn held_key() -> String {
    current().expect("inside a guarded body").key().to_owned()
}

#[distributed_lock(key = "free:<id>", registry = "attr_shapes")]
async fn free_fn(id: u64) -> Result<String, JobError> {
    Ok(held_key())
}

struct Tenant {
    name: String,
    runs: u32,
}

impl Tenant {
    #[distributed_lock(key = "tenant:<self.name>:report", registry = "attr_shapes")]
    async fn by_ref(&self) -> Result<String, JobError> {
        Ok(format!("{} {}", held_key(), self.name))
    }

    #[distributed_lock(key = "tenant:<self.name>:run", registry = "attr_shapes")]
    async fn by_mut_ref(&mut self, step: u32) -> Result<String, JobError> {
        self.runs += step;
        Ok(held_key())
    }

    #[distributed_lock(key = "tenant:<self.name>:close", registry = "attr_shapes")]
    async fn by_value(self) -> Result<(String, u32), JobError> {
        Ok((held_key(), self.runs))
    }

    #[distributed_lock(key = "tenant:<self.name>:<job>", registry = "attr_shapes")]
    async fn returns_self(self, job: &str) -> Result<Self, JobError> {
        let _ = job;
        Ok(self)
    }
}

#[distributed_lock(key = "generic:<item>:<label>", registry = "attr_shapes")]
async fn generic<T, L>(item: T, label: L) -> Result<String, JobError>
where
    T: Display + Send,
    L: AsRef<str> + Display,
{
    Ok(format!("{} {item} {}", held_key(), label.as_ref()))
}

#[distributed_lock(key = "borrow:<name>:<shown>", registry = "attr_shapes")]
async fn borrows<'a>(name: &'a str, shown: impl Display + Send) -> Result<&'a str, JobError> {
    let _ = shown.to_string();
    Ok(name)
}

#[distributed_lock(key = "elided:<name>", registry = "attr_shapes")]
async fn elided_lifetime(name: &str) -> JobResult<&str> {
    Ok(name)
}

#[distributed_lock(key = "opaque:<n>", registry = "attr_shapes")]
async fn returns_impl_trait(n: u32) -> Result<impl Display, JobError> {
    Ok(n * 2)
}

struct Point {
    x: i32,
    y: i32,
}

#[distributed_lock(key = "destructured:<a>:<b>:<x>:<y>:<first>", registry = "attr_shapes")]
async fn destructured(
    (a, b): (u8, u8),
    Point { x, y }: Point,
    [first, _]: [char; 2],
) -> Result<String, JobError> {
    Ok(format!(
        "{} {}",
        held_key(),
        i32::from(a) + i32::from(b) + x + y
    ))
}

#[distributed_lock(key = "shadow:<key>:<guard>:<lock>:<ttl>", registry = "attr_shapes")]
async fn names_the_expansion_might_use(
    key: &str,
    guard: u8,
    lock: bool,
    ttl: u64,
) -> Result<String, JobError> {
    // The expansion's own locals are hygienic: these are the caller's values.
    Ok(format!("{} {key} {guard} {lock} {ttl}", held_key()))
}

#[distributed_lock(key = "shadow:<lock_key>:<key_builder>", registry = "attr_shapes")]
async fn names_the_expansion_does_use(lock_key: u8, key_builder: u8) -> Result<u8, JobError> {
    Ok(lock_key + key_builder)
}

#[distributed_lock(key = "early:<input>", registry = "attr_shapes")]
async fn early_return_and_question_mark(input: &str) -> JobResult<u32> {
    if input.is_empty() {
        return Err(JobError::Rejected);
    }
    let parsed: u32 = input.parse()?;
    if parsed == 0 {
        return Ok(0);
    }
    Ok(parsed + 1)
}

#[distributed_lock(key = "scoped-use:<n>", registry = "attr_shapes")]
async fn use_inside_body(n: u8) -> Result<String, JobError> {
    use std::fmt::Write as _;
    let mut out = String::new();
    write!(out, "{n}").expect("writing to a String");
    Ok(out)
}

// The body's `use` stayed inside the body: this `Write` is `std::io::Write`, not a clash.
use std::io::Write;

struct User {
    id: u64,
}

struct Request {
    user: User,
    pair: (u16, &'static str),
}

#[distributed_lock(key = "path:<req.user.id>:<req.pair.1>", registry = "attr_shapes")]
async fn field_paths(req: &Request) -> Result<String, JobError> {
    Ok(format!("{} {}", held_key(), req.pair.0))
}

#[distributed_lock(key = "raw:<r#type>", registry = "attr_shapes")]
async fn raw_identifier(r#type: &str) -> Result<String, JobError> {
    Ok(r#type.to_owned())
}

#[distributed_lock(key = "mutable:<counter>", registry = "attr_shapes")]
async fn mutable_param(mut counter: u32) -> Result<u32, JobError> {
    counter += 1;
    Ok(counter)
}

/// Attributes around the annotated fn survive, the inner one included.
#[must_use = "the report says what ran"]
#[distributed_lock(key = "attrs", registry = "attr_shapes")]
pub(crate) async fn keeps_attributes() -> Result<String, JobError> {
    #![allow(clippy::items_after_statements)]
    let key = held_key();
    const SUFFIX: &str = "!";
    Ok(key + SUFFIX)
}

#[distributed_lock(
    key = "all:<id>",
    ttl = "1m",
    wait = "0s",
    renew = true,
    on_lost = "continue",
    min_hold = "1ms",
    max_hold = "10m",
    fencing = true,
    registry = "attr_shapes",
    crate = "crate::reexported::runtime"
)]
async fn every_option(id: u8) -> Result<Option<u64>, JobError> {
    Ok(current().and_then(|held| held.fence()))
}

mod reexported {
    pub use lock_runtime as runtime;
}

trait Job {
    async fn run(&self, id: u64) -> Result<String, JobError>;

    #[distributed_lock(key = "job-default:<id>", registry = "attr_shapes")]
    async fn default_method(&self, id: u64) -> Result<String, JobError> {
        Ok(held_key())
    }
}

struct Nightly;

impl Job for Nightly {
    #[distributed_lock(key = "job:<id>", registry = "attr_shapes")]
    async fn run(&self, id: u64) -> Result<String, JobError> {
        Ok(held_key())
    }
}

struct Display2(u8);

impl Display for Display2 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "d{}", self.0)
    }
}

fn assert_send<F: std::future::Future + Send>(future: F) -> F {
    future
}

#[tokio::test]
async fn every_shape_runs_under_its_lock() -> Result<(), JobError> {
    Registry::in_memory().install_as(REGISTRY);

    assert_eq!(free_fn(7).await?, "free:7");

    let mut tenant = Tenant {
        name: "acme:eu".into(),
        runs: 0,
    };
    assert_eq!(tenant.by_ref().await?, "tenant:acme%3Aeu:report acme:eu");
    assert_eq!(tenant.by_mut_ref(2).await?, "tenant:acme%3Aeu:run");
    let tenant = tenant.returns_self("nightly").await?;
    assert_eq!(
        tenant.by_value().await?,
        ("tenant:acme%3Aeu:close".into(), 2)
    );

    assert_eq!(
        generic(Display2(3), "x/y").await?,
        "generic:d3:x%2Fy d3 x/y"
    );
    let name = String::from("borrowed");
    assert_eq!(borrows(&name, 5).await?, "borrowed");
    assert_eq!(elided_lifetime(&name).await?, "borrowed");
    assert_eq!(returns_impl_trait(21).await?.to_string(), "42");

    assert_eq!(
        destructured((1, 2), Point { x: 3, y: 4 }, ['q', 'z']).await?,
        "destructured:1:2:3:4:q 10"
    );
    assert_eq!(
        names_the_expansion_might_use("k", 1, true, 60).await?,
        "shadow:k:1:true:60 k 1 true 60"
    );
    assert_eq!(names_the_expansion_does_use(1, 2).await?, 3);

    assert!(matches!(
        early_return_and_question_mark("").await,
        Err(JobError::Rejected)
    ));
    assert!(matches!(
        early_return_and_question_mark("x").await,
        Err(JobError::Parse(_))
    ));
    assert_eq!(early_return_and_question_mark("0").await?, 0);
    assert_eq!(early_return_and_question_mark("41").await?, 42);
    assert_eq!(use_inside_body(9).await?, "9");
    std::io::sink()
        .write_all(b"io::Write is in scope")
        .expect("sink");

    let request = Request {
        user: User { id: 5 },
        pair: (8, "b"),
    };
    assert_eq!(field_paths(&request).await?, "path:5:b 8");
    assert_eq!(raw_identifier("t").await?, "t");
    assert_eq!(mutable_param(1).await?, 2);
    assert_eq!(keeps_attributes().await?, "attrs!");
    assert!(every_option(1).await?.is_some());
    assert_eq!(Nightly.run(3).await?, "job:3");
    assert_eq!(Nightly.default_method(4).await?, "job-default:4");

    // The futures stay `Send` when the body is, so they can be spawned.
    let spawned = tokio::spawn(assert_send(free_fn(8)));
    assert_eq!(spawned.await.expect("task")?, "free:8");
    let tenant = Tenant {
        name: "t".into(),
        runs: 0,
    };
    let spawned = tokio::spawn(async move { assert_send(tenant.by_value()).await });
    assert_eq!(spawned.await.expect("task")?.0, "tenant:t:close");
    Ok(())
}
