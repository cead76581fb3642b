//! How passes share this CPU, measured: one model's pass alone, on spawned
//! threads, and as 2 and 4 copies at once.

use std::sync::Barrier;
use std::thread;
use std::time::Instant;

use burn::tensor::Device;
use burn_freeze::{Differentiable, LayerStack, StackTypes};
use burn_pipe::profile_units;

use super::presets::{Shape, on_each_batch};
use crate::bench::median;

/// Seconds per pass of one model at one batch size, run several ways.
///
/// How passes share this CPU, measured: the same forward and backward pass
/// of a model (unit by unit, as a pipeline stage runs it) timed alone on the
/// calling thread, alone on a spawned thread, on a fresh thread per pass
/// (burn-pipe spawns its stage threads for every step), and as 2 and 4
/// copies at once on as many threads. A pass alone already spreads over the
/// backend's thread pool; how much slower copies run together says how much
/// of the CPU one pass takes: two copies as fast as one means a pass uses a
/// core's worth; twice as slow, the whole CPU.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Sharing {
    /// Samples per pass.
    pub batch: usize,
    /// Alone, on the calling thread.
    pub main: f64,
    /// Alone, on one spawned thread running pass after pass.
    pub spawned: f64,
    /// Alone, on a freshly spawned thread per pass (spawn and join included).
    pub fresh: f64,
    /// Two copies at once, on two spawned threads: seconds per pass of each.
    pub two: f64,
    /// Four copies at once, on four spawned threads.
    pub four: f64,
}

impl Sharing {
    /// How many of `cores` one pass takes alone, in [1, `cores`]: under
    /// processor sharing capped per pass, `n` copies at once on `cores`
    /// cores each run `n * p / cores` times slower than one alone; `p` is
    /// the least-squares fit of that to the 2 and 4 copies' slow-downs
    /// (with 2 cores: two copies as fast as one mean p = 1; twice as slow,
    /// p = 2).
    ///
    /// ```
    /// use pipetransformer_harness::plan::sharing::Sharing;
    ///
    /// let row = |two, four| Sharing { batch: 2, main: 1.0, spawned: 1.0, fresh: 1.0, two, four };
    /// assert!((row(1.5, 3.0).parallelism(2.0) - 1.5).abs() < 1e-12);
    /// assert_eq!(row(1.0, 1.0).parallelism(2.0), 1.0);
    /// assert_eq!(row(3.0, 6.0).parallelism(2.0), 2.0);
    /// ```
    pub fn parallelism(&self, cores: f64) -> f64 {
        let (r2, r4) = (self.two / self.spawned, self.four / self.spawned);
        (cores * (2.0 * r2 + 4.0 * r4) / 20.0).clamp(1.0, cores)
    }
}

/// `[batch, parallelism]` points of `rows` for [`super::calibrate::CpuModel`].
///
/// ```
/// use pipetransformer_harness::plan::sharing::{Sharing, parallelism_points};
///
/// let row = |batch, two| Sharing { batch, main: 1.0, spawned: 1.0, fresh: 1.0, two, four: 2.0 * two };
/// assert_eq!(parallelism_points(&[row(2, 1.25), row(8, 2.5)], 2.0), vec![[2.0, 1.25], [8.0, 2.0]]);
/// ```
pub fn parallelism_points(rows: &[Sharing], cores: f64) -> Vec<[f64; 2]> {
    rows.iter()
        .map(|r| [r.batch as f64, r.parallelism(cores)])
        .collect()
}

/// `[batch, spawned / main]` points of `rows`: how many times longer a
/// pass takes on a spawned thread than on the calling thread.
///
/// ```
/// use pipetransformer_harness::plan::sharing::{Sharing, thread_factor_points};
///
/// let row = Sharing { batch: 32, main: 0.08, spawned: 0.1, fresh: 0.1, two: 0.11, four: 0.23 };
/// assert!((thread_factor_points(&[row])[0][1] - 1.25).abs() < 1e-12);
/// ```
pub fn thread_factor_points(rows: &[Sharing]) -> Vec<[f64; 2]> {
    rows.iter()
        .map(|r| [r.batch as f64, r.spawned / r.main])
        .collect()
}

/// Seconds per pass of `copies` copies of the pass, each on its own
/// spawned thread running `reps` passes, started together.
fn concurrent<S>(
    stack: &LayerStack<S>,
    input: &S::Input,
    device: &Device<S::Backend>,
    copies: usize,
    reps: usize,
) -> f64
where
    S: StackTypes,
    S::Output: Differentiable<S::Backend>,
    LayerStack<S>: Send,
    S::Input: Send,
{
    let barrier = Barrier::new(copies + 1);
    thread::scope(|scope| {
        let handles: Vec<_> = (0..copies)
            .map(|_| {
                let (stack, input, device, barrier) =
                    (stack.clone(), input.clone(), device.clone(), &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    for _ in 0..reps {
                        let _ = profile_units(&stack, input.clone(), &device, 1);
                    }
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for handle in handles {
            handle.join().expect("a probe thread panicked");
        }
        start.elapsed().as_secs_f64() / reps as f64
    })
}

/// Measures one model at one batch size: `rounds` rounds (median kept),
/// each timing every way in turn, for about `target` seconds per way.
fn measure<S>(
    stack: &LayerStack<S>,
    input: S::Input,
    device: &Device<S::Backend>,
    batch: usize,
    rounds: usize,
    target: f64,
) -> Sharing
where
    S: StackTypes,
    S::Output: Differentiable<S::Backend>,
    LayerStack<S>: Send,
    S::Input: Send,
{
    let pass = || {
        let _ = profile_units(stack, input.clone(), device, 1);
    };
    // Warm-up, and the pass's length to size the repetitions.
    pass();
    let start = Instant::now();
    pass();
    let once = start.elapsed().as_secs_f64().max(1e-6);
    let reps = ((target / once).ceil() as usize).clamp(3, 400);
    let mut ways: [Vec<f64>; 5] = Default::default();
    for _ in 0..rounds.max(1) {
        let start = Instant::now();
        for _ in 0..reps {
            pass();
        }
        ways[0].push(start.elapsed().as_secs_f64() / reps as f64);
        ways[1].push(concurrent(stack, &input, device, 1, reps));
        let start = Instant::now();
        for _ in 0..reps {
            let (stack, input, device) = (stack.clone(), input.clone(), device.clone());
            thread::scope(|scope| {
                scope.spawn(move || {
                    let _ = profile_units(&stack, input, &device, 1);
                });
            });
        }
        ways[2].push(start.elapsed().as_secs_f64() / reps as f64);
        ways[3].push(concurrent(stack, &input, device, 2, reps));
        ways[4].push(concurrent(stack, &input, device, 4, reps.div_ceil(2)));
    }
    let [main, spawned, fresh, two, four] = ways.map(median);
    Sharing {
        batch,
        main,
        spawned,
        fresh,
        two,
        four,
    }
}

/// [`Sharing`] of the whole model of `shape` at each of `batches` on this
/// backend (5 rounds, about 0.25 s per way and round).
pub fn probe(shape: &Shape, batches: &[usize]) -> Vec<Sharing> {
    on_each_batch!(shape, batches, |stack, input, device, batch| measure(
        &stack, input, &device, batch, 5, 0.25
    ))
}
