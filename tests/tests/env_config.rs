//! The deployment mode comes from the environment with no code change. One test in its own
//! binary, because it changes the process environment.

use lock_runtime::Registry;

#[test]
fn the_environment_selects_single_node_redlock_cluster_or_sentinel() {
    let clear = || {
        for var in [
            "LOCK_REDIS_URL",
            "REDIS_URL",
            "LOCK_REDIS_CLUSTER",
            "LOCK_REDIS_SENTINEL",
            "LOCK_REDIS_SENTINEL_MASTER",
            "LOCK_REDIS_CONFIRM_REPLICAS",
            "LOCK_POSTGRES_URL",
        ] {
            std::env::remove_var(var);
        }
    };
    clear();
    let err = Registry::from_env().unwrap_err();
    assert!(err.to_string().contains("LOCK_REDIS_URL"), "{err}");

    std::env::set_var("REDIS_URL", "redis://10.0.0.9:6379/");
    assert_eq!(Registry::from_env().unwrap().node(), "10.0.0.9:6379");
    std::env::set_var("LOCK_REDIS_URL", "redis://10.0.0.5:6379/");
    assert_eq!(
        Registry::from_env().unwrap().node(),
        "10.0.0.5:6379",
        "LOCK_REDIS_URL first"
    );
    assert!(format!("{:?}", Registry::from_env().unwrap()).contains("confirm_replicas: 0"));

    // Replica confirmation rides along with any mode that has it.
    std::env::set_var("LOCK_REDIS_CONFIRM_REPLICAS", "2");
    assert!(format!("{:?}", Registry::from_env().unwrap()).contains("confirm_replicas: 2"));
    std::env::set_var("LOCK_REDIS_CONFIRM_REPLICAS", "two");
    let err = Registry::from_env().unwrap_err();
    assert!(
        err.to_string()
            .contains("LOCK_REDIS_CONFIRM_REPLICAS is `two`"),
        "{err}"
    );
    std::env::set_var("LOCK_REDIS_CONFIRM_REPLICAS", "1");
    std::env::set_var("LOCK_REDIS_CLUSTER", "redis://10.0.1.1:7000/");
    let err = Registry::from_env().unwrap_err();
    assert!(
        err.to_string().contains("LOCK_REDIS_CONFIRM_REPLICAS"),
        "a cluster refuses it, naming the variable: {err}"
    );
    std::env::remove_var("LOCK_REDIS_CLUSTER");
    std::env::remove_var("LOCK_REDIS_CONFIRM_REPLICAS");

    std::env::set_var(
        "LOCK_REDIS_URL",
        "redis://10.0.0.1:6379/, redis://10.0.0.2:6379/,redis://10.0.0.3:6379/",
    );
    assert_eq!(
        Registry::from_env().unwrap().node(),
        "redlock(10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379)"
    );

    // A trailing comma once made a one-node Redlock out of a single server's URL.
    std::env::set_var("LOCK_REDIS_URL", "redis://10.0.0.1:6379,");
    let err = Registry::from_env().unwrap_err();
    assert!(
        err.to_string().contains("entry 2 "),
        "names the empty entry: {err}"
    );

    std::env::set_var(
        "LOCK_REDIS_CLUSTER",
        "redis://10.0.1.1:7000/,redis://10.0.1.2:7000/",
    );
    assert_eq!(
        Registry::from_env().unwrap().node(),
        "cluster(10.0.1.1:7000,10.0.1.2:7000)",
        "LOCK_REDIS_CLUSTER wins"
    );

    std::env::set_var(
        "LOCK_REDIS_SENTINEL",
        "redis://10.0.2.1:26379,redis://10.0.2.2:26379",
    );
    let err = Registry::from_env().unwrap_err();
    assert!(
        err.to_string().contains("LOCK_REDIS_SENTINEL_MASTER"),
        "names what is missing: {err}"
    );
    std::env::set_var("LOCK_REDIS_SENTINEL_MASTER", "redis://locker:pw@orders/3");
    assert_eq!(
        Registry::from_env().unwrap().node(),
        "sentinel orders via 10.0.2.1:26379,10.0.2.2:26379",
        "LOCK_REDIS_SENTINEL wins"
    );
    std::env::remove_var("LOCK_REDIS_SENTINEL");

    std::env::set_var("LOCK_REDIS_CLUSTER", "redis://user:pw@[bad");
    let err = Registry::from_env().unwrap_err();
    assert!(!err.to_string().contains("pw"), "{err}");
    clear();

    // Postgres: its own variable; beside a LOCK_REDIS_* one the store meant is unclear, beside
    // REDIS_URL (Redis used for other things) it is not.
    std::env::set_var("LOCK_POSTGRES_URL", "postgres://locks:pw@10.0.3.1:5433/app");
    assert_eq!(Registry::from_env().unwrap().node(), "10.0.3.1:5433");
    std::env::set_var("REDIS_URL", "redis://10.0.0.9:6379/");
    assert_eq!(Registry::from_env().unwrap().node(), "10.0.3.1:5433");
    std::env::set_var("LOCK_REDIS_URL", "redis://10.0.0.5:6379/");
    let err = Registry::from_env().unwrap_err();
    assert!(
        err.to_string()
            .contains("LOCK_POSTGRES_URL and LOCK_REDIS_URL"),
        "{err}"
    );
    std::env::remove_var("LOCK_REDIS_URL");
    std::env::set_var("LOCK_POSTGRES_URL", "postgres://locks:pw@[bad");
    let err = Registry::from_env().unwrap_err();
    assert!(!err.to_string().contains("pw"), "{err}");
    std::env::set_var(
        "LOCK_POSTGRES_URL",
        "postgres://locks:pw@10.0.3.1/app?sslmode=require",
    );
    // TLS with the `postgres-tls` feature (without it, refused naming the feature: the unit
    // tests of `backend::postgres::tls`); nothing is connected at build.
    let registry = Registry::from_env().expect("TLS to Postgres");
    assert_eq!(registry.node(), "10.0.3.1:5432");
    clear();
}

