//! From what a registry builder was given to Redis clients: URLs parsed and checked, TLS
//! certificates attached, and the names that errors show (never credentials).

use std::sync::Arc;

use redis::ConnectionInfo;

use super::sentinel::SentinelSetup;
use crate::LockError;

/// The certificates `rediss://` connections trust and present (the `tls` feature).
#[derive(Debug, Default, Clone)]
pub(crate) struct Tls {
    #[cfg(feature = "tls")]
    certs: Option<redis::TlsCertificates>,
}

impl Tls {
    #[cfg(feature = "tls")]
    pub(crate) fn root_cert(&mut self, pem: Vec<u8>) {
        self.certificates().root_cert = Some(pem);
    }

    #[cfg(feature = "tls")]
    pub(crate) fn client_cert(&mut self, cert_pem: Vec<u8>, key_pem: Vec<u8>) {
        self.certificates().client_tls = Some(redis::ClientTlsConfig {
            client_cert: cert_pem,
            client_key: key_pem,
        });
    }

    #[cfg(feature = "tls")]
    fn certificates(&mut self) -> &mut redis::TlsCertificates {
        self.certs.get_or_insert(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        })
    }

    /// A client for `url`, with these certificates when any were given.
    pub(crate) fn client(&self, url: &str) -> Result<redis::Client, LockError> {
        #[cfg(feature = "tls")]
        let opened = match &self.certs {
            Some(certs) => redis::Client::build_with_tls(url.trim(), certs.clone()),
            None => redis::Client::open(url.trim()),
        };
        #[cfg(not(feature = "tls"))]
        let opened = redis::Client::open(url.trim());
        opened.map_err(|e| LockError::Backend {
            // The URL may hold a password: name only what kind of error it was.
            node: "(unparsed URL)".into(),
            command: "parse URL",
            key: None,
            message: format!(
                "not a valid Redis URL ({:?}); expected redis://[user:password@]host:port[/db]",
                e.kind()
            ),
            source: None,
        })
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
            .map(|url| tls.client(url).map(|c| c.get_connection_info().clone()))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            nodes,
            #[cfg(feature = "tls")]
            certs: tls.certs.clone(),
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
        .map(|url| tls.client(url))
        .collect::<Result<_, _>>()?;
    let servers: Vec<String> = clients
        .iter()
        .map(|c| c.get_connection_info().addr().to_string().to_lowercase())
        .collect();
    for (i, server) in servers.iter().enumerate() {
        if let Some(j) = servers[..i].iter().position(|s| s == server) {
            return Err(LockError::configure(format!(
                "Redlock entries {} and {} are the same server {server} (another database on \
                 it is not an independent node): Redlock needs independent masters, so list \
                 each server once",
                j + 1,
                i + 1
            )));
        }
    }
    if clients.len() < 3 {
        return Err(LockError::configure(format!(
            "a Redlock of {} node{} tolerates no node failure (a majority of 1 or 2 is every \
             node) and gives no fencing tokens; use a single server URL for one Redis, or 3 or \
             5 independent masters",
            clients.len(),
            if clients.len() == 1 { "" } else { "s" }
        )));
    }
    Ok(clients)
}

/// Sentinel mode's sentinels and master: plain TCP only (no TLS is offered in this mode).
pub(crate) fn sentinel_setup(
    master: &str,
    sentinels: Vec<String>,
) -> Result<Arc<SentinelSetup>, LockError> {
    let sentinels = non_empty(sentinels, "sentinel")?
        .iter()
        .map(|url| plain(url, "sentinel").map(|c| c.get_connection_info().clone()))
        .collect::<Result<_, _>>()?;
    let (service, master) = sentinel_master(master)?;
    Ok(Arc::new(SentinelSetup {
        sentinels,
        service,
        master,
    }))
}

/// A plain-TCP client (Sentinel mode offers no TLS): a `rediss://` URL is refused by name.
fn plain(url: &str, what: &str) -> Result<redis::Client, LockError> {
    if url.trim().starts_with("rediss://") {
        return Err(LockError::configure(format!(
            "a {what} URL uses rediss://, but Sentinel mode offers no TLS; use redis:// \
             or a single server, cluster or Redlock registry"
        )));
    }
    Tls::default().client(url)
}

/// The service name and the master's login: `mymaster`, or `redis://user:pass@mymaster/db`.
fn sentinel_master(master: &str) -> Result<(String, redis::RedisConnectionInfo), LockError> {
    let master = master.trim();
    if !master.contains("://") {
        if master.is_empty() || master.contains(['/', '@', ':', ' ']) {
            return Err(LockError::configure(
                "the Sentinel master name is empty or not a plain name; give the service name \
                 the sentinels monitor (`mymaster`), or redis://user:password@mymaster/db"
                    .into(),
            ));
        }
        return Ok((master.to_owned(), redis::RedisConnectionInfo::default()));
    }
    let info = plain(master, "Sentinel master")?
        .get_connection_info()
        .clone();
    match info.addr() {
        redis::ConnectionAddr::Tcp(service, _) => {
            Ok((service.clone(), info.redis_settings().clone()))
        }
        _ => Err(LockError::configure(
            "the Sentinel master URL must name the service as its host: \
             redis://user:password@mymaster/db"
                .into(),
        )),
    }
}

/// A list with an empty entry is refused rather than filtered: a stray comma once turned one
/// server's URL into a Redlock of one node.
fn non_empty(urls: Vec<String>, what: &str) -> Result<Vec<String>, LockError> {
    if urls.is_empty() {
        return Err(LockError::configure(format!("no {what} URL given")));
    }
    if let Some(position) = urls.iter().position(|u| u.trim().is_empty()) {
        return Err(LockError::configure(format!(
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
    /// `host:port[/db]`, `cluster(..)` or `sentinel <service> via ..`: never credentials.
    pub(crate) fn node_name(&self) -> String {
        match self {
            Self::Server(client) => node_name(client.get_connection_info()),
            Self::Cluster(seeds) => seeds.node_name(),
            Self::Sentinel(setup) => setup.node_name(),
        }
    }
}
