//! Golden tests: the exact Redis key `#[distributed_lock]` locks for a table of templates and
//! values, default `lock:` prefix included. Each key is checked on the server itself: while
//! the body runs, that Redis key holds this lock's token.
//!
//! Escaping (by the runtime's `KeyBuilder`): interpolated values are written through
//! `Display` with `%`, `:`, `/`, `{`, `}` and ASCII control characters percent-encoded;
//! template text is verbatim. Changing any row here changes which keys existing deployments
//! lock, so a change must be deliberate.

use std::collections::HashSet;
use std::fmt;

use lock_runtime::{current, distributed_lock, LockError, Registry};
use lock_tests::{raw, RedisServer};
use redis::AsyncCommands;

/// Reads the held lock's Redis key and checks on the server that it holds our token.
struct Probe {
    url: String,
}

impl Probe {
    async fn observe(&self) -> Result<String, LockError> {
        let lock = current().expect("inside a guarded body");
        let mut con = raw(&self.url).await;
        let stored: Option<String> = con.get(lock.redis_key()).await.expect("GET");
        assert_eq!(
            stored.as_deref(),
            Some(lock.token()),
            "Redis key {:?} holds this lock",
            lock.redis_key()
        );
        Ok(lock.redis_key().to_owned())
    }
}

#[distributed_lock(key = "deploy:<id>", registry = "attr_keys")]
async fn by_number(id: i64, probe: &Probe) -> Result<String, LockError> {
    probe.observe().await
}

#[distributed_lock(key = "job:<name>", registry = "attr_keys")]
async fn by_text(name: &str, probe: &Probe) -> Result<String, LockError> {
    probe.observe().await
}

#[distributed_lock(key = "<a>:<b>", registry = "attr_keys")]
async fn two_values(a: &str, b: &str, probe: &Probe) -> Result<String, LockError> {
    probe.observe().await
}

/// The same template on its own registry, for the test that runs beside the table.
#[distributed_lock(key = "<a>:<b>", registry = "attr_keys_injective")]
async fn two_values_injective(a: &str, b: &str, probe: &Probe) -> Result<String, LockError> {
    probe.observe().await
}

#[distributed_lock(key = "{tenant:<tenant>}:invoice:<id>", registry = "attr_keys")]
async fn hash_tagged(tenant: &str, id: u32, probe: &Probe) -> Result<String, LockError> {
    probe.observe().await
}

#[distributed_lock(key = "a<<b>>:<id>", registry = "attr_keys")]
async fn literal_angles(id: u8, probe: &Probe) -> Result<String, LockError> {
    probe.observe().await
}

#[distributed_lock(key = "nightly-report", registry = "attr_keys")]
async fn static_key(probe: &Probe) -> Result<String, LockError> {
    probe.observe().await
}

struct User {
    id: u64,
    region: &'static str,
}

struct Request {
    user: User,
    pair: (char, f32),
}

#[distributed_lock(
    key = "user:<req.user.region>/<req.user.id>:<req.pair.0>:<req.pair.1>",
    registry = "attr_keys"
)]
async fn field_paths(req: Request, probe: &Probe) -> Result<String, LockError> {
    probe.observe().await
}

/// A `Display` that writes separators itself.
struct Path2(&'static str, &'static str);

impl fmt::Display for Path2 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.0, self.1)
    }
}

struct Tenant {
    name: &'static str,
}

impl Tenant {
    #[distributed_lock(key = "tenant:<self.name>:<path>", registry = "attr_keys")]
    async fn sync(&self, path: Path2, probe: &Probe) -> Result<String, LockError> {
        probe.observe().await
    }
}

/// The fencing counter's Redis name, found by its value: the token this lock was given.
impl Probe {
    async fn fence_counter(&self, candidates: &[&str]) -> Result<String, LockError> {
        let fence = current()
            .expect("inside a guarded body")
            .fence()
            .expect("fencing = true");
        let mut con = raw(&self.url).await;
        for name in candidates {
            let value: Option<u64> = con.get(*name).await.expect("GET");
            if value == Some(fence) {
                return Ok((*name).to_owned());
            }
        }
        Ok(format!("none of {candidates:?} holds the token {fence}"))
    }
}

#[distributed_lock(key = "deploy:<id>", fencing = true, registry = "attr_keys_fence")]
async fn fenced_plain(id: u32, probe: &Probe, names: &[&str]) -> Result<String, LockError> {
    probe.fence_counter(names).await
}

#[distributed_lock(
    key = "{tenant:<tenant>}:invoice:<id>",
    fencing = true,
    registry = "attr_keys_fence"
)]
async fn fenced_tagged(
    tenant: &str,
    id: u32,
    probe: &Probe,
    names: &[&str],
) -> Result<String, LockError> {
    probe.fence_counter(names).await
}

