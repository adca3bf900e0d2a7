//! The machine's wall clock, watched against its monotonic clock while a run lasts. The
//! workers, the servers and the checks all stamp and expire in wall-clock time, which a virtual
//! machine resumed after a pause, or a time daemon, can make jump; the clients time their
//! leases on the monotonic clock, which does not jump. A run records every jump it saw, so the
//! checks can tell what a jump did from what the library did (see `checker::ClockStep`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::checker::ClockStep;
use super::support::now_us;

/// A jump smaller than this is not recorded: a time daemon's slewing moves the wall clock by
/// microseconds a second, and the library's drift allowance covers a jump this small.
const SMALLEST: Duration = Duration::from_millis(10);
/// How often both clocks are read.
const EVERY: Duration = Duration::from_millis(2);

/// A thread reading both clocks until [`finish`](Self::finish).
pub struct ClockWatch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<ClockStep>>,
}

impl ClockWatch {
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("clock-watch".into())
            .spawn(move || {
                let mut steps = Vec::new();
                let mut last = Reading::now();
                while !stopped.load(Ordering::SeqCst) {
                    std::thread::sleep(EVERY);
                    let next = Reading::now();
                    steps.extend(step_between(last, next));
                    last = next;
                }
                steps
            })
            .expect("start the clock watch");
        Self { stop, thread }
    }

    /// Stops watching; returns the jumps seen.
    pub fn finish(self) -> Vec<ClockStep> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("the clock watch")
    }
}

/// Both clocks, read back to back.
#[derive(Clone, Copy, Debug)]
struct Reading {
    wall_us: i64,
    mono: Instant,
}

impl Reading {
    /// A reading whose two halves are less than a millisecond apart (the thread may be
    /// preempted between them: read again then).
    fn now() -> Self {
        loop {
            let mono = Instant::now();
            let wall_us = now_us();
            if mono.elapsed() < Duration::from_millis(1) {
                return Self { wall_us, mono };
            }
        }
    }
}

/// The jump between two readings: the wall clock moved at least [`SMALLEST`] more, or less,
/// than the monotonic clock.
fn step_between(last: Reading, next: Reading) -> Option<ClockStep> {
    let mono_us = i64::try_from((next.mono - last.mono).as_micros()).expect("fits");
    let moved_us = next.wall_us - last.wall_us - mono_us;
    let smallest = i64::try_from(SMALLEST.as_micros()).expect("fits");
    (moved_us.abs() >= smallest).then_some(ClockStep {
        before_us: last.wall_us,
        after_us: next.wall_us,
        moved_us,
    })
}

#[test]
fn a_jump_of_the_wall_clock_is_told_from_time_passing_and_from_slewing() {
    let mono = Instant::now();
    let at = |wall_us: i64, mono_ms: u64| Reading {
        wall_us,
        mono: mono + Duration::from_millis(mono_ms),
    };
    let last = at(799_950_000, 0);
    // Time passing, however long the watch was kept off the CPU, is no jump; nor is slewing.
    assert_eq!(step_between(last, at(800_450_000, 500)), None);
    assert_eq!(step_between(last, at(799_952_001, 2)), None);
    // 2 ms passed and the wall clock read 9.602 s later: a jump forward of 9.6 s, which came
    // between the two readings, at the latest when the wall clock read 2 ms past the first.
    let step = step_between(last, at(809_552_000, 2)).expect("a jump");
    assert_eq!(
        step,
        ClockStep {
            before_us: 799_950_000,
            after_us: 809_552_000,
            moved_us: 9_600_000,
        }
    );
    assert_eq!(step.jumped_by(), 799_952_000);
    // And back.
    let back = step_between(last, at(799_900_000, 2)).expect("a jump back");
    assert_eq!(back.moved_us, -52_000);
}
