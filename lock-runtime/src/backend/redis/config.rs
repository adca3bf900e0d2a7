//! From what a registry builder was given to Redis clients: URLs parsed and checked, TLS
//! certificates attached, and the names that errors show (never credentials).

use std::sync::Arc;

use redis::{ConnectionAddr, ConnectionInfo, TlsMode};

use super::sentinel::SentinelSetup;
use crate::backend::tls::Tls;
use crate::error::LockError;

impl Tls {
    /// The certificates as redis-rs takes them, when any were given.
    #[cfg(feature = "tls")]
    pub(crate) fn certificates(&self) -> Option<redis::TlsCertificates> {
        self.given().then(|| redis::TlsCertificates {
            client_tls: self.client_cert.as_ref().map(|c| redis::ClientTlsConfig {
                client_cert: c.cert_pem.clone(),
                client_key: c.key_pem.clone(),
            }),
            root_cert: self.root_cert.clone(),
        })
    }

    /// A client for `url` (a `what`: "server", "sentinel"..., for errors), with these
    /// certificates attached when it is a `rediss://` URL and any were given; a `redis://` URL
    /// stays plain TCP whatever certificates there are.
    pub(crate) fn client(&self, url: &str, what: &str) -> Result<redis::Client, LockError> {
        let url = url.trim();
        // Refused by name even where another crate turned on redis' TLS: without the feature,
        // the registry's certificates could not be attached.
        if is_tls_url(url) && !cfg!(feature = "tls") {
            return Err(LockError::config(format!(
                "the {what} URL uses rediss:// (TLS), but lock-runtime was built without its \
                 `tls` feature; enable it (lock-runtime = {{ .., features = [\"tls\"] }}) or \
                 use redis://"
            )));
        }
        let client = redis::Client::open(url).map_err(|e| {
            // The URL may hold a password: name only what kind of error it was.
            LockError::config(format!(
                "the {what} URL is not a valid Redis URL ({:?}); expected \
                 redis://[user:password@]host:port[/db]",
                e.kind()
            ))
        })?;
        #[cfg(feature = "tls")]
        if let (Some(certs), Some(_)) = (
            self.certificates(),
            tls_mode(client.get_connection_info().addr()),
        ) {
            return redis::Client::build_with_tls(client.get_connection_info().clone(), certs)
                .map_err(|e| {
                    LockError::config(format!(
                        "the TLS certificates (tls_root_cert, tls_client_cert) could not be \
                         used for the {what} ({:?}: {}); give PEM-encoded certificates and key",
                        e.kind(),
                        e.detail().unwrap_or_default()
                    ))
                });
        }
        Ok(client)
    }
}

/// `rediss://` (or valkey's `valkeys://`), whatever the case.
fn is_tls_url(url: &str) -> bool {
    let scheme = url.split("://").next().unwrap_or_default();
    scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys")
}

/// How redis-rs' Sentinel client is told to reach a server: `None` for plain TCP.
fn tls_mode(addr: &ConnectionAddr) -> Option<TlsMode> {
    match addr {
        ConnectionAddr::TcpTls { insecure: true, .. } => Some(TlsMode::Insecure),
        ConnectionAddr::TcpTls { .. } => Some(TlsMode::Secure),
        _ => None,
    }
}

/// Where a cluster client starts, and the certificates it trusts.
#[derive(Clone)]
pub(crate) struct ClusterSeeds {
    pub nodes: Vec<ConnectionInfo>,
    #[cfg(feature = "tls")]
    pub certs: Option<redis::TlsCertificates>,
}

impl ClusterSeeds {
    /// Parses the seed URLs; an empty list or entry is refused.
    pub(crate) fn parse(seeds: Vec<String>, tls: &Tls) -> Result<Self, LockError> {
        let nodes = non_empty(seeds, "cluster seed")?
            .iter()
            .map(|url| {
                tls.client(url, "cluster seed")
                    .map(|c| c.get_connection_info().clone())
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            nodes,
            #[cfg(feature = "tls")]
            certs: tls.certificates(),
        })
    }

    pub(crate) fn builder(&self) -> redis::cluster::ClusterClientBuilder {
        let builder = redis::cluster::ClusterClientBuilder::new(self.nodes.clone());
        #[cfg(feature = "tls")]
        let builder = match &self.certs {
            Some(certs) => builder.certs(certs.clone()),
            None => builder,
        };
        builder
    }

