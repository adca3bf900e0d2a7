//! The Postgres store's one connection: made on the I/O runtime (where its driver task lives,
//! so no caller's runtime can take it down), made again after it broke, with the schema
//! created or checked on the first one. Every caller's statement is pipelined on it, as one
//! multiplexed Redis connection carries every command.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::tls::Endpoint;

use crate::error::{LockError, StoreError};
use crate::io;
use crate::timeouts::Timeouts;

/// The schema this library's statements need ([`SCHEMA`]'s version).
pub(crate) const SCHEMA_VERSION: i32 = 1;

/// The tables and functions, created on first use (or by `lockctl`), each statement idempotent.
pub(crate) const SCHEMA: &str = include_str!("schema.sql");

/// Serialises concurrent creators of the schema (`CREATE OR REPLACE FUNCTION` run by two
/// sessions at once fails): an advisory lock's number, "dlock" in ASCII.
const SCHEMA_LOCK: i64 = 0x0064_6c6f_636b;

pub(crate) struct Link {
    endpoint: Endpoint,
    node: String,
    timeouts: Timeouts,
    current: Mutex<Option<Arc<Client>>>,
    /// Held while a connection is being made, so callers meanwhile wait for that one.
    connecting: tokio::sync::Mutex<()>,
    schema_checked: AtomicBool,
    /// The schema has `release_to`, which elections hand over by name with.
    names_successors: AtomicBool,
    /// The schema has `stand_aside`, and its waiters the `aside` column.
    keeps_aside: AtomicBool,
    /// The schema has `held_since`, and its holders the `since` column.
    keeps_since: AtomicBool,
}

/// What went wrong on the way to an answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No connection could be made: nothing was sent.
    Connect(tokio_postgres::Error),
    /// The statement failed, or its connection did.
    Statement(tokio_postgres::Error),
    /// No answer within the bound.
    TimedOut(Duration),
    /// The schema in the database is not one this library can use.
    Schema(String),
}

impl Link {
    pub(crate) fn new(endpoint: Endpoint, node: String, timeouts: Timeouts) -> Self {
        Self {
            endpoint,
            node,
            timeouts,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            schema_checked: AtomicBool::new(false),
            names_successors: AtomicBool::new(false),
            keeps_aside: AtomicBool::new(false),
            keeps_since: AtomicBool::new(false),
        }
    }

    /// Whether the schema has `release_to` (a schema made by an earlier version of this
    /// library, which this role could not add it to, does not).
    pub(crate) fn names_successors(&self) -> bool {
        self.names_successors.load(Ordering::Acquire)
    }

    /// Whether the schema keeps a candidate's place while it stands aside (`stand_aside`; a
    /// schema made by an earlier version, which this role could not add it to, does not).
    pub(crate) fn keeps_aside(&self) -> bool {
        self.keeps_aside.load(Ordering::Acquire)
    }

    /// Whether the schema keeps when each holder took its lock (`held_since`; a schema made by
    /// an earlier version, which this role could not add it to, does not).
    pub(crate) fn keeps_since(&self) -> bool {
        self.keeps_since.load(Ordering::Acquire)
    }

