//! Finding lock keys: `SCAN` with `MATCH` on every node that can hold one.
//!
//! `KEYS` would block a production server for as long as it walks the keyspace, so it is never
//! used. A cluster's keys are spread over its masters and a cursor belongs to one node, so each
//! master is scanned on its own; Redlock nodes are independent servers and are all scanned, and
//! each key found says on how many of them it lives.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, TlsMode, Value};

use crate::target::Target;
use crate::Failure;

/// Keys asked for per `SCAN` call: a hint to the server, which bounds each call's work.
const BATCH: usize = 1000;
const TIMEOUT: Duration = Duration::from_secs(5);

/// A lock key found by the scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The Redis key (prefix included).
    pub redis_key: String,
    /// On how many of the scanned nodes it exists (Redlock); 1 elsewhere.
    pub nodes: usize,
}

/// What a scan found, and the nodes it could not read (Redlock goes on without a minority).
#[derive(Debug, Default)]
pub struct Scan {
    /// The keys, sorted.
    pub keys: Vec<Found>,
    /// How many nodes were scanned successfully.
    pub scanned: usize,
    /// `host:port: error` for each node that failed.
    pub failed: Vec<String>,
    /// `host:port` of the master the sentinels named (Sentinel mode).
    pub master: Option<String>,
}

/// The `MATCH` pattern for keys that start with `prefix` literally: glob characters in it are
/// escaped, so a key prefix `a*` matches `a*...`, not `ab...`.
#[must_use]
pub fn pattern(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

/// Scans every node of `target` for keys matching `pattern`.
///
/// # Errors
/// When no node could be scanned (a single server or a cluster failing is an error; a Redlock
/// minority failing is reported in [`Scan::failed`]).
pub async fn scan(target: &Target, under: &str) -> Result<Scan, Failure> {
    let pattern = &pattern(under);
    let mut counts: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
    let mut scan = Scan::default();
    match target {
        Target::Server(url) => {
            for key in scan_server(open(url)?, pattern).await? {
                *counts.entry(key).or_default() += 1;
            }
            scan.scanned = 1;
        }
        Target::Sentinel { master, sentinels } => {
            let master = sentinel_master(master, sentinels).await?;
            scan.master = Some(node_name(&master));
            for key in scan_server(master, pattern).await? {
                *counts.entry(key).or_default() += 1;
            }
            scan.scanned = 1;
        }
        Target::Redlock(urls) => {
            for url in urls {
                match async { scan_server(open(url)?, pattern).await }.await {
                    Ok(keys) => {
                        scan.scanned += 1;
                        for key in keys {
                            *counts.entry(key).or_default() += 1;
                        }
                    }
                    Err(e) => scan.failed.push(e.0),
                }
            }
            if scan.scanned == 0 {
                return Err(Failure(format!(
                    "no Redlock node could be scanned:\n  {}",
                    scan.failed.join("\n  ")
                )));
            }
        }
        Target::Cluster(seeds) => {
            let (keys, masters) = scan_cluster(seeds, pattern).await?;
            for key in keys {
                *counts.entry(key).or_default() += 1;
            }
            scan.scanned = masters;
        }
        Target::Postgres { url, .. } => {
            for key in scan_postgres(url, under).await? {
                *counts.entry(key.into_bytes()).or_default() += 1;
            }
            scan.scanned = 1;
        }
        _ => {
            return Err(Failure(
                "lockctl cannot list the keys of this deployment yet; name a key (`show`, \
                 `watch`, `unlock`)"
                    .to_owned(),
            ))
        }
    }
    scan.keys = counts
        .into_iter()
        .map(|(key, nodes)| Found {
            // Lock keys are Rust strings; anything else under the prefix is shown escaped.
            redis_key: String::from_utf8(key)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            nodes,
        })
        .collect();
    Ok(scan)
}

/// The keys held now in a Postgres store's table that start with `under` (none before the
/// schema exists).
async fn scan_postgres(url: &str, under: &str) -> Result<Vec<String>, Failure> {
    let failed = |e: tokio_postgres::Error| {
        let detail = e.as_db_error().map_or_else(
            // The client's own errors (a TLS handshake's) say what went wrong in their cause.
            || match std::error::Error::source(&e) {
                Some(cause) => format!("{e}: {cause}"),
                None => e.to_string(),
            },
            |d| d.message().to_owned(),
        );
        Failure(format!("Postgres: {detail}"))
    };
    // As the library reads it: libpq's modes that check the server are `require`, which
    // checks it; any other mode is plain TCP.
    let url = lock_runtime::__private::postgres_readable(url);
    let mut config: tokio_postgres::Config = url.parse().map_err(failed)?;
    let client = if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
        let (tls, _) =
            tokio_postgres_rustls::MakeRustlsConnect::with_native_certs().map_err(|e| {
                Failure(format!(
                    "Postgres over TLS: no system root could be read ({e:?}); point \
                     SSL_CERT_FILE at the server's CA"
                ))
            })?;
        let (client, connection) = config.connect(tls).await.map_err(failed)?;
        tokio::spawn(connection);
        client
    } else {
        config.ssl_mode(tokio_postgres::config::SslMode::Disable);
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(failed)?;
        tokio::spawn(connection);
        client
    };
    let rows = client
        .query_typed(
            "SELECT DISTINCT key FROM distributed_lock.holders \
             WHERE starts_with(key, $1) AND expires_at > clock_timestamp() ORDER BY 1",
            &[(&under, tokio_postgres::types::Type::TEXT)],
        )
        .await;
    match rows {
        Ok(rows) => Ok(rows.iter().map(|r| r.get(0)).collect()),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
            Ok(Vec::new())
        }
        Err(e) => Err(failed(e)),
    }
}