    /// `cluster(host:port,..)`.
    pub(crate) fn node_name(&self) -> String {
        let seeds: Vec<String> = self.nodes.iter().map(node_name).collect();
        format!("cluster({})", seeds.join(","))
    }
}

/// `host:port[/db]`: never credentials.
pub(crate) fn node_name(info: &ConnectionInfo) -> String {
    let db = info.redis_settings().db();
    if db == 0 {
        info.addr().to_string()
    } else {
        format!("{}/{db}", info.addr())
    }
}

/// Redlock's independent masters. Its quorum of N/2 + 1 tolerates no failure below 3 nodes,
/// and a server listed twice (under any database) would count twice towards it.
pub(crate) fn redlock_nodes(urls: Vec<String>, tls: &Tls) -> Result<Vec<redis::Client>, LockError> {
    let clients: Vec<redis::Client> = non_empty(urls, "Redlock node")?
        .iter()
        .map(|url| tls.client(url, "Redlock node"))
        .collect::<Result<_, _>>()?;
    let servers: Vec<String> = clients
        .iter()
        .map(|c| c.get_connection_info().addr().to_string().to_lowercase())
        .collect();
    for (i, server) in servers.iter().enumerate() {
        if let Some(j) = servers[..i].iter().position(|s| s == server) {
            return Err(LockError::config(format!(
                "Redlock entries {} and {} are the same server {server} (another database on \
                 it is not an independent node): Redlock needs independent masters, so list \
                 each server once",
                j + 1,
                i + 1
            )));
        }
    }
    if clients.len() < 3 {
        return Err(LockError::config(format!(
            "a Redlock of {} node{} tolerates no node failure (a majority of 1 or 2 is every \
             node) and gives no fencing tokens; use a single server URL for one Redis, or 3 or \
             5 independent masters",
            clients.len(),
            if clients.len() == 1 { "" } else { "s" }
        )));
    }
    Ok(clients)
}

/// Sentinel mode's sentinels and master. The sentinels speak TLS when their URLs are
/// `rediss://` (all of them or none); the master and replicas when the master URL is
/// `rediss://`, and like the sentinels when the master is given by name alone. Both use the
/// same certificates.
pub(crate) fn sentinel_setup(
    master: &str,
    sentinels: Vec<String>,
    tls: &Tls,
) -> Result<Arc<SentinelSetup>, LockError> {
    let sentinels: Vec<ConnectionInfo> = non_empty(sentinels, "sentinel")?
        .iter()
        .map(|url| {
            tls.client(url, "sentinel")
                .map(|c| c.get_connection_info().clone())
        })
        .collect::<Result<_, _>>()?;
    let sentinel_tls = tls_mode(sentinels[0].addr());
    if let Some(other) = sentinels
        .iter()
        .position(|s| tls_mode(s.addr()) != sentinel_tls)
    {
        let scheme = |mode: Option<TlsMode>| {
            if mode.is_some() {
                "rediss://"
            } else {
                "redis://"
            }
        };
        return Err(LockError::config(format!(
            "sentinel URLs 1 and {} differ in TLS ({} and {}): one deployment's sentinels all \
             listen for TLS or none do; give every sentinel URL the same scheme",
            other + 1,
            scheme(sentinel_tls),
            scheme(tls_mode(sentinels[other].addr())),
        )));
    }
    let (service, login, master_tls) = match sentinel_master(master, tls)? {
        (service, Some(info)) => (
            service,
            info.redis_settings().clone(),
            tls_mode(info.addr()),
        ),
        (service, None) => (service, redis::RedisConnectionInfo::default(), sentinel_tls),
    };
    Ok(Arc::new(SentinelSetup {
        sentinels,
        service,
        master: login,
        master_tls,
        #[cfg(feature = "tls")]
        certs: tls.certificates(),
    }))
}

/// The service name, and the master URL when one was given (`redis://user:pass@mymaster/db`,
/// which carries the master's login, database and scheme) rather than the name alone.
fn sentinel_master(master: &str, tls: &Tls) -> Result<(String, Option<ConnectionInfo>), LockError> {
    let master = master.trim();
    if !master.contains("://") {
        if master.is_empty() || master.contains(['/', '@', ':', ' ']) {
            return Err(LockError::config(
                "the Sentinel master name is empty or not a plain name; give the service name \
                 the sentinels monitor (`mymaster`), or redis://user:password@mymaster/db",
            ));
        }
        return Ok((master.to_owned(), None));
    }
    let info = tls
        .client(master, "Sentinel master")?
        .get_connection_info()
        .clone();
    match info.addr() {
        ConnectionAddr::Tcp(service, _) | ConnectionAddr::TcpTls { host: service, .. } => {
            Ok((service.clone(), Some(info.clone())))
        }
        _ => Err(LockError::config(
            "the Sentinel master URL must name the service as its host: \
             redis://user:password@mymaster/db (rediss:// for a master that speaks TLS)",
        )),
    }
}

