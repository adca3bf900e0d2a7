//! Locks in a Postgres database: leases in a table, with deadlines on the database's clock,
//! changed only by the functions of `schema.sql` (each one statement, in a transaction of its
//! own), and waiters woken by `LISTEN/NOTIFY` (`listener`). The data mirrors the Redis
//! scripts' (a lock's holder, readers or permit holders, the waiters' queue, the last fencing
//! token), and so does each function's behaviour: the conformance suite runs the same
//! behaviours on both.
//!
//! Not session advisory locks: a session's lock has no lease the client can know, is gone on a
//! failover, cannot pass through PgBouncer's transaction mode, and stays taken on a pooled
//! connection after a cancelled acquire. Advisory locks here are transaction-scoped: they only
//! serialise the functions on one key for the length of one statement.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::Type;

use crate::backend::contract::{
    ttl_ms, Acquire, Attempt, LockInfo, Place, Renewal, Renewed, Share, Store,
};
use crate::backend::tls::Tls;
use crate::error::LockError;
use crate::key::LockKey;
use crate::timeouts::Timeouts;
use crate::waiting::{tenure_name, WaitHub};

mod link;
mod listener;
pub(crate) mod tls;

use link::Link;
pub(crate) use link::SCHEMA;

use crate::backend::notification::ELECTED;

/// The longest stored key (prefix included), in bytes: the primary keys' btree rows must fit.
const MAX_STORED_KEY: usize = 2000;

const ACQUIRE: &str = "SELECT acquired, fence, retry_after_ms, holder, mismatch \
     FROM distributed_lock.acquire($1, $2, $3, $4, $5, $6, $7, $8, $9)";
const ACQUIRE_ALL: &str = "SELECT acquired, fence, retry_after_ms, holder, at \
     FROM distributed_lock.acquire_all($1, $2, $3, $4, $5)";
const STAND_ASIDE: &str = "SELECT acquired, fence, retry_after_ms, holder \
     FROM distributed_lock.stand_aside($1, $2, $3, $4, $5, $6)";
const RELEASE: &str = "SELECT distributed_lock.release($1, $2, $3)";
const RELEASE_TO: &str = "SELECT distributed_lock.release_to($1, $2, $3, $4)";
const RENEW: &str = "SELECT distributed_lock.renew($1, $2, $3, $4)";
const INSPECT: &str =
    "SELECT kind, token, share, remaining_ms, fence FROM distributed_lock.inspect($1)";
/// `INSPECT` with how long the owner has held the lock, where the schema keeps it: in
/// `inspect`'s order (its waiters', oldest first), whatever join the planner picks.
const INSPECT_HELD: &str = "SELECT i.kind, i.token, i.share, i.remaining_ms, i.fence, s.held_ms \
     FROM distributed_lock.inspect($1) WITH ORDINALITY \
         AS i (kind, token, share, remaining_ms, fence, n) \
     LEFT JOIN distributed_lock.held_since($1) AS s \
         ON i.kind = 'holder' AND i.share = '' AND s.token = i.token \
     ORDER BY i.n";
const FORCE_UNLOCK: &str = "SELECT distributed_lock.force_unlock($1)";
const ANNOUNCE: &str = "SELECT pg_notify(distributed_lock.channel($1), $2)";

/// Locks in one Postgres database.
pub(crate) struct PostgresStore {
    link: Arc<Link>,
    node: String,
    hub: WaitHub,
}

impl PostgresStore {
    /// A store on the database `url` names (`postgres://user:password@host:port/db`, or
    /// `key=value` pairs): connected on first use, its schema created then if missing.
    /// `listen`: where waiters `LISTEN`, when `url` is a pooler in transaction mode.
    pub(crate) fn new(
        url: &str,
        listen: Option<&str>,
        timeouts: Timeouts,
        certificates: &Tls,
    ) -> Result<Self, LockError> {
        let config = parse(url, timeouts)?;
        let listen = match listen {
            Some(listen) => parse(listen, timeouts)?,
            None => config.clone(),
        };
        let node = node_name(&config);
        let listen_node = node_name(&listen);
        let config = tls::Endpoint::new(config, certificates)?;
        let listen = tls::Endpoint::new(listen, certificates)?;
        let link = Arc::new(Link::new(config, node.clone(), timeouts));
        let hub = listener::hub(link.clone(), listen, listen_node, timeouts);
        Ok(Self { link, node, hub })
    }

