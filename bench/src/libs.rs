//! The three lock libraries behind one interface, and the plain Redis client each one uses
//! (for the PING round trip measured "on the same kind of client").

use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, MultiplexedConnection};

/// A library under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    Runtime,
    Rslock,
    Arl,
}

impl Lib {
    pub const ALL: [Lib; 3] = [Lib::Runtime, Lib::Rslock, Lib::Arl];

    pub fn name(self) -> &'static str {
        match self {
            Lib::Runtime => "lock-runtime",
            Lib::Rslock => "rslock 0.10.0",
            Lib::Arl => "async-redis-lock 0.4.0",
        }
    }

    /// Short name for the command line of the child processes.
    pub fn id(self) -> &'static str {
        match self {
            Lib::Runtime => "runtime",
            Lib::Rslock => "rslock",
            Lib::Arl => "arl",
        }
    }

    pub fn from_id(id: &str) -> Option<Lib> {
        Lib::ALL.into_iter().find(|l| l.id() == id)
    }

    /// The Redis client the library talks through.
    pub fn client_kind(self) -> &'static str {
        match self {
            // lock-runtime's `ServerConnection` is a multiplexed connection it remakes itself.
            Lib::Runtime | Lib::Rslock => "MultiplexedConnection",
            Lib::Arl => "ConnectionManager",
        }
    }

    /// How long a blocked waiter sleeps between attempts (defaults of each crate): `None` for
    /// lock-runtime, which is woken by a release notification instead.
    pub fn poll_period(self) -> Option<Duration> {
        match self {
            Lib::Runtime => None,
            // Three attempts with a uniform 0..200 ms pause, then again at once.
            Lib::Rslock => Some(Duration::from_millis(200)),
            // A fixed 100 ms retry interval.
            Lib::Arl => Some(Duration::from_millis(100)),
        }
    }
}

/// One client of a library: a lock-runtime registry, an rslock manager or an
/// async-redis-lock locker. Each owns its own connection to the server.
pub enum Client {
    Runtime(lock_runtime::Registry),
    Rslock(Box<rslock::LockManager>),
    Arl(Box<async_redis_lock::Locker>),
}

/// A held lock of any library.
pub enum Held {
    Runtime(lock_runtime::LockGuard),
    Rslock(Box<rslock::Lock>),
    Arl(Box<async_redis_lock::Lock>),
}

/// The lease used where the item does not say otherwise (lock-runtime's default).
pub const TTL: Duration = Duration::from_secs(30);

impl Client {
    pub async fn connect(lib: Lib, url: &str) -> Client {
        match lib {
            Lib::Runtime => Client::Runtime(lock_runtime::Registry::from_url(url).expect("url")),
            Lib::Rslock => Client::Rslock(Box::new(rslock::LockManager::new(vec![url.to_owned()]))),
            Lib::Arl => Client::Arl(Box::new(
                async_redis_lock::Locker::from_redis_url(url)
                    .await
                    .expect("async-redis-lock connects"),
            )),
        }
    }

    /// Takes `key` for `ttl`, waiting up to `wait` for a busy lock (zero: one attempt; rslock
    /// always makes its three attempts).
    pub async fn acquire(&self, key: &str, ttl: Duration, wait: Duration) -> Result<Held, String> {
        match self {
            Client::Runtime(registry) => registry
                .lock(key)
                .ttl(ttl)
                .wait(wait)
                .acquire()
                .await
                .map(Held::Runtime)
                .map_err(|e| e.to_string()),
            Client::Rslock(manager) => {
                if wait.is_zero() {
                    manager.lock(key, ttl).await
                } else {
                    // `acquire_no_guard` retries until it gets the lock.
                    tokio::time::timeout(wait, manager.acquire_no_guard(key, ttl))
                        .await
                        .map_err(|_| "busy for the whole wait".to_owned())?
                }
                .map(|lock| Held::Rslock(Box::new(lock)))
                .map_err(|e| e.to_string())
            }
            Client::Arl(locker) => {
                let options = async_redis_lock::Options::new()
                    .ttl(ttl)
                    .extend(ttl / 3)
                    .timeout(Some(wait));
                locker
                    .acquire_with_options(&options, key)
                    .await
                    .map(|lock| Held::Arl(Box::new(lock)))
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// One uncontended acquire + release.
    pub async fn cycle(&self, key: &str) -> Result<(), String> {
        self.acquire(key, TTL, Duration::ZERO)
            .await?
            .release()
            .await
    }
}

impl Held {
    pub async fn release(self) -> Result<(), String> {
        match self {
            Held::Runtime(guard) => guard.release().await.map_err(|e| e.to_string()),
            Held::Rslock(lock) => {
                lock.release().await;
                Ok(())
            }
            Held::Arl(lock) => lock.release().await.map_err(|e| e.to_string()),
        }
    }
}

/// A plain connection of the kind a library uses, for PING.
pub enum Pinger {
    Manager(ConnectionManager),
    Multiplexed(MultiplexedConnection),
}

impl Pinger {
    pub async fn connect(lib: Lib, url: &str) -> Pinger {
        let client = redis::Client::open(url).expect("url");
        match lib {
            Lib::Arl => Pinger::Manager(
                client
                    .get_connection_manager()
                    .await
                    .expect("connection manager"),
            ),
            Lib::Runtime | Lib::Rslock => Pinger::Multiplexed(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("multiplexed connection"),
            ),
        }
    }

    /// One PING round trip.
    pub async fn ping(&mut self) -> Duration {
        let started = Instant::now();
        let pong: String = match self {
            Pinger::Manager(con) => redis::cmd("PING").query_async(con).await,
            Pinger::Multiplexed(con) => redis::cmd("PING").query_async(con).await,
        }
        .expect("PING");
        debug_assert_eq!(pong, "PONG");
        started.elapsed()
    }
}

/// One value per library, indexed by [`Lib`].
#[derive(Clone, Debug, Default)]
pub struct PerLib<T>(pub [T; 3]);

impl<T> PerLib<T> {
    pub fn get(&self, lib: Lib) -> &T {
        &self.0[lib as usize]
    }

    pub fn get_mut(&mut self, lib: Lib) -> &mut T {
        &mut self.0[lib as usize]
    }
}

/// A `MultiplexedConnection` made by a task of a current-thread runtime on a thread of its own,
/// where its driver then runs (the thread lives as long as the process).
pub fn remote_connection(url: &str) -> Pinger {
    let client = redis::Client::open(url).expect("url");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let con = client
                .get_multiplexed_async_connection()
                .await
                .expect("multiplexed connection");
            tx.send(con).expect("send the connection");
            std::future::pending::<()>().await
        });
    });
    Pinger::Multiplexed(rx.recv().expect("the connection"))
}
