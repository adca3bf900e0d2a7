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
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
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

/// How long a session must have listened for its loss to start the pauses between connections
/// over, and a later failure to be told again: a server that ends sessions at once (an
/// `idle_session_timeout`, a firewall) is not connected to in a storm.
const STEADY: Duration = Duration::from_secs(1);

/// Where the listener is, from one turn of its loop to the next.
struct Turns {
    session: Option<Session>,
    /// Since when the session has listened on every channel wanted.
    listening_since: Option<Instant>,
    /// The pause before the next connection.
    backoff: Backoff,
    /// Whether this outage was told already.
    warned: bool,
    /// Whether waiters were left relying on a session that is gone: at the next failure to
    /// listen they are told to poll (see [`Listener::cannot_listen`]); the next session that
    /// listens wakes them anyway.
    owed: bool,
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
        let mut state = Turns {
            session: None,
            listening_since: None,
            backoff: Backoff::new(),
            warned: false,
            owed: false,
        };
        loop {
            let Some(wanted) = self.waiters.channels() else {
                return;
            };
            if state.session.is_none() && !wanted.is_empty() {
                match self.connect().await {
                    Ok(made) => state.session = Some(made),
                    Err(error) => {
                        if !self.cannot_listen(&mut state, error) {
                            return;
                        }
                        tokio::time::sleep(state.backoff.next_pause()).await;
                        continue;
                    }
                }
            }
            if let Some(s) = &mut state.session {
                match self.follow(s, &wanted).await {
                    Ok(()) => {
                        if state.listening_since.is_none() && !wanted.is_empty() {
                            state.listening_since = Some(Instant::now());
                            state.owed = false;
                            // What was missed while no session listened, now that one does: a
                            // release before this `LISTEN` reached nobody.
                            if !self.waiters.wake_every_key() {
                                return;
                            }
                        }
                    }
                    Err(error) => {
                        if !self.lost(&mut state, Some(error)).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            let next = async {
                match &mut state.session {
                    Some(s) => s.notifications.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.waiters.changed() => {}
                received = next => match received {
                    Some(n) => {
                        let s = state.session.as_ref().expect("a notification came on a session");
                        if let Some(key) = s.keys.get(n.channel()) {
                            if !self.waiters.deliver(key, &notification::read(n.payload())) {
                                return;
                            }
                        }
                    }
                    // The connection closed: made again at the next turn, after a pause.
                    None => {
                        if !self.lost(&mut state, None).await {
                            return;
                        }
                    }
                },
            }
        }
    }

    /// The session is gone (closed, or failed with `error`). Its waiters go on relying on
    /// notifications while the next session is made: the one that listens wakes them for what
    /// they missed (a server ending sessions at once costs one wake-up a turn), and a failure to
    /// listen first tells them to poll. The next connection waits a pause, which keeps growing
    /// unless the session had listened for [`STEADY`]; one that had not is a failure too.
    /// `false` once the hub is gone.
    async fn lost(&self, state: &mut Turns, error: Option<String>) -> bool {
        state.session = None;
        state.owed = true;
        match state.listening_since.take() {
            Some(since) if since.elapsed() >= STEADY => {
                (state.backoff, state.warned) = (Backoff::new(), false);
            }
            // Told, as a failure; its waiters are woken by the next session all the same.
            Some(since) if error.is_none() => {
                let ended = format!(
                    "the server ended the session {:?} after it began listening",
                    since.elapsed()
                );
                self.failed(&mut state.warned, ended);
            }
            _ => {}
        }
        if let Some(error) = error {
            if !self.cannot_listen(state, error) {
                return false;
            }
        }
        tokio::time::sleep(state.backoff.next_pause()).await;
        true
    }

    /// A failure to connect or to `LISTEN`: told (once an outage), and the waiters of a session
    /// lost before, which relied on it, cannot be told of a release now, so each is woken to
    /// poll until a session listens again (see [`Waiters::unfollowed`]). `false` once the hub
    /// is gone.
    fn cannot_listen(&self, state: &mut Turns, error: String) -> bool {
        self.failed(&mut state.warned, error);
        !std::mem::take(&mut state.owed)
            || (self.waiters.unfollowed() && self.waiters.wake_every_key())
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