/// Passwords never appear in `Debug` output (GUARANTEES.md): not of a `Deployment` (public
/// since the store seam, and what `Deployment::from_vars` returns), nor of a builder that holds
/// one (found by the attack on the seam: both derived `Debug` over the raw URLs).
#[test]
fn a_deployment_and_a_builder_never_show_their_passwords_in_debug_output() {
    use lock_runtime::Deployment;
    const SECRET: &str = "s3cret-pw-4711";
    let url = format!("redis://locker:{SECRET}@127.0.0.1:6390/");
    let shapes = [
        Deployment::Server(url.clone()),
        Deployment::Cluster(vec![url.clone()]),
        Deployment::Redlock(vec![url.clone(), url.clone(), url.clone()]),
        Deployment::Sentinel {
            master: format!("redis://:{SECRET}@mymaster/"),
            sentinels: vec![url.clone()],
        },
        Deployment::Postgres {
            url: format!("postgres://locker:{SECRET}@127.0.0.1:6390/app"),
            listen: Some(format!("postgres://locker:{SECRET}@127.0.0.1:6391/app")),
        },
        // Wherever else a password can stand: unencoded with a `/` in it, in the query, in a
        // libpq connection string.
        Deployment::Server(format!("redis://locker:{SECRET}/x@127.0.0.1:6390/")),
        Deployment::Postgres {
            url: format!("postgresql://127.0.0.1:6390/app?user=locker&password={SECRET}"),
            listen: Some(format!(
                "host=127.0.0.1 port=6391 user=locker password={SECRET} dbname=app"
            )),
        },
    ];
    for deployment in shapes {
        let shown = format!("{deployment:?}");
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(
            shown.contains("127.0.0.1:6390"),
            "still says where: {shown}"
        );
        let builder = Registry::builder().deployment(deployment);
        let shown = format!("{builder:?}");
        assert!(!shown.contains(SECRET), "{shown}");
    }
}
