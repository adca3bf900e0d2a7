//! The stores every behaviour runs on, each started fresh for its test, and what each one
//! declares it does not do.

use std::fmt;
use std::time::Duration;

use lock_runtime::{MemoryStore, Registry};
use lock_tests::cluster::RedisCluster;
use lock_tests::postgres::PostgresServer;
use lock_tests::sentinel::{RedisSentinels, SERVICE};
use lock_tests::{command_calls, eventually, shard_subscribers, subscribers, RedisServer};

/// How long a test waits for an event before it fails.
pub const LIMIT: Duration = Duration::from_secs(20);

/// The deployments a registry can lock on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Memory,
    SingleNode,
    /// One server whose replica acknowledges every lock write (`confirm_replicas(1)`).
    Confirmed,
    Sentinel,
    Cluster,
    /// Three independent masters.
    Redlock,
    /// One Postgres database.
    Postgres,
}

/// What a store does not do. A behaviour that needs it checks what the store promises instead,
/// and prints the store's reason, so a reader of the output sees what was not covered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lack {
    /// Fencing tokens.
    Fencing,
    /// Waiters queued and served in the order they came.
    Queue,
}

enum Fixture {
    Memory(MemoryStore),
    SingleNode(RedisServer),
    Confirmed {
        master: RedisServer,
        _replica: RedisServer,
    },
    Sentinel(RedisSentinels),
    Cluster(RedisCluster),
    Redlock(Vec<RedisServer>),
    Postgres(PostgresServer),
}

pub struct Store {
    pub kind: Kind,
    fixture: Fixture,
}

impl fmt::Display for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.kind, f)
    }
}

impl Store {
    /// Starts the servers a `kind` of store needs.
    pub fn start(kind: Kind) -> Self {
        let fixture = match kind {
            Kind::Memory => Fixture::Memory(MemoryStore::new()),
            Kind::SingleNode => Fixture::SingleNode(RedisServer::start()),
            Kind::Confirmed => {
                let master = RedisServer::start();
                let replica = RedisServer::start_replica_of(&master);
                Fixture::Confirmed {
                    master,
                    _replica: replica,
                }
            }
            Kind::Sentinel => Fixture::Sentinel(RedisSentinels::start()),
            Kind::Cluster => Fixture::Cluster(RedisCluster::start(3, 0)),
            Kind::Redlock => Fixture::Redlock((0..3).map(|_| RedisServer::start()).collect()),
            Kind::Postgres => Fixture::Postgres(PostgresServer::start_logging()),
        };
        Self { kind, fixture }
    }

    /// A new registry on the store: another process, as far as the store can tell. Default
    /// timeouts: no fault is injected, and a loaded machine gets the time it needs.
    pub fn registry(&self) -> Registry {
        let builder = Registry::builder();
        let builder = match &self.fixture {
            Fixture::Memory(store) => builder.memory(store.clone()),
            Fixture::SingleNode(server) => builder.url(server.url()),
            // Each write waits for the replica's `WAIT` answer, which a loaded machine (the
            // suite's other lanes, builds) delayed past the default's 1 s once: 5 s here.
            Fixture::Confirmed { master, .. } => builder
                .url(master.url())
                .confirm_replicas(1)
                .command_timeout(Duration::from_secs(10)),
            Fixture::Sentinel(deployment) => builder.sentinel(SERVICE, deployment.urls()),
            Fixture::Cluster(cluster) => builder.cluster(cluster.seeds()),
            Fixture::Redlock(nodes) => builder.redlock(nodes.iter().map(RedisServer::url)),
            Fixture::Postgres(server) => builder.postgres(server.url()),
        };
        builder.build().expect("a registry on the store")
    }

    /// Two registries on the store.
    pub fn pair(&self) -> (Registry, Registry) {
        (self.registry(), self.registry())
    }