/// A list with an empty entry is refused rather than filtered: a stray comma once turned one
/// server's URL into a Redlock of one node.
fn non_empty(urls: Vec<String>, what: &str) -> Result<Vec<String>, LockError> {
    if urls.is_empty() {
        return Err(LockError::config(format!("no {what} URL given")));
    }
    if let Some(position) = urls.iter().position(|u| u.trim().is_empty()) {
        return Err(LockError::config(format!(
            "the {what} list has an empty entry {} of {} (a stray comma?); remove it (a single \
             server's URL takes no comma at all)",
            position + 1,
            urls.len()
        )));
    }
    Ok(urls)
}

/// One Redis deployment that a single shared connection reaches.
#[derive(Clone)]
pub(crate) enum Topology {
    Server(Box<redis::Client>),
    Cluster(ClusterSeeds),
    Sentinel(Arc<SentinelSetup>),
}

impl Topology {
    /// Whether the connection starts over TLS (to the server, the seeds, the sentinels).
    pub(crate) fn tls(&self) -> bool {
        let first = match self {
            Self::Server(client) => Some(client.get_connection_info()),
            Self::Cluster(seeds) => seeds.nodes.first(),
            Self::Sentinel(setup) => setup.sentinels.first(),
        };
        first.is_some_and(|info| tls_mode(info.addr()).is_some())
    }

    /// `host:port[/db]`, `cluster(..)` or `sentinel <service> via ..`: never credentials.
    pub(crate) fn node_name(&self) -> String {
        match self {
            Self::Server(client) => node_name(client.get_connection_info()),
            Self::Cluster(seeds) => seeds.node_name(),
            Self::Sentinel(setup) => setup.node_name(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(master: &str, sentinels: &[&str]) -> String {
        let urls = sentinels.iter().map(|s| (*s).to_owned()).collect();
        match sentinel_setup(master, urls, &Tls::default()) {
            Ok(_) => panic!("{master} via {sentinels:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn a_rediss_url_without_the_tls_feature_names_the_feature_and_the_node() {
        let message = refused("mymaster", &["rediss://127.0.0.1:26379"]);
        assert!(message.contains("sentinel URL uses rediss://"), "{message}");
        assert!(message.contains("`tls` feature"), "{message}");
        let message = refused("rediss://mymaster", &["redis://127.0.0.1:26379"]);
        assert!(message.contains("Sentinel master URL"), "{message}");
        let Err(e) = Tls::default().client("rediss://127.0.0.1:6380", "server") else {
            panic!("rediss:// accepted without the tls feature");
        };
        assert!(e.to_string().contains("`tls` feature"), "{e}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn sentinels_that_mix_tls_and_plain_tcp_are_refused_by_position() {
        let message = refused(
            "mymaster",
            &[
                "rediss://10.0.0.1:26379",
                "rediss://10.0.0.2:26379",
                "redis://10.0.0.3:26379",
            ],
        );
        assert!(
            message.contains("sentinel URLs 1 and 3 differ in TLS"),
            "{message}"
        );
    }

    #[cfg(feature = "tls")]
    #[test]
    fn the_master_follows_the_sentinels_unless_its_url_says_otherwise() {
        let master_tls = |master: &str, sentinel: &str| {
            let setup = sentinel_setup(master, vec![sentinel.to_owned()], &Tls::default());
            setup.map(|s| s.master_tls).map_err(|e| e.to_string())
        };
        let (tls, plain) = ("rediss://10.0.0.1:26379", "redis://10.0.0.1:26379");
        assert_eq!(master_tls("mymaster", tls), Ok(Some(TlsMode::Secure)));
        assert_eq!(master_tls("mymaster", plain), Ok(None));
        assert_eq!(master_tls("redis://u:p@mymaster/2", tls), Ok(None));
        assert_eq!(
            master_tls("rediss://u:p@mymaster/2", plain),
            Ok(Some(TlsMode::Secure))
        );
        assert_eq!(
            master_tls("rediss://mymaster/#insecure", plain),
            Ok(Some(TlsMode::Insecure))
        );
    }
}
