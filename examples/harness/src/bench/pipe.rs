//! `bench pipe`: pipelined steps against the same work run sequentially.

use std::time::{Duration, Instant};

use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::optim::{GradientsAccumulator, GradientsParams, SgdConfig};
use burn::prelude::*;
use burn_freeze::{IntoLayerStack, LayerStack};
use burn_pipe::{PipelineConfig, Schedule, balance_exact, profile_units};
use models::synthetic::BandImages;
use models::vit::{Vit, VitConfig, VitTypes};
use serde::Serialize;

use super::{BenchError, median, title, write_report};
use burn_pipe::StepOptions;
use pipetransformer_jobs::backend::{self, Inner, Train};

type Stack = LayerStack<VitTypes<Train>>;

#[derive(Debug, Serialize)]
struct Row {
    stages: usize,
    micro_batches: usize,
    schedule: String,
    balance: Vec<usize>,
    step_ms: f64,
    sequential_ms: f64,
    ratio_to_sequential: f64,
    bubble_measured: f64,
    bubble_theory: f64,
    messages: usize,
    peak_saved: Vec<usize>,
}

#[derive(Debug, Serialize)]
struct ChannelOverhead {
    message_floats: usize,
    tensor_message_us: f64,
    empty_message_us: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    backend: &'static str,
    quick: bool,
    model: String,
    batch: usize,
    repetitions: usize,
    unit_cost_ms: Vec<f64>,
    channel: ChannelOverhead,
    rows: Vec<Row>,
}

/// The same micro-batches, forward and backward one after another on this
/// thread through the plain stack, their gradients accumulated as plain Burn
/// does it (`GradientsAccumulator`), so the baseline ends with the same
/// gradients the pipeline does; once, in seconds.
fn sequential_once(
    model: &Vit<Train>,
    images: &Tensor<Train, 4>,
    labels: &Tensor<Train, 1, Int>,
    sizes: &[usize],
) -> f64 {
    let device = images.device();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let batch = images.dims()[0];
    let start = Instant::now();
    let mut offset = 0;
    let mut accumulator = GradientsAccumulator::new();
    for &n in sizes {
        let logits = model.forward(images.clone().narrow(0, offset, n));
        let loss = loss_fn
            .forward(logits, labels.clone().narrow(0, offset, n))
            .mul_scalar(n as f32 / batch as f32);
        accumulator.accumulate(model, GradientsParams::from_grads(loss.backward(), model));
        offset += n;
    }
    let _ = accumulator.grads();
    Inner::sync(&device).expect("device sync");
    start.elapsed().as_secs_f64()
}

