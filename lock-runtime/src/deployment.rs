//! Where a registry's locks live, and the one grammar that reads it from the environment: the
//! library's `Registry::from_env` and `lockctl` both read it here, so they cannot disagree.

use crate::error::LockError;

/// A deployment the library locks on, as [`RegistryBuilder::deployment`](crate::RegistryBuilder::deployment)
/// takes it and [`Deployment::from_vars`] reads it from environment variables. URLs may carry
/// credentials: the registry never shows them (its `node` names `host:port`).
///
/// ```
/// use lock_runtime::Deployment;
/// let vars = [("LOCK_REDIS_URL", "redis://a:6379, redis://b:6379,redis://c:6379")];
/// let var = |name: &str| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string());
/// assert_eq!(
///     Deployment::from_vars(var).unwrap(),
///     Some(Deployment::Redlock(vec![
///         "redis://a:6379".into(),
///         "redis://b:6379".into(),
///         "redis://c:6379".into(),
///     ]))
/// );
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Deployment {
    /// One Redis server (see [`RegistryBuilder::url`](crate::RegistryBuilder::url)).
    Server(String),
    /// A Redis Cluster, through these seed nodes.
    Cluster(Vec<String>),
    /// Redlock over these independent masters.
    Redlock(Vec<String>),
    /// The master these sentinels name for `master` (a service name, or a URL carrying the
    /// master's login; see [`RegistryBuilder::sentinel`](crate::RegistryBuilder::sentinel)).
    Sentinel {
        /// The service's name (`mymaster`), or a URL whose host is that name.
        master: String,
        /// The sentinels' URLs.
        sentinels: Vec<String>,
    },
    /// One Postgres database (see [`RegistryBuilder::postgres`](crate::RegistryBuilder::postgres)).
    Postgres {
        /// Where statements go: `postgres://user:password@host:5432/database`, or a pooler
        /// (PgBouncer in transaction mode) in front of it.
        url: String,
        /// Where waiters `LISTEN`, when `url` is a pooler that cannot keep a session (else
        /// `url` itself): the database directly, or a pooler in session mode.
        listen: Option<String>,
    },
}

const SENTINEL_MASTER_VAR: &str = "LOCK_REDIS_SENTINEL_MASTER";
const SENTINELS_VAR: &str = "LOCK_REDIS_SENTINEL";
const CLUSTER_VAR: &str = "LOCK_REDIS_CLUSTER";
const URL_VAR: &str = "LOCK_REDIS_URL";
const FALLBACK_URL_VAR: &str = "REDIS_URL";
const POSTGRES_VAR: &str = "LOCK_POSTGRES_URL";
const POSTGRES_LISTEN_VAR: &str = "LOCK_POSTGRES_LISTEN_URL";

impl Deployment {
    /// The variables [`from_vars`](Self::from_vars) reads, in its order: each may hold URLs, and
    /// so passwords (`lockctl run` keeps those that do from its command).
    pub const VARIABLES: [&'static str; 7] = [
        POSTGRES_VAR,
        POSTGRES_LISTEN_VAR,
        SENTINELS_VAR,
        SENTINEL_MASTER_VAR,
        CLUSTER_VAR,
        URL_VAR,
        FALLBACK_URL_VAR,
    ];

    /// The variable that names the master of the sentinels in `LOCK_REDIS_SENTINEL`.
    pub const SENTINEL_MASTER_VAR: &'static str = SENTINEL_MASTER_VAR;

