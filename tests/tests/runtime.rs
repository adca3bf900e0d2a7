//! lock-runtime against real redis-server processes that each test starts itself.

mod runtime {
    mod admin;
    mod coalescing;
    mod election;
    mod ending;
    mod exclusion;
    mod failures;
    mod fencing;
    mod fixture;
    mod handoff;
    mod held_for;
    mod leases;
    mod letting_go;
    mod memory;
    mod multi_key;
    mod read_write;
    mod reentrancy;
    mod reporting;
    mod semaphore;
    mod spans;
    mod standing_aside;
    mod stepping_down;
    mod support;
    mod waiting;
}