/// Round trip of `message` between two threads over crossbeam channels; the
/// mean time per one-way message.
fn channel_overhead<T: Clone + Send + 'static>(message: T, round_trips: usize) -> Duration {
    let (to_echo, echo_in) = crossbeam_channel::unbounded::<T>();
    let (echo_out, back) = crossbeam_channel::unbounded::<T>();
    let echo = std::thread::spawn(move || {
        while let Ok(value) = echo_in.recv() {
            if echo_out.send(value).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    for _ in 0..round_trips {
        to_echo.send(message.clone()).expect("echo thread alive");
        back.recv().expect("echo thread alive");
    }
    let elapsed = start.elapsed();
    drop(to_echo);
    echo.join().expect("echo thread");
    elapsed / (2 * round_trips as u32)
}

/// The benchmark's model, batch and timed repetitions (`plan --calibrate`
/// rebuilds the same model to predict this benchmark's step times).
pub fn model_config(quick: bool) -> (VitConfig, usize, usize) {
    if quick {
        (
            VitConfig::tiny(10)
                .with_image_size(32)
                .with_hidden(96)
                .with_mlp_dim(192)
                .with_layers(3),
            32,
            7,
        )
    } else {
        (
            VitConfig::tiny(10)
                .with_image_size(32)
                .with_hidden(128)
                .with_mlp_dim(256)
                .with_layers(6),
            64,
            5,
        )
    }
}

/// Runs the pipeline benchmark.
///
/// A ViT (wider than the tiny preset, so compute dominates) is balanced over
/// K stages with the exact partitioner on profiled unit times. For K in
/// {1, 2, 4}, M in {1, 4, 8, 16} and both schedules, one forward-backward pass
/// over a mini-batch is timed (median of the timed repetitions) and compared
/// with the same micro-batches run one after another on one thread through
/// the plain layer stack. The bubble fraction is measured from the stages'
/// busy time (`1 - busy / (K * wall)`) and shown beside GPipe's
/// `(K - 1) / (M + K - 1)`. Channel overhead is timed apart: an activation of
/// one micro-batch sent back and forth between two threads.
///
/// On a machine with fewer cores than stages, stages share cores: step times
/// then show the cost of pipelining, not its gain, and busy times include
/// time spent waiting for a core.
pub fn run(quick: bool) -> Result<(), BenchError> {
    let device = backend::device(0);
    let (config, batch, reps) = model_config(quick);
    let model = format!(
        "ViT {}px/{} hidden {} layers {} ({} units)",
        config.image_size,
        config.patch_size,
        config.hidden,
        config.layers,
        config.num_units()
    );
    let vit = config.init::<Train>(&device);
    let stack: Stack = vit.into_layer_stack();
    // The same weights as a plain Burn model, for the sequential baseline.
    let plain = Vit::from_layer_stack(stack.clone()).map_err(|e| BenchError::Run(e.to_string()))?;
    let (images, labels) =
        BandImages::new(10, 3, config.image_size, 1).batch::<Train>(0, batch, &device);

    let profile = profile_units(&stack, images.clone(), &device, 3)
        .map_err(|e| BenchError::Run(e.to_string()))?;
    let costs: Vec<f64> = profile.iter().map(|p| p.cost(false, false)).collect();
    let channel = measure_channel(
        quick,
        batch,
        config.num_patches() + 1,
        config.hidden,
        &device,
    );

    let details = format!(
        "{model}; batch {batch}; median of {reps}; ratios against the same micro-batches run sequentially in this run"
    );
    println!("{}", title("pipe", quick, &details));
    println!(
        "channel overhead: {:.2} us per activation message ({} floats), {:.2} us per empty message",
        channel.tensor_message_us, channel.message_floats, channel.empty_message_us
    );
    println!(
        "{:>2} {:>3} {:<9} {:<14} {:>9} {:>9} {:>6} {:>8} {:>8} {:>5}  peak saved",
        "K", "M", "schedule", "balance", "step ms", "seq ms", "ratio", "bubble", "theory", "msgs"
    );
    let bench = RowBench {
        stack: &stack,
        plain: &plain,
        images: &images,
        labels: &labels,
        loss_fn: &CrossEntropyLossConfig::new().init(&device),
        device: &device,
        reps,
    };
    let mut rows = Vec::new();
    for m in [1, 4, 8, 16] {
        if m > batch {
            continue;
        }
        let sizes = burn_pipe::micro::micro_batch_sizes(batch, m).expect("M <= batch");
        for stages in [1, 2, 4] {
            let balance = balance_exact(&costs, stages);
            for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
                let row = bench.row((m, stages), &sizes, schedule, &balance)?;
                print_row(&row);
                rows.push(row);
            }
        }
    }
    let report = Report {
        bench: "pipe",
        backend: backend::NAME,
        quick,
        model,
        batch,
        repetitions: reps,
        unit_cost_ms: costs.iter().map(|c| c * 1e3).collect(),
        channel,
        rows,
    };
    let path = write_report("pipe", &report)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The channel's overhead: an activation of one micro-batch (a quarter of
/// `batch` of `tokens` x `hidden`) and an empty message sent back and forth.
fn measure_channel(
    quick: bool,
    batch: usize,
    tokens: usize,
    hidden: usize,
    device: &Device<Inner>,
) -> ChannelOverhead {
    ChannelOverhead {
        message_floats: batch / 4 * tokens * hidden,
        tensor_message_us: channel_overhead(
            Tensor::<Inner, 3>::zeros([batch / 4, tokens, hidden], device),
            if quick { 200 } else { 1000 },
        )
        .as_secs_f64()
            * 1e6,
        empty_message_us: channel_overhead((), if quick { 200 } else { 1000 }).as_secs_f64() * 1e6,
    }
}

/// What a row is measured on: the stack, the same weights as a plain
/// model, one mini-batch, and the timed repetitions.
struct RowBench<'a> {
    stack: &'a Stack,
    plain: &'a Vit<Train>,
    images: &'a Tensor<Train, 4>,
    labels: &'a Tensor<Train, 1, Int>,
    loss_fn: &'a CrossEntropyLoss<Train>,
    device: &'a Device<Train>,
    reps: usize,
}

impl RowBench<'_> {
    /// Times the pipeline of `stages` stages of `balance` over `m`
    /// micro-batches of `sizes` in `schedule` against the same micro-batches run sequentially.
    fn row(
        &self,
        (m, stages): (usize, usize),
        sizes: &[usize],
        schedule: Schedule,
        balance: &[usize],
    ) -> Result<Row, BenchError> {
        let config = PipelineConfig::new()
            .with_schedule(schedule)
            .with_micro_batches(Some(m));
        let mut pipeline = config
            .with_balance(Some(balance.to_vec()))
            .init(
                self.stack.clone(),
                vec![self.device.clone(); stages],
                || SgdConfig::new().init(),
            )
            .map_err(|e| BenchError::Run(e.to_string()))?;
        let mut walls = Vec::new();
        let mut sequential_walls = Vec::new();
        let mut bubbles = Vec::new();
        let mut last = None;
        // The baseline runs between the pipeline's repetitions, so
        // both see the same state of the machine.
        for rep in 0..=self.reps {
            let sequential_s = sequential_once(self.plain, self.images, self.labels, sizes);
            let report = pipeline
                .forward_backward(
                    self.images.clone(),
                    self.labels.clone(),
                    |logits, labels| self.loss_fn.forward(logits, labels),
                    StepOptions::new(),
                )
                .map_err(|e| BenchError::Run(e.to_string()))?;
            pipeline.clear_gradients();
            if rep > 0 {
                sequential_walls.push(sequential_s);
                walls.push(report.wall.as_secs_f64());
                bubbles.push(report.bubble_fraction());
                last = Some(report);
            }
        }
        let report = last.expect("at least one timed repetition");
        let step_s = median(walls);
        let sequential_s = median(sequential_walls);
        Ok(Row {
            stages,
            micro_batches: m,
            schedule: format!("{schedule:?}"),
            balance: balance.to_vec(),
            step_ms: step_s * 1e3,
            sequential_ms: sequential_s * 1e3,
            ratio_to_sequential: step_s / sequential_s,
            bubble_measured: median(bubbles),
            bubble_theory: (stages - 1) as f64 / (m + stages - 1) as f64,
            messages: report.messages,
            peak_saved: report.peak_saved.clone(),
        })
    }
}

/// Prints one row of the table.
fn print_row(row: &Row) {
    println!(
        "{:>2} {:>3} {:<9} {:<14} {:>9.1} {:>9.1} {:>6.2} {:>8.3} {:>8.3} {:>5}  {:?}",
        row.stages,
        row.micro_batches,
        row.schedule,
        format!("{:?}", row.balance),
        row.step_ms,
        row.sequential_ms,
        row.ratio_to_sequential,
        row.bubble_measured,
        row.bubble_theory,
        row.messages,
        row.peak_saved,
    );
}
