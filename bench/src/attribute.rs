//! Item 8: what `#[distributed_lock]` costs over the manual API it expands to.
//!
//! The same empty body under the same key, interleaved call by call: the annotated fn (named
//! registry lookup, key rendering, `run`), the manual `registry.lock(key).run(body)`, and the
//! manual `acquire()` + `release()`.

use std::time::{Duration, Instant};

use lock_runtime::{LockError, Registry};

use crate::stats::Samples;

#[lock_runtime::distributed_lock(key = "bench:<i>", registry = "bench")]
async fn annotated(i: u64) -> Result<(), LockError> {
    std::hint::black_box(i);
    Ok(())
}

pub struct Attribute {
    pub annotated: Samples,
    pub manual_run: Samples,
    pub manual_guard: Samples,
}

impl Attribute {
    /// Annotated over manual `run`.
    pub fn ratio(&self) -> f64 {
        self.annotated.median().as_secs_f64() / self.manual_run.median().as_secs_f64()
    }
}

pub async fn measure(url: &str, iterations: usize) -> Attribute {
    let registry = Registry::from_url(url).expect("url");
    registry.install_as("bench");
    let mut annotated_samples = Vec::with_capacity(iterations);
    let mut run_samples = Vec::with_capacity(iterations);
    let mut guard_samples = Vec::with_capacity(iterations);
    for n in 0..iterations + 200 {
        let i = (n % 16) as u64;
        let warm = n < 200;
        // Rotate the order so none always runs right after another.
        for k in 0..3 {
            let started = Instant::now();
            let samples = match (n + k) % 3 {
                0 => {
                    annotated(i).await.expect("annotated");
                    &mut annotated_samples
                }
                1 => {
                    registry
                        .lock(format!("bench:{i}"))
                        .run(async {
                            std::hint::black_box(i);
                            Ok::<(), LockError>(())
                        })
                        .await
                        .expect("manual run");
                    &mut run_samples
                }
                _ => {
                    let guard = registry
                        .lock(format!("bench:{i}"))
                        .acquire()
                        .await
                        .expect("acquire");
                    std::hint::black_box(i);
                    guard.release().await.expect("release");
                    &mut guard_samples
                }
            };
            let elapsed: Duration = started.elapsed();
            if !warm {
                samples.push(elapsed);
            }
        }
    }
    Attribute {
        annotated: Samples::new(annotated_samples),
        manual_run: Samples::new(run_samples),
        manual_guard: Samples::new(guard_samples),
    }
}