    async fn call<T, F, Fut>(
        &self,
        command: &'static str,
        key: Option<&LockKey>,
        statement: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(Arc<tokio_postgres::Client>) -> Fut,
        Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        self.link
            .run(None, statement)
            .await
            .map_err(|f| self.link.error(command, key.map(|k| k.name.as_str()), f))
    }

    /// An attempt of a candidate standing aside (`distributed_lock.stand_aside`).
    async fn stand_aside(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        let key = attempt.key;
        if !self.link.keeps_aside() {
            // Not sent where the schema lacks it (`stands_aside`); refused, unchanged, if asked.
            return Ok(Attempt::Busy {
                retry_after: None,
                holder: None,
                at: 0,
            });
        }
        let tenure = tenure_name(attempt.token);
        let ttl = bigint(ttl_ms(attempt.ttl));
        let place = i32::try_from(attempt.attempt).unwrap_or(i32::MAX);
        let row = self
            .call("acquire", Some(key), |c| async move {
                c.query_typed_one(
                    STAND_ASIDE,
                    &[
                        (&key.stored, Type::TEXT),
                        (&attempt.token, Type::TEXT),
                        (&tenure, Type::TEXT),
                        (&ttl, Type::INT8),
                        (&attempt.fencing, Type::BOOL),
                        (&place, Type::INT4),
                    ],
                )
                .await
            })
            .await?;
        Ok(outcome(&row, 0))
    }

    async fn acquire_one(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        if attempt.aside {
            return self.stand_aside(attempt).await;
        }
        let key = attempt.key;
        let tenure = tenure_name(attempt.token);
        let ttl = bigint(ttl_ms(attempt.ttl));
        let place = i32::try_from(attempt.attempt).unwrap_or(i32::MAX);
        let share = attempt.share.tag();
        let limit = match attempt.share {
            Share::Permits(n) => i32::try_from(n).unwrap_or(i32::MAX),
            Share::Read | Share::Exclusive => i32::MAX,
        };
        let row = self
            .call("acquire", Some(key), |c| async move {
                c.query_typed_one(
                    ACQUIRE,
                    &[
                        (&key.stored, Type::TEXT),
                        (&attempt.token, Type::TEXT),
                        (&tenure, Type::TEXT),
                        (&ttl, Type::INT8),
                        (&attempt.fencing, Type::BOOL),
                        (&attempt.queue, Type::BOOL),
                        (&place, Type::INT4),
                        (&share, Type::TEXT),
                        (&limit, Type::INT4),
                    ],
                )
                .await
            })
            .await?;
        if let Some(found) = row.get::<_, Option<String>>(4) {
            let found = Share::from_tag(&found).unwrap_or(Share::Read);
            return Err(attempt.share.mismatch(&key.name, &self.node, found));
        }
        Ok(outcome(&row, 0))
    }

    async fn acquire_all(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        let keys = stored(attempt.key);
        let tenure = tenure_name(attempt.token);
        let ttl = bigint(ttl_ms(attempt.ttl));
        let row = self
            .call("acquire", Some(attempt.key), |c| async move {
                c.query_typed_one(
                    ACQUIRE_ALL,
                    &[
                        (&keys, Type::TEXT_ARRAY),
                        (&attempt.token, Type::TEXT),
                        (&tenure, Type::TEXT),
                        (&ttl, Type::INT8),
                        (&attempt.fencing, Type::BOOL),
                    ],
                )
                .await
            })
            .await?;
        let at = row
            .get::<_, Option<i32>>(4)
            .and_then(|at| usize::try_from(at).ok())
            .unwrap_or(0);
        Ok(outcome(&row, at))
    }
}

/// An attempt's row: `acquired, fence, retry_after_ms, holder`.
fn outcome(row: &tokio_postgres::Row, at: usize) -> Attempt {
    if row.get::<_, bool>(0) {
        return Attempt::Acquired {
            fence: fence(row, 1),
        };
    }
    Attempt::Busy {
        retry_after: millis(row, 2),
        holder: row.get(3),
        at,
    }
}

