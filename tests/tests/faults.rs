//! Fault injection: real faults (a TCP fault proxy, SIGSTOP/SIGCONT and kill -9 of servers and
//! of client processes, restarts without persistence) against lock-runtime on real
//! redis-server and Postgres processes, with the invariants the lock promises checked at the end.
//! `GUARANTEES.md` names the test behind each claim.

mod faults {
    mod changes;
    mod checker;
    mod clock;
    mod limits;
    mod liveness;
    mod model;
    mod monitor;
    mod network;
    mod replay;
    mod security;
    mod support;
    mod system;
    mod workers;
    mod workload;
}
