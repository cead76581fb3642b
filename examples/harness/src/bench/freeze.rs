//! `bench freeze`: frozen prefixes and AutoCache against the unfrozen step (issue: burn-freeze).

use std::time::Instant;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, Optimizer};
use burn::prelude::*;
use burn_freeze::{ActivationCache, CacheConfig, FreezableStack, IntoLayerStack, LayerMap};
use models::synthetic::BandImages;
use models::vit::VitConfig;
use serde::Serialize;

use super::{BenchError, alloc, median, title, write_report};
use burn_freeze::CacheHolder;
use burn_freeze::FreezeFront;
use pipetransformer_jobs::backend::{self, Train};

struct Preset {
    name: &'static str,
    config: VitConfig,
    batch: usize,
    batches: usize,
    passes: usize,
}

#[derive(Debug, Serialize)]
struct Row {
    preset: &'static str,
    layers: usize,
    frozen_layers: usize,
    frozen_units: usize,
    cache: bool,
    batch: usize,
    steps_timed: usize,
    step_ms: f64,
    step_ratio: f64,
    peak_mib: Option<f64>,
    peak_ratio: Option<f64>,
    cache_mib: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    backend: &'static str,
    quick: bool,
    rows: Vec<Row>,
}

struct Measured {
    step_s: f64,
    peak: usize,
    cache_bytes: usize,
    steps: usize,
}

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Run(e.to_string())
}

fn measure(preset: &Preset, frozen_layers: usize, cached: bool) -> Result<Measured, BenchError> {
    let device = backend::device(0);
    <Train as Backend>::seed(&device, 0);
    let config = &preset.config;
    let stack = config.init::<Train>(&device).into_layer_stack();
    let map = LayerMap::uniform(1, 2, config.layers, stack.num_units()).map_err(err)?;
    let mut stack = FreezableStack::new(stack);
    stack
        .freeze_to(map.unit_front(frozen_layers))
        .map_err(err)?;
    if cached {
        stack.attach_cache(ActivationCache::new(CacheConfig::new(usize::MAX / 2)).map_err(err)?);
    }
    let task = BandImages::new(config.num_classes, config.channels, config.image_size, 7);
    let data: Vec<_> = (0..preset.batches)
        .map(|b| {
            let (x, y) = task.batch::<Train>(b, preset.batch, &device);
            let ids: Vec<u64> = (0..preset.batch)
                .map(|i| (b * preset.batch + i) as u64)
                .collect();
            (x, y, ids)
        })
        .collect();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut optim = AdamConfig::new().init();
    let mut times = Vec::new();
    let mut peak = 0;
    // Pass 0 warms up (fills the cache, allocates Adam's state); the rest are timed.
    for pass in 0..=preset.passes {
        for (x, y, ids) in &data {
            let before = alloc::reset_peak();
            let start = Instant::now();
            let logits = if cached {
                stack.forward_cached(ids, x.clone()).map_err(err)?
            } else {
                stack.forward(x.clone())
            };
            let loss = loss_fn.forward(logits, y.clone());
            let grads = stack.gradients(loss.backward());
            stack.map_trainable(|active| optim.step(1e-4, active, grads));
            let _ = loss.into_scalar();
            if pass > 0 {
                times.push(start.elapsed().as_secs_f64());
                peak = peak.max(alloc::peak().saturating_sub(before));
            }
        }
    }
    let cache_bytes = stack.cache().map_or(0, |c| c.stats().memory_bytes);
    let steps = times.len();
    Ok(Measured {
        step_s: median(times),
        peak,
        cache_bytes,
        steps,
    })
}

