//! Item 9: resident memory per held lock.
//!
//! Measured in the renewal child process (a fresh process per library, so no other scenario's
//! freed memory is reused): resident set size after connecting and one warm-up lock, and again
//! once all locks are held. Locks are taken in waves of a few hundred, so the memory of the
//! acquisition tasks themselves stays small next to what the held locks keep.

/// Resident set size of this process (`VmRSS` in `/proc/self/status`).
pub fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    pub before: u64,
    pub after: u64,
    pub locks: usize,
}

impl Memory {
    pub fn per_lock(&self) -> f64 {
        (self.after as f64 - self.before as f64) / self.locks.max(1) as f64
    }
}