    /// The deployment the variables name (`var` reads one; an unset or blank one is absent),
    /// first match wins:
    ///
    /// | variable | deployment |
    /// |---|---|
    /// | `LOCK_POSTGRES_URL=postgres://locks@db:5432/app` (with `LOCK_POSTGRES_LISTEN_URL` when that is a pooler in transaction mode) | [`Postgres`](Self::Postgres) |
    /// | `LOCK_REDIS_SENTINEL=redis://s1:26379,redis://s2:26379` with `LOCK_REDIS_SENTINEL_MASTER=mymaster` | [`Sentinel`](Self::Sentinel) |
    /// | `LOCK_REDIS_CLUSTER=redis://a:7000,redis://b:7001` | [`Cluster`](Self::Cluster) |
    /// | `LOCK_REDIS_URL=redis://a:6379,redis://b:6379,redis://c:6379` | [`Redlock`](Self::Redlock) |
    /// | `LOCK_REDIS_URL=redis://a:6379` (else `REDIS_URL`) | [`Server`](Self::Server) |
    ///
    /// Entries of a comma list are trimmed; an empty one (`redis://a:6379,`) is kept, for the
    /// registry's build to refuse naming its position: a stray comma must not turn one server
    /// into a Redlock.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for sentinels without a master name, and for
    /// `LOCK_POSTGRES_URL` beside a `LOCK_REDIS_*` variable (which store is meant?). `Ok(None)`
    /// when no variable names a deployment. `REDIS_URL` alone does not conflict: an application
    /// may use Redis for other things and lock on Postgres.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, LockError> {
        let var = |name| var(name).filter(|v: &String| !v.trim().is_empty());
        let list = |v: String| v.split(',').map(|s| s.trim().to_owned()).collect();
        if let Some(url) = var(POSTGRES_VAR) {
            if let Some(redis) = [SENTINELS_VAR, CLUSTER_VAR, URL_VAR]
                .into_iter()
                .find(|name| var(name).is_some())
            {
                return Err(LockError::config(format!(
                    "both {POSTGRES_VAR} and {redis} are set, so the store to lock on is \
                     ambiguous; unset the one this service should not use"
                )));
            }
            return Ok(Some(Self::Postgres {
                url: url.trim().to_owned(),
                listen: var(POSTGRES_LISTEN_VAR).map(|v| v.trim().to_owned()),
            }));
        }
        if let Some(sentinels) = var(SENTINELS_VAR) {
            let master = var(SENTINEL_MASTER_VAR).ok_or_else(|| {
                LockError::config(format!(
                    "{SENTINELS_VAR} is set but {SENTINEL_MASTER_VAR} is not; set it to the \
                     service name the sentinels monitor (`mymaster`)"
                ))
            })?;
            return Ok(Some(Self::Sentinel {
                master: master.trim().to_owned(),
                sentinels: list(sentinels),
            }));
        }
        if let Some(seeds) = var(CLUSTER_VAR) {
            return Ok(Some(Self::Cluster(list(seeds))));
        }
        Ok(var(URL_VAR).or_else(|| var(FALLBACK_URL_VAR)).map(|url| {
            if url.contains(',') {
                Self::Redlock(list(url))
            } else {
                Self::Server(url.trim().to_owned())
            }
        }))
    }

    /// The URLs given: the server's, the cluster's seeds, every Redlock node, the sentinels,
    /// the Postgres statements' (not its listener's).
    #[must_use]
    pub fn urls(&self) -> &[String] {
        match self {
            Self::Server(url) | Self::Postgres { url, .. } => std::slice::from_ref(url),
            Self::Cluster(urls) | Self::Redlock(urls) => urls,
            Self::Sentinel { sentinels, .. } => sentinels,
        }
    }
}

/// Shows each URL with its password masked: a deployment's URLs may carry credentials, which
/// never appear in `Debug` output (nor does a builder that holds one show them).
impl std::fmt::Debug for Deployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let all = |urls: &[String]| urls.iter().map(|u| masked(u)).collect::<Vec<_>>();
        match self {
            Self::Server(url) => f.debug_tuple("Server").field(&masked(url)).finish(),
            Self::Postgres { url, listen } => f
                .debug_struct("Postgres")
                .field("url", &masked(url))
                .field("listen", &listen.as_deref().map(masked))
                .finish(),
            Self::Cluster(urls) => f.debug_tuple("Cluster").field(&all(urls)).finish(),
            Self::Redlock(urls) => f.debug_tuple("Redlock").field(&all(urls)).finish(),
            Self::Sentinel { master, sentinels } => f
                .debug_struct("Sentinel")
                .field("master", &masked(master))
                .field("sentinels", &all(sentinels))
                .finish(),
        }
    }
}

