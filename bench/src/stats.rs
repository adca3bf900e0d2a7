//! Samples, medians, and how figures are printed.

use std::time::Duration;

/// Latency samples, sorted once.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    sorted: Vec<Duration>,
}

impl Samples {
    pub fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Self { sorted: samples }
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// The `q` quantile (0.0..=1.0), nearest rank.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.sorted.is_empty() {
            return Duration::ZERO;
        }
        let last = self.sorted.len() - 1;
        let rank = ((last as f64) * q.clamp(0.0, 1.0)).round() as usize;
        self.sorted[rank.min(last)]
    }

    pub fn median(&self) -> Duration {
        self.quantile(0.5)
    }

    /// Sorted values in microseconds, for the chart.
    pub fn micros(&self) -> Vec<f64> {
        self.sorted.iter().map(|d| d.as_secs_f64() * 1e6).collect()
    }
}

/// `68 µs`, `1.4 ms`, `2.31 s`.
pub fn dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 10_000.0 {
        format!("{:.2} ms", us / 1e3)
    } else if us < 1_000_000.0 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// A rate or count with thousands separators: `12,345`, or one decimal below 100.
pub fn num(x: f64) -> String {
    if x.abs() < 100.0 {
        return format!("{x:.1}");
    }
    let n = x.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

/// Bytes as `1.2 KiB` etc.
pub fn bytes(b: f64) -> String {
    if b.abs() < 1024.0 {
        format!("{b:.0} B")
    } else if b.abs() < 1024.0 * 1024.0 {
        format!("{:.2} KiB", b / 1024.0)
    } else {
        format!("{:.1} MiB", b / 1024.0 / 1024.0)
    }
}

/// A small xorshift generator: enough to spread hold times, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn seeded() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
            | 1;
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `0..max`.
    pub fn below(&mut self, max: Duration) -> Duration {
        let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX).max(1);
        Duration::from_nanos(self.next_u64() % nanos)
    }
}
