//! Which Redis deployment to inspect: from the flags, else from the library's own environment
//! variables, so `lockctl` sees exactly what the services see (Sentinel included: the master
//! the sentinels name).

use lock_runtime::{Deployment, LockError, Registry};

/// A password for every URL that carries none, so that it need not be typed on a command line
/// (where `ps` and the shell's history show it).
pub const PASSWORD_VAR: &str = "LOCK_REDIS_PASSWORD";

use crate::cli::TargetArgs;

/// The variables of `env` that hold lockctl's credentials: [`PASSWORD_VAR`] when set, and each
/// of the library's deployment variables (`Deployment::VARIABLES`) that holds a URL with a
/// password. `lockctl run` keeps them from its
/// command.
pub fn credential_vars(env: impl Fn(&str) -> Option<String>) -> Vec<&'static str> {
    std::iter::once(PASSWORD_VAR)
        .filter(|&name| env(name).is_some())
        .chain(
            Target::VARIABLES
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

/// A deployment of lock-runtime's, as the library names it.
pub type Target = Deployment;

/// The flags win; otherwise the variables `Registry::from_env` reads, through the library's
/// own grammar (`Deployment::from_vars`): `LOCK_REDIS_SENTINEL` (with
/// `LOCK_REDIS_SENTINEL_MASTER`), then `LOCK_REDIS_CLUSTER`, then `LOCK_REDIS_URL` (a comma list
/// is Redlock), then `REDIS_URL`. `--master-name` names the master of sentinels from either
/// place, else `LOCK_REDIS_SENTINEL_MASTER` does: like the library, there is no default name.
///
/// # Errors
/// A message saying what to pass when nothing names a deployment, or sentinels no master.
pub fn resolve(args: &TargetArgs, env: impl Fn(&str) -> Option<String>) -> Result<Target, String> {
    if let Some(url) = &args.url {
        return Ok(Target::Server(url.clone()));
    }
    if let Some(url) = &args.postgres {
        return Ok(Target::Postgres {
            url: url.clone(),
            listen: None,
        });
    }
    if !args.cluster.is_empty() {
        return Ok(Target::Cluster(args.cluster.clone()));
    }
    if !args.redlock.is_empty() {
        return Ok(Target::Redlock(args.redlock.clone()));
    }
    if args
        .master_name
        .as_ref()
        .is_some_and(|m| m.trim().is_empty())
    {
        return Err(
            "--master-name is blank: pass the service name the sentinels monitor \
                    (e.g. mymaster), or leave the flag out to use LOCK_REDIS_SENTINEL_MASTER"
                .to_owned(),
        );
    }
    let var = |name: &str| env(name).filter(|v: &String| !v.trim().is_empty());
    let master = args
        .master_name
        .clone()
        .or_else(|| var(Target::SENTINEL_MASTER_VAR));
    let no_master = "sentinels are given but no master name: pass --master-name (the service \
                     name the sentinels monitor, e.g. mymaster) or set LOCK_REDIS_SENTINEL_MASTER";
    if !args.sentinel.is_empty() {
        return Ok(Target::Sentinel {
            master: master.ok_or(no_master)?,
            sentinels: args.sentinel.clone(),
        });
    }
    let sentinels_set = var("LOCK_REDIS_SENTINEL").is_some();
    if sentinels_set && master.is_none() {
        return Err(no_master.to_owned());
    }
    if args.master_name.is_some() && !sentinels_set {
        return Err(
            "--master-name names the master of sentinels: pass them with \
                    --sentinel URL,URL (or set LOCK_REDIS_SENTINEL)"
                .to_owned(),
        );
    }
    // The flag's master name stands in for the variable's.
    let env = |name: &str| {
        if name == Target::SENTINEL_MASTER_VAR {
            master.clone()
        } else {
            env(name)
        }
    };
    Target::from_vars(env)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            "no Redis or Postgres to inspect: pass --url, --cluster, --redlock, --sentinel or \
             --postgres, or set LOCK_REDIS_URL / LOCK_REDIS_CLUSTER / LOCK_REDIS_SENTINEL / \
             LOCK_POSTGRES_URL as for the services"
                .to_owned()
        })
}

