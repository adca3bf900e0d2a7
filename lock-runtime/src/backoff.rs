//! Retrying at a growing, jittered interval, for retries that no notification can shorten
//! (failed commands, a lost connection, waiting where pub/sub is unavailable).

use std::time::Duration;

/// Pauses from 10 ms doubling to 1 s, each a random point in the upper half of its step, so
/// processes that failed together do not retry in lockstep.
#[derive(Debug)]
pub(crate) struct Backoff {
    step: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    pub(crate) fn new() -> Self {
        Self { step: Self::FIRST }
    }

    /// The next pause to take.
    pub(crate) fn next_pause(&mut self) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(Self::MAX);
        let jitter = getrandom::u32().unwrap_or(0) % 1000;
        step / 2 + step * jitter / 2000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_to_a_second_and_stay_in_the_upper_half_of_their_step() {
        let mut backoff = Backoff::new();
        let mut step = Backoff::FIRST;
        for _ in 0..12 {
            let pause = backoff.next_pause();
            assert!(
                pause >= step / 2 && pause < step,
                "{pause:?} outside {step:?}"
            );
            step = (step * 2).min(Backoff::MAX);
        }
        assert_eq!(step, Backoff::MAX);
    }
}