/// The benchmark's models: a tiny ViT and ViT-B/16, with their batches.
fn presets(quick: bool) -> Vec<Preset> {
    if quick {
        vec![
            Preset {
                name: "vit-tiny",
                config: VitConfig::tiny(10),
                batch: 32,
                batches: 4,
                passes: 2,
            },
            Preset {
                name: "vit-b16",
                config: VitConfig::vit_b16(10),
                batch: 1,
                batches: 2,
                passes: 1,
            },
        ]
    } else {
        vec![
            Preset {
                name: "vit-tiny",
                config: VitConfig::tiny(10).with_layers(4),
                batch: 64,
                batches: 8,
                passes: 3,
            },
            Preset {
                name: "vit-b16",
                config: VitConfig::vit_b16(10),
                batch: 4,
                batches: 2,
                passes: 2,
            },
        ]
    }
}

/// Runs the freeze benchmark.
///
/// For ViT tiny and ViT-B/16, one training step (forward, backward, Adam)
/// with 0, L/2 and L of the L blocks frozen (the embedding freezes with block
/// 0; the final norm and head always train), each without and with the
/// activation cache. Cached steps are measured once every sample is cached
/// (a second pass over the data). Step time is the median step; peak memory
/// is the most heap allocated during a step above the level before it (the
/// cache's own storage, held across steps, is reported apart). Every figure
/// is also given as a ratio to the unfrozen, uncached step of the same preset
/// in the same run.
pub fn run(quick: bool) -> Result<(), BenchError> {
    let presets = presets(quick);
    let mut rows = Vec::new();
    let details = "ratios against F=0 without cache, same preset, same run";
    println!("{}", title("freeze", quick, details));
    println!(
        "{:<9} {:>6} {:>6} {:>5} {:>10} {:>7} {:>10} {:>7} {:>10}",
        "preset", "F/L", "units", "cache", "step ms", "ratio", "peak MiB", "ratio", "cache MiB"
    );
    for preset in &presets {
        let layers = preset.config.layers;
        let mut baseline: Option<Measured> = None;
        for frozen_layers in [0, layers / 2, layers] {
            for cached in [false, true] {
                let m = measure(preset, frozen_layers, cached)?;
                let base = baseline.get_or_insert(Measured { ..m });
                let row = row(preset, frozen_layers, cached, &m, base)?;
                print_row(&row);
                rows.push(row);
            }
        }
    }
    let path = write_report(
        "freeze",
        &Report {
            bench: "freeze",
            backend: backend::NAME,
            quick,
            rows,
        },
    )?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The row of `m`, measured with `frozen_layers` frozen (`cached`: through
/// the cache), against `base` (nothing frozen, no cache).
fn row(
    preset: &Preset,
    frozen_layers: usize,
    cached: bool,
    m: &Measured,
    base: &Measured,
) -> Result<Row, BenchError> {
    let layers = preset.config.layers;
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let peak_known = alloc::installed() && base.peak > 0;
    Ok(Row {
        preset: preset.name,
        layers,
        frozen_layers,
        frozen_units: LayerMap::uniform(1, 2, layers, preset.config.num_units())
            .map_err(err)?
            .unit_front(frozen_layers),
        cache: cached,
        batch: preset.batch,
        steps_timed: m.steps,
        step_ms: m.step_s * 1e3,
        step_ratio: m.step_s / base.step_s,
        peak_mib: peak_known.then(|| mib(m.peak)),
        peak_ratio: peak_known.then(|| m.peak as f64 / base.peak as f64),
        cache_mib: mib(m.cache_bytes),
    })
}

/// Prints one row of the table.
fn print_row(row: &Row) {
    let opt = |v: Option<f64>, p: usize| v.map_or("n/a".to_string(), |v| format!("{v:.p$}"));
    println!(
        "{:<9} {:>6} {:>6} {:>5} {:>10.1} {:>7.2} {:>10} {:>7} {:>10.2}",
        row.preset,
        format!("{}/{}", row.frozen_layers, row.layers),
        row.frozen_units,
        if row.cache { "yes" } else { "no" },
        row.step_ms,
        row.step_ratio,
        opt(row.peak_mib, 1),
        opt(row.peak_ratio, 2),
        row.cache_mib,
    );
}
