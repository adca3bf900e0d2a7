//! A lock checked inside the application's own Postgres transaction: the statement that makes
//! the transaction commit only while the lock is held.

use crate::backend::{Backend, Store};
use crate::lease::Lease;

/// Makes a Postgres transaction of the application commit only while a lock is held: run
/// [`STATEMENT`](Self::STATEMENT) with [`keys`](Self::keys) and [`token`](Self::token) inside
/// the transaction, after its writes and before `COMMIT`. It fails (SQLSTATE `55000`) unless the
/// lock is still held with this token, and from then until the transaction ends nobody can
/// take the lock over, even once its lease ran out: a holder stopped past its lease (a pause,
/// a swapped-out process) can never commit a write after the next holder's.
///
/// From [`LockGuard::transaction_check`](crate::LockGuard::transaction_check) or
/// [`CurrentLock::transaction_check`](crate::CurrentLock::transaction_check) on a Postgres
/// registry. It names no client library: with tokio-postgres,
///
/// ```ignore
/// let check = held.transaction_check().expect("a Postgres lock");
/// tx.execute("UPDATE invoices SET paid = true WHERE id = 7", &[]).await?;
/// tx.execute(lock_runtime::TransactionCheck::STATEMENT, &[&check.keys(), &check.token()])
///     .await?;
/// tx.commit().await?;
/// ```
///
/// and with sqlx, `sqlx::query(TransactionCheck::STATEMENT).bind(check.keys()).bind(check.token())`.
/// The lock's role needs `EXECUTE` on `distributed_lock.hold`; a transaction that keeps a lock
/// this way holds up its next holder until it ends, so keep it short (Postgres's
/// `idle_in_transaction_session_timeout` ends one whose client stopped).
#[derive(Clone)]
pub struct TransactionCheck {
    keys: Vec<String>,
    token: String,
}

impl TransactionCheck {
    /// The statement, with `$1` the keys (`text[]`) and `$2` the token (`text`).
    pub const STATEMENT: &'static str = "SELECT distributed_lock.hold($1::text[], $2::text)";

    /// The check of `lease`, where its store offers one.
    pub(crate) fn of(backend: &Backend, lease: &Lease) -> Option<Self> {
        backend.checks_transactions().then(|| Self {
            keys: lease.key.keys().iter().map(|k| k.stored.clone()).collect(),
            token: lease.token.clone(),
        })
    }

    /// The lock's keys as the store names them (the registry's prefix included): `$1`.
    #[must_use]
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The holder's token: `$2`. Whoever has it can release the lock: keep it out of logs.
    #[must_use]
    pub fn token(&self) -> &str {
        &self.token
    }
}

/// Shows the keys, never the token.
impl std::fmt::Debug for TransactionCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionCheck")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}
