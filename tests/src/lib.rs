//! Test support: throwaway `redis-server` processes on free loopback ports, and the helpers
//! tests build on them.
//!
//! Every test starts its own servers, so tests run in parallel and can kill, pause and restart
//! them without disturbing anything else on the machine (such as a Redis on 6379).
//!
//! - [`server`]: the fixture, servers a test owns ([`RedisServer`], [`SilentServer`]);
//! - [`cluster`], [`sentinel`]: deployments made of such servers;
//! - [`proxy`]: a TCP fault proxy in front of one;
//! - [`direct`]: raw connections and server counters, behind the library's back;
//! - [`registry`]: registries with test timeouts;
//! - [`locks`]: lock steps tests share;
//! - [`poll`]: waiting for state that has no event;
//! - [`records`]: what the fault suite's worker process writes, and the tests read back.

#![allow(missing_docs)]

pub mod cluster;
pub mod direct;
pub mod locks;
pub mod poll;
pub mod postgres;
pub mod proxy;
pub mod records;
pub mod registry;
pub mod sentinel;
pub mod server;

pub use direct::{
    command_calls, command_counts, connection, fixture_has_set_ifeq, has_command, has_set_ifeq,
    raw, shard_subscribers, subscribers,
};
pub use locks::{
    assert_lost, most_inside, read_write_round, semaphore_round, spawn_hung_body,
    spawn_hung_body_holding, start_holder, warm_up, RENEWED_TTL,
};
pub use poll::{eventually, renewed_on};
pub use registry::{fast_registry, with_timeouts};
pub use server::{
    cli_binary, free_port, server_binary, signal, Certificates, RedisServer, SilentServer,
    INSTALL_HINT, SERVER_VAR,
};