/// What lockctl does with a deployment beside what the library does.
pub trait TargetExt: Sized {
    /// A registry on this deployment: `inspect` and `force_unlock` go through the library, so
    /// the CLI reads and deletes exactly the keys the library writes, in every mode.
    ///
    /// # Errors
    /// See `RegistryBuilder::build`.
    fn registry(&self, prefix: &str) -> Result<Registry, LockError>;

    /// This deployment with `password` in every URL that has none: the server's, each seed's,
    /// each Redlock node's, and with sentinels the master's login (a master given by name
    /// becomes a URL of the sentinels' scheme); sentinels that want one of their own take it
    /// in their URLs.
    ///
    /// # Errors
    /// A URL that does not parse (the message does not echo it: it may hold another password).
    fn with_password(self, password: &str) -> Result<Self, String>;
}

impl TargetExt for Target {
    fn registry(&self, prefix: &str) -> Result<Registry, LockError> {
        Registry::builder()
            .prefix(prefix)
            .deployment(self.clone())
            .build()
    }

    fn with_password(self, password: &str) -> Result<Self, String> {
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
            _ => {
                return Err(format!(
                    "lockctl cannot put {PASSWORD_VAR} into this deployment's URLs; put the \
                     password in its URL instead"
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_flags() -> TargetArgs {
        TargetArgs {
            url: None,
            postgres: None,
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
        let target = resolve(&args, env(&[("LOCK_REDIS_CLUSTER", "redis://c:1")]));
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
            resolve(&no_flags(), env(&all)),
            Ok(Target::Cluster(vec![
                "redis://c:1".into(),
                "redis://c:2".into()
            ]))
        );
        assert_eq!(
            resolve(&no_flags(), env(&all[1..])),
            Ok(Target::Server("redis://l:1".into()))
        );
        assert_eq!(
            resolve(&no_flags(), env(&all[2..])),
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
            resolve(&no_flags(), env(&vars)),
            Ok(Target::Sentinel {
                master: "mymaster".into(),
                sentinels: vec!["redis://s1:26379".into(), "redis://s2:26379".into()],
            })
        );
        // Without a master name the sentinels cannot be followed: say what to set, rather
        // than inspect whatever REDIS_URL names.
        let refused = resolve(&no_flags(), env(&[vars[0], vars[2]])).unwrap_err();
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
            resolve(&args, env(&master_env)),
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
            resolve(&args, env(&master_env)),
            Ok(Target::Sentinel {
                master: "from-flag".into(),
                sentinels: vec!["rediss://s1:26379".into()],
            })
        );
        let alone = TargetArgs {
            master_name: Some("mymaster".into()),
            ..no_flags()
        };
        let refused = resolve(&alone, env(&[("REDIS_URL", "redis://c:1")])).unwrap_err();
        assert!(refused.contains("--sentinel"), "{refused}");
    }

    #[test]
    fn a_url_list_in_the_environment_means_redlock() {
        let target = resolve(
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

    /// A blank `--master-name` is the flag's fault, whether or not the variable is set (found
    /// by the attack on the seam: it was blamed on `LOCK_REDIS_SENTINEL_MASTER`).
    #[test]
    fn a_blank_master_name_flag_is_blamed_on_the_flag() {
        let args = TargetArgs {
            master_name: Some("  ".into()),
            ..no_flags()
        };
        for vars in [
            &[("LOCK_REDIS_SENTINEL", "redis://s1:26379")][..],
            &[
                ("LOCK_REDIS_SENTINEL", "redis://s1:26379"),
                ("LOCK_REDIS_SENTINEL_MASTER", "mymaster"),
            ],
        ] {
            let err = resolve(&args, env(vars)).unwrap_err();
            assert!(err.contains("--master-name is blank"), "{err}");
        }
    }

    #[test]
    fn nothing_configured_says_what_to_pass() {
        let error = resolve(&no_flags(), env(&[("LOCK_REDIS_URL", " ")])).unwrap_err();
        assert!(error.contains("--url"), "{error}");
    }
}