/// `url` with every password in it replaced by `***`: its login's (between `user:` and the
/// last `@`, so that a `/`, `?` or `#` left unencoded in a password is masked too; an `@`
/// further on masks more, never less), and any `password=` or `sslpassword=` parameter's, in
/// a URL's query or a libpq connection string (`host=h password='...'`).
fn masked(url: &str) -> String {
    let login = url.find("://").and_then(|scheme| {
        let start = scheme + 3;
        let at = start + url[start..].rfind('@')?;
        let colon = start + url[start..at].find(':')?;
        Some(format!("{}***{}", &url[..=colon], &url[at..]))
    });
    masked_parameters(login.as_deref().unwrap_or(url))
}

/// `text` with the value of every parameter whose name ends in `password` replaced by `***`:
/// up to the next `&` or blank, or a libpq single-quoted value (with `\` escapes) whole.
fn masked_parameters(text: &str) -> String {
    const NAME: &str = "password=";
    let lower = text.to_ascii_lowercase();
    let (mut shown, mut from) = (String::with_capacity(text.len()), 0);
    while let Some(found) = lower[from..].find(NAME) {
        let value = from + found + NAME.len();
        let end = if text[value..].starts_with('\'') {
            let mut escaped = false;
            text[value + 1..]
                .char_indices()
                .find(|&(_, c)| {
                    let closes = c == '\'' && !escaped;
                    escaped = c == '\\' && !escaped;
                    closes
                })
                .map_or(text.len(), |(i, _)| value + 1 + i + 1)
        } else {
            text[value..]
                .find(|c: char| c == '&' || c.is_whitespace())
                .map_or(text.len(), |i| value + i)
        };
        shown.push_str(&text[from..value]);
        shown.push_str("***");
        from = end;
    }
    shown.push_str(&text[from..]);
    shown
}

#[cfg(test)]
mod tests {
    use super::masked;

    #[test]
    fn a_password_is_masked_and_the_rest_of_the_url_kept() {
        assert_eq!(masked("redis://u:pw@h:1/2"), "redis://u:***@h:1/2");
        assert_eq!(masked("rediss://:p@w@h:1"), "rediss://:***@h:1");
        assert_eq!(masked("redis://user@h:1/"), "redis://user@h:1/");
        assert_eq!(masked("mymaster"), "mymaster");
    }

    /// Everywhere a password can stand in a URL or a libpq connection string.
    #[test]
    fn a_password_is_masked_wherever_it_stands() {
        // A `/` (or `?`, `#`) in a password, unencoded: the login ends at the last `@`.
        assert_eq!(masked("redis://u:pa/ss@h:1"), "redis://u:***@h:1");
        assert_eq!(masked("redis://:p?w#x@h:1/0"), "redis://:***@h:1/0");
        // So an `@` further on is taken for one too: more is masked, never less.
        assert_eq!(masked("redis://h:1/x@y"), "redis://h:***@y");
        assert_eq!(
            masked("postgresql://h/db?user=u&password=secret&sslmode=require"),
            "postgresql://h/db?user=u&password=***&sslmode=require"
        );
        assert_eq!(
            masked("postgres://u:p@h/db?sslpassword=key"),
            "postgres://u:***@h/db?sslpassword=***"
        );
        assert_eq!(
            masked("host=h user=u password=secret dbname=d"),
            "host=h user=u password=*** dbname=d"
        );
        assert_eq!(
            masked(r"host=h PASSWORD='a b\' c' dbname=d"),
            "host=h PASSWORD=*** dbname=d"
        );
    }
}
