//! The fixture starts the server `LOCK_TEST_SERVER` names (`scripts/test` runs this suite once
//! on Debian's redis-server and once on Valkey).

use lock_tests::{RedisServer, SERVER_VAR};

#[test]
fn the_fixture_starts_the_server_lock_test_server_names() {
    let server = RedisServer::start();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut server.connection())
        .expect("INFO server");
    let valkey = info.contains("server_name:valkey");
    let named = std::env::var(SERVER_VAR).unwrap_or_default();
    assert_eq!(
        valkey,
        named.contains("valkey"),
        "{SERVER_VAR}={named:?}, but the server says:\n{info}"
    );
}