/// A client for `url` (`rediss://` trusts the system's roots, as the library does).
fn open(url: &str) -> Result<redis::Client, Failure> {
    redis::Client::open(url.trim()).map_err(|e| {
        // The URL may hold a password: say only what kind of error it was.
        Failure(format!(
            "not a valid Redis URL ({:?}); expected redis://[user:password@]host:port[/db]",
            e.kind()
        ))
    })
}

/// The master the sentinels name for `master` (a service name, or a URL whose host is the
/// name and which carries the master's login), reached as the library reaches it: over TLS
/// when the master URL is `rediss://`, or, for a plain name, when the sentinels' URLs are.
async fn sentinel_master(master: &str, sentinels: &[String]) -> Result<redis::Client, Failure> {
    let sentinels: Vec<ConnectionInfo> = sentinels
        .iter()
        .map(|url| open(url).map(|c| c.get_connection_info().clone()))
        .collect::<Result<_, _>>()?;
    let Some(first) = sentinels.first() else {
        return Err(Failure("no sentinel URL given".into()));
    };
    let master = master.trim();
    let (service, node) = if master.contains("://") {
        let info = open(master)?.get_connection_info().clone();
        let (ConnectionAddr::Tcp(service, _) | ConnectionAddr::TcpTls { host: service, .. }) =
            info.addr()
        else {
            return Err(Failure(
                "the master URL must name the service as its host: \
                 redis://user:password@mymaster/db"
                    .into(),
            ));
        };
        let node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(info.redis_settings().clone());
        (service.clone(), with_tls(node, info.addr()))
    } else {
        let node = SentinelNodeConnectionInfo::default();
        (master.to_owned(), with_tls(node, first.addr()))
    };
    let names: Vec<String> = sentinels.iter().map(|s| s.addr().to_string()).collect();
    let fail = |e: String| Failure(format!("sentinel {service} via {}: {e}", names.join(",")));
    let mut client = SentinelClient::build(
        sentinels,
        service.clone(),
        Some(node),
        SentinelServerType::Master,
    )
    .map_err(|e| fail(e.to_string()))?;
    match tokio::time::timeout(TIMEOUT, client.async_get_client()).await {
        Ok(Ok(master)) => Ok(master),
        Ok(Err(e)) => Err(fail(e.to_string())),
        Err(_) => Err(fail(format!("no master named within {TIMEOUT:?}"))),
    }
}