    /// Runs `statement` on the connection within the command timeout (`budget` when given).
    /// A statement that goes unanswered keeps the connection: what the caller sends next (the
    /// release that undoes an attempt it gave up on) must run after it, as it does on one
    /// connection. A dead peer closes it (`tcp_user_timeout`, keepalives); a statement waits
    /// for a lock at most `lock_timeout` (the functions set it).
    pub(crate) async fn run<T, F, Fut>(
        &self,
        budget: Option<Duration>,
        statement: F,
    ) -> Result<T, Failure>
    where
        F: FnOnce(Arc<Client>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let client = self.client().await?;
        let bound = budget.unwrap_or(self.timeouts.command);
        match tokio::time::timeout(bound, statement(client.clone())).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => {
                if e.is_closed() {
                    self.forget(&client);
                }
                if schema_missing(&e) {
                    // Dropped by an operator, lost in a restore: made again at the next call.
                    self.schema_checked.store(false, Ordering::Release);
                }
                Err(Failure::Statement(e))
            }
            Err(_) => Err(Failure::TimedOut(bound)),
        }
    }

    /// The connection, made (and the schema checked) if there is none that works.
    pub(crate) async fn client(&self) -> Result<Arc<Client>, Failure> {
        let checked = || self.schema_checked.load(Ordering::Acquire);
        if let Some(client) = self.working().filter(|_| checked()) {
            return Ok(client);
        }
        let _turn = self.connecting.lock().await;
        let client = match self.working() {
            Some(client) => client,
            None => {
                let client = Arc::new(self.connect().await?);
                *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(client.clone());
                client
            }
        };
        if !checked() {
            if let Err(failure) = self.ensure_schema(&client).await {
                if matches!(failure, Failure::TimedOut(_)) {
                    // Its batch may go on, and fail, inside its transaction on the server:
                    // a session that would refuse every later statement is not kept.
                    self.forget(&client);
                }
                return Err(failure);
            }
            self.schema_checked.store(true, Ordering::Release);
        }
        Ok(client)
    }

    /// A new connection, made on the I/O runtime: its driver is spawned where it is made.
    async fn connect(&self) -> Result<Client, Failure> {
        let endpoint = self.endpoint.clone();
        let bound = self.timeouts.connect;
        io::run(async move {
            match tokio::time::timeout(bound, endpoint.connect()).await {
                Ok(Ok((client, connection))) => {
                    tokio::spawn(connection);
                    Ok(client)
                }
                Ok(Err(e)) => Err(Failure::Connect(e)),
                Err(_) => Err(Failure::TimedOut(bound)),
            }
        })
        .await
    }

    fn working(&self) -> Option<Arc<Client>> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.as_ref().filter(|c| !c.is_closed()).cloned()
    }

    /// Drops `client` as the connection (unless another replaced it already): the next call
    /// makes a new one, and the old one closes once its last statement is done with it.
    fn forget(&self, client: &Arc<Client>) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
            *current = None;
        }
    }

    /// Creates the schema if it is missing; refuses one newer than this library's.
    async fn ensure_schema(&self, client: &Client) -> Result<(), Failure> {
        let bound = self.timeouts.round();
        let checked = tokio::time::timeout(bound, async {
            // The functions added within this version, each checked.
            let found = client
                .query_typed(
                    "SELECT max(version), to_regprocedure(\
                     'distributed_lock.release_to(text, text, text, text)') IS NOT NULL, \
                     to_regprocedure('distributed_lock.stand_aside(text, text, text, bigint, \
                     boolean, integer)') IS NOT NULL, \
                     to_regprocedure('distributed_lock.held_since(text)') IS NOT NULL \
                     FROM distributed_lock.schema_version",
                    &[],
                )
                .await;
            let (version, names, aside, since): (Option<i32>, bool, bool, bool) = match found {
                Ok(rows) => rows.first().map_or((None, false, false, false), |row| {
                    (row.get(0), row.get(1), row.get(2), row.get(3))
                }),
                Err(e) if schema_missing(&e) => (None, false, false, false),
                Err(e) => return Err(Failure::Statement(e)),
            };
            // Its DDL waits at most a second for a table's lock: an ALTER TABLE waiting for
            // ACCESS EXCLUSIVE behind an application's transaction (one that `hold`s a lock)
            // would hold up every lock statement behind it. Not the advisory lock: a session
            // creating the schema at the same time is waited for.
            let create = format!(
                "BEGIN; SET LOCAL synchronous_commit = on; \
                 SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); \
                 SET LOCAL lock_timeout = '1s'; {SCHEMA} COMMIT;"
            );
            match version {
                Some(v) if v == SCHEMA_VERSION => {
                    let (mut names, mut aside, mut since) = (names, aside, since);
                    if !(names && aside && since) {
                        // Added within this version: made where this role may (and the tables
                        // are not held up); elsewhere what needs it does without.
                        match client.batch_execute(&create).await {
                            Ok(()) => (names, aside, since) = (true, true, true),
                            Err(e) => {
                                let _ = client.batch_execute("ROLLBACK").await;
                                let without = [
                                    (
                                        names,
                                        "an election's hand-over by name goes to the next \
                                         candidate instead",
                                    ),
                                    (aside, "a candidate standing aside leaves the line"),
                                    (
                                        since,
                                        "held-for times are not shown (so `lockctl list \
                                         --oldest` lists nothing from this database)",
                                    ),
                                ];
                                let without: Vec<&str> = without
                                    .iter()
                                    .filter(|(has, _)| !has)
                                    .map(|(_, meanwhile)| *meanwhile)
                                    .collect();
                                tracing::warn!(
                                    node = %self.node,
                                    error = %described(&e),
                                    "the schema `distributed_lock` lacks what this library \
                                     added to it, and could not be given it: {}; run \
                                     `lockctl schema | psql` as the schema's owner",
                                    without.join(", ")
                                );
                            }
                        }
                    }
                    self.names_successors.store(names, Ordering::Release);
                    self.keeps_aside.store(aside, Ordering::Release);
                    self.keeps_since.store(since, Ordering::Release);
                    Ok(())
                }
                Some(v) if v > SCHEMA_VERSION => Err(Failure::Schema(format!(
                    "the schema `distributed_lock` is at version {v}, newer than this \
                     library's ({SCHEMA_VERSION}): upgrade lock-runtime in this service"
                ))),
                _ => {
                    if let Err(e) = client.batch_execute(&create).await {
                        // Not left in the failed transaction: every later statement on this
                        // connection would be refused.
                        let _ = client.batch_execute("ROLLBACK").await;
                        return Err(Failure::Statement(e));
                    }
                    self.names_successors.store(true, Ordering::Release);
                    self.keeps_aside.store(true, Ordering::Release);
                    self.keeps_since.store(true, Ordering::Release);
                    Ok(())
                }
            }
        })
        .await;
        checked.unwrap_or(Err(Failure::TimedOut(bound)))
    }

    /// The error `command` ended with, for the caller.
    pub(crate) fn error(&self, command: &'static str, key: Option<&str>, f: Failure) -> LockError {
        let (message, source) = match f {
            Failure::Connect(e) => {
                let message = format!("could not connect: {}", described(&e));
                (message, Some(StoreError::new(e, true, true)))
            }
            Failure::Statement(e) => {
                let transient = transient(&e);
                let mut message = described(&e);
                if e.code() == Some(&SqlState::UNDEFINED_FUNCTION) {
                    message.push_str(
                        " (the schema `distributed_lock` lacks a function this library added: \
                         run `lockctl schema | psql` as its owner)",
                    );
                }
                if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
                    message.push_str(
                        " (the lock's role needs USAGE on the schema `distributed_lock`, and \
                         EXECUTE on its functions: an owner can create it with `lockctl schema | psql`)",
                    );
                }
                (message, Some(StoreError::new(e, transient, false)))
            }
            Failure::TimedOut(bound) => {
                let e = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {bound:?}"),
                );
                (e.to_string(), Some(StoreError::new(e, true, false)))
            }
            Failure::Schema(message) => (message, None),
        };
        LockError::Backend {
            node: self.node.clone(),
            command,
            key: key.map(str::to_owned),
            message,
            source,
        }
    }
}

