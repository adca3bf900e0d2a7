//! Which Redis deployment to inspect: from the flags, else from the library's own environment
//! variables, so `lockctl` sees exactly what the services see (Sentinel included: the master
//! the sentinels name).

use lock_runtime::{LockError, Registry};

/// A password for every URL that carries none, so that it need not be typed on a command line
/// (where `ps` and the shell's history show it).
pub const PASSWORD_VAR: &str = "LOCK_REDIS_PASSWORD";

use crate::cli::TargetArgs;

/// The variables [`Target::resolve`] reads for a deployment: each may hold URLs, and so
/// passwords.
const URL_VARS: [&str; 5] = [
    "LOCK_REDIS_SENTINEL",
    "LOCK_REDIS_SENTINEL_MASTER",
    "LOCK_REDIS_CLUSTER",
    "LOCK_REDIS_URL",
    "REDIS_URL",
];

/// The variables of `env` that hold lockctl's credentials: [`PASSWORD_VAR`] when set, and each
/// of [`URL_VARS`] that holds a URL with a password. `lockctl run` keeps them from its
/// command.
pub fn credential_vars(env: impl Fn(&str) -> Option<String>) -> Vec<&'static str> {
    std::iter::once(PASSWORD_VAR)
        .filter(|&name| env(name).is_some())
        .chain(
            URL_VARS
                .into_iter()
                .filter(|&name| env(name).is_some_and(|value| carries_password(&value))),
        )
        .collect()
}

/// Whether one of the comma-separated URLs in `value` has a password. A part that does not
/// parse counts when it has an `@` (a login, perhaps with characters a URL must escape); a
/// service name (`mymaster`) does not.
fn carries_password(value: &str) -> bool {
    value
        .split(',')
        .any(|part| match url::Url::parse(part.trim()) {
            Ok(url) => url.password().is_some(),
            Err(_) => part.contains('@'),
        })
}

/// A deployment of lock-runtime's Redis backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One Redis server.
    Server(String),
    /// A Redis Cluster, through these seed nodes.
    Cluster(Vec<String>),
    /// Redlock over these independent masters.
    Redlock(Vec<String>),
    /// The master these sentinels name for `master` (a service name, or a URL carrying the
    /// master's login), as `RegistryBuilder::sentinel` takes them.
    Sentinel {
        master: String,
        sentinels: Vec<String>,
    },
}

impl Target {
    /// The flags win; otherwise the variables `Registry::from_env` reads, in its order:
    /// `LOCK_REDIS_SENTINEL` (with `LOCK_REDIS_SENTINEL_MASTER`), then `LOCK_REDIS_CLUSTER`,
    /// then `LOCK_REDIS_URL` (a comma list is Redlock), then `REDIS_URL`. `--master-name`
    /// names the master of sentinels from either place, else `LOCK_REDIS_SENTINEL_MASTER`
    /// does: like the library, there is no default name.
    ///
    /// # Errors
    /// A message saying what to pass when nothing names a deployment, or sentinels no master.
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
        let sentinels = if args.sentinel.is_empty() {
            var("LOCK_REDIS_SENTINEL").map(list)
        } else {
            Some(args.sentinel.clone())
        };
        if let Some(sentinels) = sentinels {
            let master = args
                .master_name
                .clone()
                .or_else(|| var("LOCK_REDIS_SENTINEL_MASTER"))
                .ok_or(
                    "sentinels are given but no master name: pass --master-name (the service \
                     name the sentinels monitor, e.g. mymaster) or set LOCK_REDIS_SENTINEL_MASTER",
                )?;
            return Ok(Self::Sentinel { master, sentinels });
        }
        if args.master_name.is_some() {
            return Err(
                "--master-name names the master of sentinels: pass them with \
                        --sentinel URL,URL (or set LOCK_REDIS_SENTINEL)"
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
                "no Redis to inspect: pass --url, --cluster, --redlock or --sentinel, or set \
                 LOCK_REDIS_URL / LOCK_REDIS_CLUSTER / LOCK_REDIS_SENTINEL as for the services"
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
            Self::Sentinel { master, sentinels } => {
                builder.sentinel(master.clone(), sentinels.clone())
            }
        }
        .build()
    }

    /// This deployment with `password` in every URL that has none: the server's, each seed's,
    /// each Redlock node's, and with sentinels the master's login (a master given by name
    /// becomes a URL of the sentinels' scheme); sentinels that want one of their own take it
    /// in their URLs.
    ///
    /// # Errors
    /// A URL that does not parse (the message does not echo it: it may hold another password).
    pub fn with_password(self, password: &str) -> Result<Self, String> {
        let add = |url: &String| -> Result<String, String> {
            let mut parsed = url::Url::parse(url)
                .map_err(|e| format!("a URL given with {PASSWORD_VAR} does not parse: {e}"))?;
            if parsed.password().is_none() {
                parsed
                    .set_password(Some(password))
                    .map_err(|()| format!("a URL given with {PASSWORD_VAR} takes no password"))?;
            }
            Ok(parsed.to_string())
        };
        let all = |urls: &[String]| urls.iter().map(add).collect::<Result<Vec<_>, _>>();
        Ok(match self {
            Self::Server(url) => Self::Server(add(&url)?),
            Self::Cluster(seeds) => Self::Cluster(all(&seeds)?),
            Self::Redlock(nodes) => Self::Redlock(all(&nodes)?),
            Self::Sentinel { master, sentinels } => {
                let master = if master.contains("://") {
                    add(&master)?
                } else {
                    let tls = sentinels.iter().any(|s| s.starts_with("rediss://"));
                    let scheme = if tls { "rediss" } else { "redis" };
                    add(&format!("{scheme}://{master}/"))?
                };
                Self::Sentinel { master, sentinels }
            }
        })
    }