/// A server, installed as the registry `name` (one per test: tests run in parallel).
async fn server(name: &str) -> (RedisServer, Probe) {
    let server = RedisServer::start();
    Registry::from_url(&server.url())
        .expect("registry")
        .install_as(name);
    let probe = Probe { url: server.url() };
    (server, probe)
}

#[tokio::test]
async fn rendered_redis_keys_are_pinned() {
    let (_server, p) = server("attr_keys").await;
    let p = &p;
    let table: Vec<(String, &str)> = vec![
        (by_number(42, p).await.unwrap(), "lock:deploy:42"),
        (by_number(-7, p).await.unwrap(), "lock:deploy:-7"),
        (
            by_number(i64::MAX, p).await.unwrap(),
            "lock:deploy:9223372036854775807",
        ),
        (by_text("plain", p).await.unwrap(), "lock:job:plain"),
        (by_text("", p).await.unwrap(), "lock:job:"),
        (
            by_text("with space", p).await.unwrap(),
            "lock:job:with space",
        ),
        (by_text("eu:west", p).await.unwrap(), "lock:job:eu%3Awest"),
        (by_text("a/b", p).await.unwrap(), "lock:job:a%2Fb"),
        (by_text("{tag}", p).await.unwrap(), "lock:job:%7Btag%7D"),
        (by_text("100%", p).await.unwrap(), "lock:job:100%25"),
        (by_text("%3A", p).await.unwrap(), "lock:job:%253A"),
        (
            by_text("line\nbreak\ttab\u{7f}", p).await.unwrap(),
            "lock:job:line%0Abreak%09tab%7F",
        ),
        (by_text("café-ünï", p).await.unwrap(), "lock:job:café-ünï"),
        (by_text("<id>", p).await.unwrap(), "lock:job:<id>"),
        (two_values("1:2", "3", p).await.unwrap(), "lock:1%3A2:3"),
        (two_values("1", "2:3", p).await.unwrap(), "lock:1:2%3A3"),
        (
            hash_tagged("acme", 9, p).await.unwrap(),
            "lock:{tenant:acme}:invoice:9",
        ),
        (
            hash_tagged("a}b{c", 9, p).await.unwrap(),
            "lock:{tenant:a%7Db%7Bc}:invoice:9",
        ),
        (literal_angles(1, p).await.unwrap(), "lock:a<b>>:1"),
        (static_key(p).await.unwrap(), "lock:nightly-report"),
        (
            field_paths(
                Request {
                    user: User {
                        id: 5,
                        region: "eu",
                    },
                    pair: ('x', 1.5),
                },
                p,
            )
            .await
            .unwrap(),
            "lock:user:eu/5:x:1.5",
        ),
        (
            Tenant { name: "acme" }
                .sync(Path2("in", "out"), p)
                .await
                .unwrap(),
            "lock:tenant:acme:in%2Fout",
        ),
    ];
    for (rendered, expected) in table {
        assert_eq!(rendered, expected);
    }
}

#[tokio::test]
async fn different_arguments_never_share_a_key() {
    let (_server, p) = server("attr_keys_injective").await;
    let values = [
        "", "1", "2", "12", "1:2", "2:3", ":", "%", "%3A", "1%3A2", "{", "}", "/",
    ];
    let mut seen = HashSet::new();
    for a in values {
        for b in values {
            let key = two_values_injective(a, b, &p).await.unwrap();
            assert!(
                seen.insert(key.clone()),
                "({a:?}, {b:?}) renders {key:?} again"
            );
        }
    }
    assert_eq!(seen.len(), values.len() * values.len());
}

/// The counter's name is the same on a single server and in a Cluster (where it must share the
/// lock's hash slot), so moving between them keeps tokens increasing. Changing a row here
/// changes which counter existing deployments read.
#[tokio::test]
async fn fencing_counter_names_are_pinned() {
    let (_server, p) = server("attr_keys_fence").await;
    let p = &p;
    let plain = ["fence:{lock:deploy:42}", "fence:lock:deploy:42"];
    assert_eq!(
        fenced_plain(42, p, &plain).await.unwrap(),
        "fence:{lock:deploy:42}"
    );
    let tagged = [
        "fence:lock:{tenant:acme}:invoice:9",
        "fence:{lock:{tenant:acme}:invoice:9}",
    ];
    assert_eq!(
        fenced_tagged("acme", 9, p, &tagged).await.unwrap(),
        "fence:lock:{tenant:acme}:invoice:9"
    );
}
