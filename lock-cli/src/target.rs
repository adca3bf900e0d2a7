//! Which Redis deployment to inspect: from the flags, else from the library's own environment
//! variables, so `lockctl` sees exactly what the services see.

use lock_runtime::{LockError, Registry};

use crate::cli::TargetArgs;

/// A deployment of lock-runtime's Redis backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One Redis server.
    Server(String),
    /// A Redis Cluster, through these seed nodes.
    Cluster(Vec<String>),
    /// Redlock over these independent masters.
    Redlock(Vec<String>),
}

impl Target {
    /// The flags win; otherwise the variables `Registry::from_env` reads, in its order:
    /// `LOCK_REDIS_CLUSTER`, then `LOCK_REDIS_URL` (a comma list is Redlock), then `REDIS_URL`.
    /// `LOCK_REDIS_SENTINEL` (first in the library's order) is refused with what to pass.
    ///
    /// # Errors
    /// A message saying what to pass when nothing names a deployment.
    pub fn resolve(
        args: &TargetArgs,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        if let Some(url) = &args.url {
            return Ok(Self::Server(url.clone()));
        }
        if !args.cluster.is_empty() {
            return Ok(Self::Cluster(args.cluster.clone()));
        }
        if !args.redlock.is_empty() {
            return Ok(Self::Redlock(args.redlock.clone()));
        }
        let var = |name| env(name).filter(|v: &String| !v.trim().is_empty());
        let list = |v: String| v.split(',').map(|s| s.trim().to_owned()).collect();
        if var("LOCK_REDIS_SENTINEL").is_some() {
            // The services use Sentinel's master; the other variables may name another Redis.
            return Err(
                "LOCK_REDIS_SENTINEL is set, and lockctl does not follow Sentinel yet: \
                        pass the master with --url (`redis-cli -h <sentinel> -p 26379 SENTINEL \
                        GET-MASTER-ADDR-BY-NAME <name>` tells which it is)"
                    .to_owned(),
            );
        }
        if let Some(seeds) = var("LOCK_REDIS_CLUSTER") {
            return Ok(Self::Cluster(list(seeds)));
        }
        match var("LOCK_REDIS_URL").or_else(|| var("REDIS_URL")) {
            Some(url) if url.contains(',') => Ok(Self::Redlock(list(url))),
            Some(url) => Ok(Self::Server(url.trim().to_owned())),
            None => Err(
                "no Redis to inspect: pass --url, --cluster or --redlock, or set \
                 LOCK_REDIS_URL / LOCK_REDIS_CLUSTER as for the services"
                    .to_owned(),
            ),
        }
    }

    /// A registry on this deployment: `inspect` and `force_unlock` go through the library, so
    /// the CLI reads and deletes exactly the keys the library writes, in every mode.
    ///
    /// # Errors
    /// See `RegistryBuilder::build`.
    pub fn registry(&self, prefix: &str) -> Result<Registry, LockError> {
        let builder = Registry::builder().prefix(prefix);
        match self {
            Self::Server(url) => builder.url(url.clone()),
            Self::Cluster(seeds) => builder.cluster(seeds.clone()),
            Self::Redlock(nodes) => builder.redlock(nodes.clone()),
        }
        .build()
    }

    /// The URLs to open plain connections to (every Redlock node, the cluster's seeds).
    pub fn urls(&self) -> &[String] {
        match self {
            Self::Server(url) => std::slice::from_ref(url),
            Self::Cluster(urls) | Self::Redlock(urls) => urls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_flags() -> TargetArgs {
        TargetArgs {
            url: None,
            cluster: Vec::new(),
            redlock: Vec::new(),
        }
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn flags_win_over_the_environment() {
        let args = TargetArgs {
            url: Some("redis://flag:1/".into()),
            ..no_flags()
        };
        let target = Target::resolve(&args, env(&[("LOCK_REDIS_CLUSTER", "redis://c:1")]));
        assert_eq!(target, Ok(Target::Server("redis://flag:1/".into())));
    }

    #[test]
    fn environment_is_read_in_the_library_order() {
        let all = [
            ("LOCK_REDIS_CLUSTER", "redis://c:1, redis://c:2"),
            ("LOCK_REDIS_URL", "redis://l:1"),
            ("REDIS_URL", "redis://r:1"),
        ];
        assert_eq!(
            Target::resolve(&no_flags(), env(&all)),
            Ok(Target::Cluster(vec![
                "redis://c:1".into(),
                "redis://c:2".into()
            ]))
        );
        assert_eq!(
            Target::resolve(&no_flags(), env(&all[1..])),
            Ok(Target::Server("redis://l:1".into()))
        );
        assert_eq!(
            Target::resolve(&no_flags(), env(&all[2..])),
            Ok(Target::Server("redis://r:1".into()))
        );
    }

    #[test]
    fn a_sentinel_deployment_is_refused_rather_than_another_redis_inspected() {
        let vars = [
            ("LOCK_REDIS_SENTINEL", "redis://s:26379"),
            ("REDIS_URL", "redis://cache:6379"),
        ];
        let refused = Target::resolve(&no_flags(), env(&vars)).unwrap_err();
        assert!(refused.contains("--url"), "{refused}");
        let args = TargetArgs {
            url: Some("redis://master:6379/".into()),
            ..no_flags()
        };
        assert_eq!(
            Target::resolve(&args, env(&vars)),
            Ok(Target::Server("redis://master:6379/".into()))
        );
    }

    #[test]
    fn a_url_list_in_the_environment_means_redlock() {
        let target = Target::resolve(
            &no_flags(),
            env(&[("LOCK_REDIS_URL", "redis://a:1,redis://b:1,redis://c:1")]),
        );
        assert_eq!(
            target,
            Ok(Target::Redlock(vec![
                "redis://a:1".into(),
                "redis://b:1".into(),
                "redis://c:1".into()
            ]))
        );
    }

    #[test]
    fn nothing_configured_says_what_to_pass() {
        let error = Target::resolve(&no_flags(), env(&[("LOCK_REDIS_URL", " ")])).unwrap_err();
        assert!(error.contains("--url"), "{error}");
    }
}