    /// The URLs given (every Redlock node, the cluster's seeds, the sentinels).
    pub fn urls(&self) -> &[String] {
        match self {
            Self::Server(url) => std::slice::from_ref(url),
            Self::Cluster(urls) | Self::Redlock(urls) => urls,
            Self::Sentinel { sentinels, .. } => sentinels,
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
            sentinel: Vec::new(),
            master_name: None,
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
    fn a_password_from_the_environment_goes_into_every_url_without_one() {
        let target = Target::Redlock(vec![
            "redis://a:1/".into(),
            "redis://user@b:1/".into(),
            "redis://:own@c:1/".into(),
        ]);
        assert_eq!(
            target.with_password("s3cret").unwrap().urls(),
            [
                "redis://:s3cret@a:1/",
                "redis://user:s3cret@b:1/",
                "redis://:own@c:1/"
            ]
        );
        let sentinel = Target::Sentinel {
            master: "mymaster".into(),
            sentinels: vec!["rediss://s:26379".into()],
        };
        let Target::Sentinel { master, sentinels } = sentinel.with_password("pw").unwrap() else {
            panic!("still sentinels");
        };
        assert_eq!(master, "rediss://:pw@mymaster/");
        assert_eq!(sentinels, ["rediss://s:26379"]);
    }

    #[test]
    fn credentials_are_the_password_and_the_url_variables_with_a_password() {
        let vars = [
            ("LOCK_REDIS_PASSWORD", "s3cret"),
            ("LOCK_REDIS_URL", "redis://a:1,redis://:pw@b:1"),
            ("REDIS_URL", "redis://user@c:1/"),
            ("LOCK_REDIS_CLUSTER", "redis://d:1"),
            ("LOCK_REDIS_SENTINEL", "rediss://user:pw@e:1"),
            ("LOCK_REDIS_SENTINEL_MASTER", "mymaster"),
        ];
        assert_eq!(
            credential_vars(env(&vars)),
            [
                "LOCK_REDIS_PASSWORD",
                "LOCK_REDIS_SENTINEL",
                "LOCK_REDIS_URL"
            ]
        );
        let master = [("LOCK_REDIS_SENTINEL_MASTER", "redis://u:p#w@mymaster/0")];
        assert_eq!(
            credential_vars(env(&master)),
            ["LOCK_REDIS_SENTINEL_MASTER"]
        );
        assert!(credential_vars(env(&[("REDIS_URL", "redis://h:1/")])).is_empty());
        assert!(credential_vars(env(&[])).is_empty());
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
    fn a_sentinel_deployment_in_the_environment_is_followed_before_any_other_redis() {
        let vars = [
            ("LOCK_REDIS_SENTINEL", "redis://s1:26379, redis://s2:26379"),
            ("LOCK_REDIS_SENTINEL_MASTER", "mymaster"),
            ("REDIS_URL", "redis://cache:6379"),
        ];
        assert_eq!(
            Target::resolve(&no_flags(), env(&vars)),
            Ok(Target::Sentinel {
                master: "mymaster".into(),
                sentinels: vec!["redis://s1:26379".into(), "redis://s2:26379".into()],
            })
        );
        // Without a master name the sentinels cannot be followed: say what to set, rather
        // than inspect whatever REDIS_URL names.
        let refused = Target::resolve(&no_flags(), env(&[vars[0], vars[2]])).unwrap_err();
        assert!(refused.contains("--master-name"), "{refused}");
        assert!(refused.contains("LOCK_REDIS_SENTINEL_MASTER"), "{refused}");
    }

    #[test]
    fn sentinel_flags_win_and_take_their_master_name_from_the_flag_or_the_environment() {
        let args = TargetArgs {
            sentinel: vec!["rediss://s1:26379".into()],
            ..no_flags()
        };
        let master_env = [("LOCK_REDIS_SENTINEL_MASTER", "from-env")];
        assert_eq!(
            Target::resolve(&args, env(&master_env)),
            Ok(Target::Sentinel {
                master: "from-env".into(),
                sentinels: vec!["rediss://s1:26379".into()],
            })
        );
        let args = TargetArgs {
            master_name: Some("from-flag".into()),
            ..args
        };
        assert_eq!(
            Target::resolve(&args, env(&master_env)),
            Ok(Target::Sentinel {
                master: "from-flag".into(),
                sentinels: vec!["rediss://s1:26379".into()],
            })
        );
        let alone = TargetArgs {
            master_name: Some("mymaster".into()),
            ..no_flags()
        };
        let refused = Target::resolve(&alone, env(&[("REDIS_URL", "redis://c:1")])).unwrap_err();
        assert!(refused.contains("--sentinel"), "{refused}");
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