/// Whether `e` says the schema (or a table or function of it) is not there.
fn schema_missing(e: &tokio_postgres::Error) -> bool {
    [
        SqlState::INVALID_SCHEMA_NAME,
        SqlState::UNDEFINED_TABLE,
        SqlState::UNDEFINED_FUNCTION,
    ]
    .iter()
    .any(|code| e.code() == Some(code))
}

/// A server's error with its detail (tokio-postgres shows only "db error" otherwise), or the
/// client's with its cause, and what to do about a certificate that could not be checked.
pub(super) fn described(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut message = format!("{}: {} ({})", db.severity(), db.message(), db.code().code());
        if db.message().contains("no encryption") {
            message.push_str(
                " (the server takes only TLS: add sslmode=require to the connection string, \
                 with lock-runtime's `postgres-tls` feature)",
            );
        }
        return message;
    }
    let mut message = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        message = format!("{message}: {c}");
        cause = c.source();
    }
    if message.contains("certificate") && !message.contains("client certificate") {
        message.push_str(
            " (the server's certificate could not be checked: give its CA with \
             RegistryBuilder::tls_root_cert, or point SSL_CERT_FILE at it; the certificate \
             must name the host of the connection string)",
        );
    }
    message
}

/// Whether trying again may succeed: a connection that broke or was refused, a server shutting
/// down or starting, a transaction that lost a race; not a refusal (privileges, a missing
/// function, bad input), which no retry changes.
fn transient(e: &tokio_postgres::Error) -> bool {
    let Some(code) = e.code() else {
        return true;
    };
    if schema_missing(e) {
        // The next attempt makes it again.
        return true;
    }
    let class = &code.code()[..2];
    // 08 connection, 40 transaction rollback, 53 resources, 57 operator intervention, 58 system.
    matches!(class, "08" | "40" | "53" | "57" | "58") || code == &SqlState::LOCK_NOT_AVAILABLE
}
