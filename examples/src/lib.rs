//! What the examples share: where their Redis (or Postgres) comes from.

/// `LOCK_REDIS_URL` (else `REDIS_URL`) when set; otherwise a throwaway redis-server that lives
/// as long as the returned handle.
#[must_use]
pub fn redis_url() -> (Option<lock_tests::RedisServer>, String) {
    match std::env::var("LOCK_REDIS_URL").or_else(|_| std::env::var("REDIS_URL")) {
        Ok(url) => (None, url),
        Err(_) => {
            let server = lock_tests::RedisServer::start();
            let url = server.url();
            println!("started a throwaway redis-server at {url}");
            (Some(server), url)
        }
    }
}

/// `LOCK_POSTGRES_URL` when set; otherwise a throwaway Postgres cluster (Debian's `initdb` and
/// `pg_ctl`; `scripts/ensure-postgres` installs them) that lives as long as the returned handle.
#[must_use]
pub fn postgres_url() -> (Option<lock_tests::postgres::PostgresServer>, String) {
    match std::env::var("LOCK_POSTGRES_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let server = lock_tests::postgres::PostgresServer::start();
            let url = server.url();
            println!("started a throwaway Postgres at {url}");
            (Some(server), url)
        }
    }
}

/// One copy of the running example in its own process (a replica, a buyer), started by
/// [`start_copies`].
pub struct Copy {
    child: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

/// Starts one copy of the running example per item of `envs`, each with those environment
/// variables and piped stdin/stdout, and returns once every copy has printed `READY`: all are
/// connected before any starts, so they race from the same moment ([`start_all`]).
///
/// # Panics
/// When a copy cannot start or exits before it is ready.
#[must_use]
pub fn start_copies(envs: Vec<Vec<(&str, String)>>) -> Vec<Copy> {
    use std::io::BufRead;
    let mut copies: Vec<Copy> = envs
        .into_iter()
        .map(|env| {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .envs(env)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("start a copy of the example");
            let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
            Copy { child, lines }
        })
        .collect();
    for copy in &mut copies {
        let ready = copy.lines.next().and_then(Result::ok);
        assert_eq!(ready.as_deref(), Some("READY"), "a copy did not start");
    }
    copies
}

/// Writes `line` to every copy's stdin: the signal to start.
///
/// # Panics
/// When a copy has gone.
pub fn start_all(copies: &mut [Copy], line: &str) {
    use std::io::Write;
    for copy in copies {
        let mut stdin = copy.child.stdin.take().unwrap();
        writeln!(stdin, "{line}").expect("signal a copy");
    }
}

/// Every line each copy prints until it exits, copy by copy.
///
/// # Panics
/// When a copy exits with a failure.
#[must_use]
pub fn finish_copies(copies: Vec<Copy>) -> Vec<String> {
    let mut all = Vec::new();
    for mut copy in copies {
        all.extend(copy.lines.by_ref().map_while(Result::ok));
        assert!(
            copy.child.wait().unwrap().success(),
            "a copy of the example failed"
        );
    }
    all
}

/// The copy's side of [`start_copies`] / [`start_all`]: says `READY`, then blocks until the
/// parent's start line arrives and returns it (trimmed).
///
/// # Panics
/// When the parent has gone.
#[must_use]
pub fn ready_and_wait_for_start() -> String {
    println!("READY");
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .expect("the parent sends the start line");
    line.trim().to_owned()
}