/// `node` set to speak TLS when `addr` does.
fn with_tls(node: SentinelNodeConnectionInfo, addr: &ConnectionAddr) -> SentinelNodeConnectionInfo {
    match addr {
        ConnectionAddr::TcpTls { insecure: true, .. } => node.set_tls_mode(TlsMode::Insecure),
        ConnectionAddr::TcpTls { .. } => node.set_tls_mode(TlsMode::Secure),
        _ => node,
    }
}

/// Every key on one server matching `pattern`.
async fn scan_server(client: redis::Client, pattern: &str) -> Result<Vec<Vec<u8>>, Failure> {
    let node = node_name(&client);
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(TIMEOUT))
        .set_response_timeout(Some(TIMEOUT));
    let fail = |e: redis::RedisError| Failure(format!("{node}: {e}"));
    let mut con = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(fail)?;
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = scan_cmd(cursor, pattern)
            .query_async(&mut con)
            .await
            .map_err(fail)?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Every key on every master of the cluster matching `pattern`, and how many masters there are.
async fn scan_cluster(seeds: &[String], pattern: &str) -> Result<(Vec<Vec<u8>>, usize), Failure> {
    let fail = |e: redis::RedisError| Failure(format!("cluster: {e}"));
    let client = redis::cluster::ClusterClientBuilder::new(seeds.iter().map(|s| s.trim()))
        .connection_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .build()
        .map_err(fail)?;
    let mut con = client.get_async_connection().await.map_err(fail)?;
    let slots = con
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .map_err(fail)?;
    let masters = masters(slots);
    if masters.is_empty() {
        return Err(Failure(
            "cluster: CLUSTER SLOTS names no master; is the cluster formed?".into(),
        ));
    }
    let mut keys = Vec::new();
    for (host, port) in &masters {
        let mut cursor = 0u64;
        loop {
            let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: *port,
            });
            let reply = con
                .route_command(scan_cmd(cursor, pattern), at)
                .await
                .map_err(|e| Failure(format!("{host}:{port}: {e}")))?;
            let (next, batch): (u64, Vec<Vec<u8>>) = redis::from_redis_value(reply)
                .map_err(|e| Failure(format!("{host}:{port}: unexpected SCAN reply: {e}")))?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok((keys, masters.len()))
}

fn scan_cmd(cursor: u64, pattern: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(BATCH);
    cmd
}

/// The distinct masters (`host`, `port`) in a `CLUSTER SLOTS` reply: each entry is
/// `[from, to, [host, port, id, ..], replicas..]`.
fn masters(slots: Value) -> Vec<(String, u16)> {
    let Value::Array(ranges) = slots else {
        return Vec::new();
    };
    let mut masters: Vec<(String, u16)> = ranges
        .into_iter()
        .filter_map(|range| {
            let Value::Array(parts) = range else {
                return None;
            };
            let Some(Value::Array(master)) = parts.into_iter().nth(2) else {
                return None;
            };
            let mut fields = master.into_iter();
            let host: String = redis::from_redis_value(fields.next()?).ok()?;
            let port: u16 = redis::from_redis_value(fields.next()?).ok()?;
            Some((host, port))
        })
        .collect();
    masters.sort();
    masters.dedup();
    masters
}

/// `host:port` of a client, never its credentials.
fn node_name(client: &redis::Client) -> String {
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
        redis::ConnectionAddr::Unix(path) => path.display().to_string(),
        _ => "(node)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_matches_the_prefix_literally() {
        assert_eq!(pattern("lock:"), "lock:*");
        assert_eq!(pattern("lock:a*b?[c]\\"), "lock:a\\*b\\?\\[c\\]\\\\*");
    }

    #[test]
    fn masters_are_read_from_cluster_slots_once_each() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |from, to, master: i64, replica: i64| {
            Value::Array(vec![
                Value::Int(from),
                Value::Int(to),
                node(master),
                node(replica),
            ])
        };
        let reply = Value::Array(vec![
            range(0, 100, 7001, 7004),
            range(101, 200, 7000, 7003),
            range(201, 300, 7001, 7004),
        ]);
        assert_eq!(
            masters(reply),
            [
                ("127.0.0.1".to_owned(), 7000),
                ("127.0.0.1".to_owned(), 7001)
            ]
        );
    }
}