/// Column `i` of `row`, a `bigint` of milliseconds (never negative: see `distributed_lock.ms`).
fn millis(row: &tokio_postgres::Row, i: usize) -> Option<Duration> {
    let ms = row.get::<_, Option<i64>>(i)?;
    Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// Column `i` of `row`, a fencing token from the sequence (`bigint`, positive).
fn fence(row: &tokio_postgres::Row, i: usize) -> Option<u64> {
    u64::try_from(row.get::<_, Option<i64>>(i)?).ok()
}

/// The stored names of a lock's keys (one, or a multi-key lock's members), as `text[]`.
fn stored(key: &LockKey) -> Vec<&str> {
    key.keys().iter().map(|k| k.stored.as_str()).collect()
}

/// A count of milliseconds as a `bigint`.
fn bigint(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// A connection string, refused with what to write instead (never echoing it: it may carry a
/// password). A peer that stops acknowledging closes the connection (its statements fail, the
/// next call reconnects; the listener connects again) instead of holding it up for good.
fn parse(url: &str, timeouts: Timeouts) -> Result<tokio_postgres::Config, LockError> {
    let mut config: tokio_postgres::Config = tls::readable(url).parse().map_err(|e| {
        // The cause, only where it names a parameter, never a value (a password's part).
        let cause = std::error::Error::source(&e).map_or_else(String::new, ToString::to_string);
        let instead = [
            (
                "sslrootcert",
                "give the server's CA with RegistryBuilder::tls_root_cert",
            ),
            (
                "sslcert",
                "give the client certificate with RegistryBuilder::tls_client_cert",
            ),
            (
                "sslkey",
                "give the client key with RegistryBuilder::tls_client_cert",
            ),
        ]
        .into_iter()
        .find(|(name, _)| cause == format!("unknown option `{name}`"));
        match instead {
            Some((name, instead)) => LockError::config(format!(
                "the Postgres connection string's `{name}` is not read here: {instead} \
                 (as PEM), and keep sslmode=verify-full (or require) in the string"
            )),
            None => LockError::config(format!(
                "the Postgres connection string is not valid ({e}{}); write it as \
                 postgres://user:password@host:5432/database",
                if cause.starts_with("invalid value for option") {
                    format!(": {cause}")
                } else {
                    String::new()
                }
            )),
        }
    })?;
    // The kernel takes the keepalive idle time in whole seconds, and refuses zero.
    config
        .tcp_user_timeout(timeouts.round())
        .keepalives(true)
        .keepalives_idle(timeouts.round().max(Duration::from_secs(1)));
    Ok(config)
}

/// `host:port` of the first host (never credentials), or the socket directory.
fn node_name(config: &tokio_postgres::Config) -> String {
    let port = config.get_ports().first().copied().unwrap_or(5432);
    match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => format!("{host}:{port}"),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(dir)) => format!("{}:{port}", dir.display()),
        None => format!("localhost:{port}"),
    }
}

impl Store for PostgresStore {
    fn node(&self) -> &str {
        &self.node
    }

    fn hub(&self) -> &WaitHub {
        &self.hub
    }

    /// One sequence serves every key.
    fn offers_fencing(&self) -> bool {
        true
    }

    fn hands_over(&self) -> bool {
        true
    }

    /// Where the schema has `stand_aside` (one made by an earlier version, which this role
    /// could not add it to, does not: its candidate then stops campaigning meanwhile).
    fn stands_aside(&self) -> bool {
        self.link.keeps_aside()
    }

    fn checks_transactions(&self) -> bool {
        true
    }

    /// Postgres text holds no NUL byte, and a btree index row at most about 2,700 bytes.
    fn admit(&self, key: &LockKey) -> Result<(), LockError> {
        for k in key.keys() {
            let reason = if k.stored.contains('\0') {
                "it contains a NUL byte, which Postgres text cannot hold; drop or replace it"
            } else if k.stored.len() > MAX_STORED_KEY {
                "with the registry's prefix it is longer than 2000 bytes, more than a Postgres \
                 index row holds; hash the long part of the key (its SHA-256 in hex, say)"
            } else {
                continue;
            };
            return Err(LockError::InvalidKey {
                key: key.name.clone(),
                reason: reason.to_owned(),
            });
        }
        Ok(())
    }

    async fn acquire(&self, attempt: &Acquire<'_>) -> Result<Attempt, LockError> {
        if attempt.key.is_multi() {
            self.acquire_all(attempt).await
        } else {
            self.acquire_one(attempt).await
        }
    }

    async fn release(&self, key: &LockKey, token: &str, _: Share) -> Result<bool, LockError> {
        let keys = stored(key);
        let tenure = tenure_name(token);
        let row = self
            .call("release", Some(key), |c| async move {
                c.query_typed_one(
                    RELEASE,
                    &[
                        (&keys, Type::TEXT_ARRAY),
                        (&token, Type::TEXT),
                        (&tenure, Type::TEXT),
                    ],
                )
                .await
            })
            .await?;
        Ok(row.get(0))
    }

