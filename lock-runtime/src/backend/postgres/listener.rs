//! The Postgres feed of release notifications: one connection of its own that `LISTEN`s on the
//! channel of each key someone here waits for (`distributed_lock.channel`), following that set
//! as it changes, and hands each notification to the waiting hub.
//!
//! `LISTEN` belongs to a session: this connection must reach Postgres itself (or a pooler in
//! session mode), not PgBouncer's transaction mode. After a reconnection every waiter is woken
//! once, for the notifications it may have missed; a waiter's wait is bounded by the holder's
//! lease anyway.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, Row};

use super::link::Link;
use super::tls::Endpoint;
use crate::backend::notification;
use crate::backoff::Backoff;
use crate::report;
use crate::timeouts::Timeouts;
use crate::waiting::{WaitHub, Waiters};

/// A hub fed by one listening connection to `link`'s database (at `endpoint`, the node
/// `node`); a waiter whose channel is not followed within a command timeout backs off instead.
pub(super) fn hub(
    link: Arc<Link>,
    endpoint: Endpoint,
    node: String,
    timeouts: Timeouts,
) -> WaitHub {
    let feed = move |waiters| {
        Listener {
            link,
            endpoint,
            node,
            timeouts,
            waiters,
        }
        .run()
    };
    WaitHub::fed_by([feed], timeouts.command)
}

struct Listener {
    /// The store's statements (the schema is made through it before anyone listens).
    link: Arc<Link>,
    /// Where to listen: a session of its own.
    endpoint: Endpoint,
    /// Its name, for the warning.
    node: String,
    timeouts: Timeouts,
    waiters: Waiters,
}

/// A listening connection: the client to send `LISTEN` on, and its notifications.
struct Session {
    client: Client,
    notifications: mpsc::UnboundedReceiver<tokio_postgres::Notification>,
    /// The hub's channel (a key's stored name) of each Postgres channel listened on.
    keys: HashMap<String, String>,
}

impl Listener {
    async fn run(self) {
        let mut session: Option<Session> = None;
        // Until a session listens: each failure waits longer before the next connection (which
        // wakes every waiter), and the first of an outage is told.
        let mut backoff = Backoff::new();
        let mut warned = false;
        loop {
            let Some(wanted) = self.waiters.channels() else {
                return;
            };
            if session.is_none() && !wanted.is_empty() {
                match self.connect().await {
                    Ok(made) => {
                        session = Some(made);
                        // What was missed while no connection listened.
                        if !self.waiters.wake_every_key() {
                            return;
                        }
                    }
                    Err(error) => {
                        self.failed(&mut warned, error);
                        tokio::time::sleep(backoff.next_pause()).await;
                        continue;
                    }
                }
            }
            if let Some(s) = &mut session {
                match self.follow(s, &wanted).await {
                    Ok(()) if !wanted.is_empty() => (backoff, warned) = (Backoff::new(), false),
                    Ok(()) => {}
                    Err(error) => {
                        session = None;
                        self.failed(&mut warned, error);
                        tokio::time::sleep(backoff.next_pause()).await;
                        continue;
                    }
                }
            }
            let next = async {
                match &mut session {
                    Some(s) => s.notifications.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.waiters.changed() => {}
                received = next => match received {
                    Some(n) => {
                        let s = session.as_ref().expect("a notification came on a session");
                        if let Some(key) = s.keys.get(n.channel()) {
                            if !self.waiters.deliver(key, &notification::read(n.payload())) {
                                return;
                            }
                        }
                    }
                    // The connection closed: made again at the next turn.
                    None => session = None,
                },
            }
        }
    }

    /// Tells of `error`, the first failure since a session last listened.
    fn failed(&self, warned: &mut bool, error: String) {
        if std::mem::replace(warned, true) {
            return;
        }
        let node = self.node.clone();
        report::tell(move || {
            tracing::warn!(
                node,
                error,
                "lock waiters cannot LISTEN for releases: they poll until they can (hand-overs \
                 come later). LISTEN needs a session of its own on a primary (not a hot standby, \
                 nor a pooler in transaction mode), as a role with USAGE on the schema \
                 `distributed_lock`"
            );
        });
    }

    /// Listens on the channels of `wanted` not listened on yet, and stops listening on the
    /// others; each new one is reported followed.
    async fn follow(&self, s: &mut Session, wanted: &[String]) -> Result<(), String> {
        let gone: Vec<String> = s
            .keys
            .iter()
            .filter(|(_, key)| !wanted.contains(key))
            .map(|(channel, _)| channel.clone())
            .collect();
        for channel in gone {
            if let Some(key) = s.keys.remove(&channel) {
                self.call(&s.client, "SELECT distributed_lock.unlisten($1)", &key)
                    .await?;
            }
        }
        for key in wanted {
            if s.keys.values().any(|k| k == key) {
                continue;
            }
            let rows = self
                .call(&s.client, "SELECT distributed_lock.listen($1)", key)
                .await?;
            let channel: String = rows.first().map(|r| r.get(0)).unwrap_or_default();
            s.keys.insert(channel, key.clone());
            self.waiters.followed(key);
        }
        Ok(())
    }

    /// `statement` with `key` for its one parameter, within the command timeout.
    async fn call(&self, client: &Client, statement: &str, key: &str) -> Result<Vec<Row>, String> {
        let params: [(&(dyn ToSql + Sync), Type); 1] = [(&key, Type::TEXT)];
        match tokio::time::timeout(
            self.timeouts.command,
            client.query_typed(statement, &params),
        )
        .await
        {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => Err(super::link::described(&e)),
            Err(_) => Err(format!("no answer within {:?}", self.timeouts.command)),
        }
    }

    /// A connection of its own (the schema made first, through the store's link), whose
    /// notifications come out of the returned receiver until it closes.
    async fn connect(&self) -> Result<Session, String> {
        if let Err(failure) = self.link.client().await {
            return Err(format!("the schema could not be made first: {failure:?}"));
        }
        let connecting = self.endpoint.connect();
        let (client, mut connection) = match tokio::time::timeout(self.timeouts.connect, connecting)
            .await
        {
            Ok(Ok(made)) => made,
            Ok(Err(e)) => return Err(format!("could not connect: {}", super::link::described(&e))),
            Err(_) => return Err(format!("no connection within {:?}", self.timeouts.connect)),
        };
        let (tx, notifications) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(|cx| connection.poll_message(cx));
            while let Some(Ok(message)) = futures_util::StreamExt::next(&mut messages).await {
                if let AsyncMessage::Notification(n) = message {
                    if tx.send(n).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Session {
            client,
            notifications,
            keys: HashMap::new(),
        })
    }
}