    /// Why the store does not do `what`, printed for the test's output; `None` when it does.
    pub fn lacks(&self, what: Lack) -> Option<&'static str> {
        let why = match (self.kind, what) {
            (Kind::Redlock, Lack::Fencing) => {
                "Redlock's masters count independently: no one sequence of tokens, so fencing is \
                 refused"
            }
            (Kind::Redlock, Lack::Queue) => {
                "Redlock's masters hand nothing over: a release wakes the waiters, and whoever \
                 wins a majority first gets the lock"
            }
            (Kind::Confirmed, Lack::Queue) => {
                "a hand-over happens inside a release, where no `WAIT` can confirm it: waiters \
                 wake and take the lock on the confirming connection themselves"
            }
            _ => return None,
        };
        eprintln!("{self} does not do {what:?}: {why}");
        Some(why)
    }

    /// Whether exclusive waiters queue and a release hands the lock to the oldest.
    fn queues(&self) -> bool {
        !matches!(self.kind, Kind::Redlock | Kind::Confirmed)
    }

    /// The servers that serve `redis_key` (a key with the registries' prefix): where its
    /// waiters subscribe and its commands run. Empty for the memory store.
    fn servers_of(&self, redis_key: &str) -> Vec<&RedisServer> {
        match &self.fixture {
            Fixture::Memory(_) | Fixture::Postgres(_) => Vec::new(),
            Fixture::SingleNode(server) | Fixture::Confirmed { master: server, .. } => {
                vec![server]
            }
            Fixture::Sentinel(deployment) => vec![&deployment.master],
            Fixture::Cluster(cluster) => {
                let port = cluster.master_port_of(&cluster.nodes[0], redis_key);
                cluster.nodes.iter().filter(|n| n.port() == port).collect()
            }
            Fixture::Redlock(nodes) => nodes.iter().collect(),
        }
    }

    /// Until `n` registries' callers listen for `key`'s release: subscribed to its channel on
    /// every server that serves it (waiters of one registry share a subscription), or counted
    /// by the in-memory store. Readers, permit takers and several-key waiters never queue.
    pub async fn until_waiting(&self, key_of: &Registry, key: &str, n: usize) {
        self.until(key_of, key, n, false).await;
    }

    /// Until `n` callers of an exclusive lock on `key` wait for it: listening, as
    /// [`until_waiting`](Self::until_waiting), and queued where the store queues.
    pub async fn until_queued(&self, key_of: &Registry, key: &str, n: usize) {
        self.until(key_of, key, n, self.queues()).await;
    }

    async fn until(&self, key_of: &Registry, key: &str, n: usize, queued: bool) {
        let redis_key = key_of.redis_key(key);
        let sharded = self.kind == Kind::Cluster;
        let servers: Vec<String> = self
            .servers_of(&redis_key)
            .iter()
            .map(|s| s.url())
            .collect();
        eventually(LIMIT, &format!("{n} waiter(s) for {key} on {self}"), || {
            let (servers, redis_key) = (servers.clone(), redis_key.clone());
            async move {
                if let Fixture::Memory(store) = &self.fixture {
                    if store.waiters(&redis_key) != n {
                        return false;
                    }
                }
                if let Fixture::Postgres(server) = &self.fixture {
                    if server.listeners() != n {
                        return false;
                    }
                }
                for url in &servers {
                    let listening = if sharded {
                        shard_subscribers(url, &redis_key).await
                    } else {
                        subscribers(url, &redis_key).await
                    };
                    if usize::try_from(listening).ok() != Some(n) {
                        return false;
                    }
                }
                let in_queue = key_of.inspect(key).await.expect("inspect").waiters;
                !queued || usize::try_from(in_queue).expect("small") == n
            }
        })
        .await;
    }

    /// Lock commands the servers serving `key` have run (script calls and plain `SET`s, inside
    /// scripts too), summed; `None` for the memory store, which has no server.
    pub fn commands_for(&self, registry: &Registry, key: &str) -> Option<u64> {
        if let Fixture::Postgres(server) = &self.fixture {
            // Its statements as the server logged them (this store's keys are one test's).
            return Some(server.lock_statements());
        }
        let servers = self.servers_of(&registry.redis_key(key));
        if servers.is_empty() {
            return None;
        }
        let sent = servers.iter().map(|server| {
            let calls = command_calls(&mut server.connection());
            ["evalsha", "set"]
                .iter()
                .map(|c| calls.get(*c).copied().unwrap_or(0))
                .sum::<u64>()
        });
        Some(sent.sum())
    }
}