    async fn release_to(
        &self,
        key: &LockKey,
        token: &str,
        successor: &str,
    ) -> Result<Option<bool>, LockError> {
        if !self.link.names_successors() {
            let released = self.release(key, token, Share::Exclusive).await?;
            return Ok(released.then_some(false));
        }
        let stored = key.stored.as_str();
        let tenure = tenure_name(token);
        let row = self
            .call("release", Some(key), |c| async move {
                c.query_typed_one(
                    RELEASE_TO,
                    &[
                        (&stored, Type::TEXT),
                        (&token, Type::TEXT),
                        (&tenure, Type::TEXT),
                        (&successor, Type::TEXT),
                    ],
                )
                .await
            })
            .await?;
        let outcome: i32 = row.get(0);
        Ok((outcome > 0).then_some(outcome == 3))
    }

    async fn renew(
        &self,
        batch: &[Renewal<'_>],
        budget: Duration,
    ) -> Result<Vec<Option<Renewed>>, LockError> {
        let keys: Vec<&str> = batch.iter().map(|r| r.key.stored.as_str()).collect();
        let tokens: Vec<&str> = batch.iter().map(|r| r.token).collect();
        let ttls: Vec<i64> = batch.iter().map(|r| bigint(r.ttl_ms)).collect();
        let fences: Vec<Option<i64>> = batch
            .iter()
            .map(|r| r.fence.and_then(|f| i64::try_from(f).ok()))
            .collect();
        let found = self
            .link
            .run(Some(budget), |c| async move {
                c.query_typed_one(
                    RENEW,
                    &[
                        (&keys, Type::TEXT_ARRAY),
                        (&tokens, Type::TEXT_ARRAY),
                        (&ttls, Type::INT8_ARRAY),
                        (&fences, Type::INT8_ARRAY),
                    ],
                )
                .await
            })
            .await
            .map_err(|f| self.link.error("renew", None, f))?;
        let found: Vec<String> = found.get(0);
        Ok(found
            .iter()
            .map(|f| match f.as_str() {
                "yes" => Some(Renewed::Yes),
                "taken" => Some(Renewed::Taken),
                "gone" => Some(Renewed::Gone),
                _ => None,
            })
            .collect())
    }

    async fn inspect(&self, key: &LockKey) -> Result<LockInfo, LockError> {
        let rows = self
            .call("inspect", Some(key), |c| async move {
                // Known only after the call connected (and checked the schema).
                let held = self.link.keeps_since();
                let statement = if held { INSPECT_HELD } else { INSPECT };
                let rows = c.query_typed(statement, &[(&key.stored, Type::TEXT)]).await;
                rows.map(|rows| (rows, held))
            })
            .await?;
        let (rows, held) = rows;
        let mut info = LockInfo::default();
        let (mut shared, mut holders) = (None, Vec::new());
        for row in &rows {
            let kind: &str = row.get(0);
            let token: Option<String> = row.get(1);
            let share: Option<String> = row.get(2);
            let remaining = millis(row, 3);
            info.fence = info.fence.max(fence(row, 4));
            match (kind, token, share.as_deref(), remaining) {
                ("holder", Some(token), Some(""), remaining) => {
                    info.owner = Some(token);
                    info.remaining = remaining;
                    info.held_for = if held { millis(row, 5) } else { None };
                }
                ("holder", Some(token), Some(tag), Some(remaining)) => {
                    shared = Share::from_tag(tag);
                    holders.push(Place::new(token, remaining));
                }
                (kind @ ("waiter" | "aside"), Some(token), _, Some(remaining)) => {
                    let place = Place::new(token, remaining).standing_aside(kind == "aside");
                    info.queue.push(place);
                }
                _ => {}
            }
        }
        info.waiters = u32::try_from(info.queue.len()).unwrap_or(u32::MAX);
        if let Some(share) = shared {
            info.held_shared(share, holders);
        }
        Ok(info)
    }

    async fn announce_taken(&self, key: &LockKey) -> Result<(), LockError> {
        self.call("announce", Some(key), |c| async move {
            c.query_typed(
                ANNOUNCE,
                &[(&key.stored, Type::TEXT), (&ELECTED, Type::TEXT)],
            )
            .await
        })
        .await
        .map(drop)
    }

    async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        let row = self
            .call("force_unlock", Some(key), |c| async move {
                c.query_typed_one(FORCE_UNLOCK, &[(&key.stored, Type::TEXT)])
                    .await
            })
            .await?;
        Ok(row.get(0))
    }
}
