//! Talking to a server straight, behind the library's back: raw connections, and what the
//! server counts.

/// A raw async connection straight to a server, for interfering behind the library's back.
/// Its timeouts are a test's, not the client's defaults (1 s to connect, 500 ms per reply),
/// which a loaded machine exceeds: a test that wants a timeout sets its own.
///
/// # Panics
/// When the server does not answer within 10 s.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    let patient = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(std::time::Duration::from_secs(10)))
        .set_response_timeout(Some(std::time::Duration::from_secs(10)));
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection_with_config(&patient)
        .await
        .expect("raw connection")
}

/// A synchronous connection straight to a server, for raw commands and counters.
///
/// # Panics
/// When the server does not answer.
#[must_use]
pub fn connection(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .expect("url")
        .get_connection()
        .expect("connect to the test redis-server")
}

/// Whether the server knows `command` (`COMMAND INFO` answers nil for one it does not), e.g.
/// Valkey 9's `DELIFEQ`.
///
/// # Panics
/// When the server does not answer.
#[must_use]
pub fn has_command(con: &mut redis::Connection, command: &str) -> bool {
    let info: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(command)
        .query(con)
        .expect("COMMAND INFO");
    !matches!(info.as_slice(), [] | [redis::Value::Nil])
}

/// Calls per command name from `INFO commandstats` (e.g. `"evalsha" -> 12`).
///
/// # Panics
/// When the server does not answer.
#[must_use]
pub fn command_calls(con: &mut redis::Connection) -> std::collections::HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Subscribers of `channel` on the server at `url` (`PUBSUB NUMSUB`), asked on a fresh
/// unrestricted connection.
///
/// # Panics
/// When the server does not answer.
pub async fn subscribers(url: &str, channel: &str) -> i64 {
    count_subscribers(url, "NUMSUB", channel).await
}

/// Subscribers of shard channel `channel` on the cluster node at `url` (`PUBSUB SHARDNUMSUB`).
///
/// # Panics
/// When the node does not answer.
pub async fn shard_subscribers(url: &str, channel: &str) -> i64 {
    count_subscribers(url, "SHARDNUMSUB", channel).await
}

async fn count_subscribers(url: &str, subcommand: &str, channel: &str) -> i64 {
    let mut con = raw(url).await;
    let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg(subcommand)
        .arg(channel)
        .query_async(&mut con)
        .await
        .unwrap_or_else(|e| panic!("PUBSUB {subcommand}: {e}"));
    n.first().map_or(0, |(_, n)| *n)
}

/// Whether the server has `SET .. IFEQ` (Valkey 8.1+): asked straight, on a key no test uses.
///
/// # Panics
/// When the server does not answer, or answers something other than nil or an error.
pub async fn has_set_ifeq(url: &str) -> bool {
    let mut con = raw(url).await;
    takes_set_ifeq(ifeq_probe().query_async(&mut con).await)
}

/// Whether the servers the fixtures start ([`crate::server_binary`]) have `SET .. IFEQ`:
/// asked once per process, of a server started for the question.
///
/// # Panics
/// When that server does not start or answers something other than nil or an error.
#[must_use]
pub fn fixture_has_set_ifeq() -> bool {
    static ANSWER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ANSWER.get_or_init(|| {
        let server = crate::RedisServer::start();
        takes_set_ifeq(ifeq_probe().query(&mut server.connection()))
    })
}

fn ifeq_probe() -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg("lock-tests:ifeq-probe")
        .arg("x")
        .arg("IFEQ")
        .arg("y");
    cmd
}

fn takes_set_ifeq(reply: redis::RedisResult<Option<String>>) -> bool {
    match reply {
        Ok(None) => true,
        Ok(Some(other)) => panic!("SET IFEQ on a missing key answered {other:?}"),
        Err(e) => {
            assert!(e.to_string().contains("syntax error"), "{e}");
            false
        }
    }
}

/// `INFO commandstats` counters of one command: (calls, failed calls).
///
/// # Panics
/// When the server does not answer.
pub async fn command_counts(url: &str, command: &str) -> (u64, u64) {
    let mut con = raw(url).await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con)
        .await
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:");
    let Some(stats) = info.lines().find_map(|line| line.strip_prefix(&prefix)) else {
        return (0, 0);
    };
    let field = |name: &str| {
        stats
            .split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("calls"), field("failed_calls"))
}
