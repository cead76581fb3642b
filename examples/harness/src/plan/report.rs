//! The tables `plan` prints.

use burn_elastic_dp::plan::{EpochPlan, EpochTime, Plan};

use super::calibrate::Calibrated;

/// Seconds in a short human unit.
pub fn human(seconds: f64) -> String {
    if seconds >= 3600.0 {
        format!("{:.2}h", seconds / 3600.0)
    } else if seconds >= 60.0 {
        format!("{:.1}m", seconds / 60.0)
    } else if seconds >= 1.0 {
        format!("{seconds:.2}s")
    } else {
        format!("{:.2}ms", seconds * 1e3)
    }
}

/// One line per epoch: F, K, R, M, boundaries and the time split.
pub fn print_epochs(title: &str, epochs: &[EpochPlan]) {
    println!("{title}");
    println!(
        "{:>5} {:>3} {:>6} {:>5} {:>3} {:>5} {:>3} {:>6}  {:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "epoch",
        "F",
        "units",
        "cache",
        "K",
        "R",
        "M",
        "bubble",
        "stage boundaries",
        "compute",
        "bubble",
        "allreduce",
        "transit.",
        "epoch",
        "step"
    );
    for e in epochs {
        let t = &e.time;
        println!(
            "{:>5} {:>3} {:>6} {:>5} {:>3} {:>5} {:>3} {:>6.3}  {:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            e.epoch,
            e.frozen_layers,
            e.front,
            if e.cached { "yes" } else { "no" },
            e.stages,
            e.replicas,
            e.micro_batches,
            e.bubble_fraction,
            format!("{:?}", e.balance),
            human(t.steps.compute),
            human(t.steps.bubble),
            human(t.steps.all_reduce),
            human(t.transition),
            human(t.total()),
            human(e.step.total()),
        );
    }
}

/// Totals split by kind.
pub fn split(t: &EpochTime) -> String {
    format!(
        "compute {} + bubble {} + all-reduce {} (exposed, of {}) + transitions {} = {}",
        human(t.steps.compute),
        human(t.steps.bubble),
        human(t.steps.all_reduce),
        human(t.steps.exchange),
        human(t.transition),
        human(t.total())
    )
}

/// The whole run against the baseline.
pub fn print_summary(plan: &Plan) {
    println!("PipeTransformer: {}", split(&plan.breakdown()));
    println!("baseline:        {}", split(&plan.baseline_breakdown()));
    println!(
        "predicted speed-up over the baseline (pipeline + data parallel, nothing frozen): {:.2}x",
        plan.speedup()
    );
}

/// A calibration table; returns the largest absolute error.
pub fn print_calibration(title: &str, rows: &[Calibrated]) -> f64 {
    println!("{title}");
    println!(
        "{:<40} {:>12} {:>12} {:>8}",
        "", "predicted", "measured", "error"
    );
    let mut worst: f64 = 0.0;
    for r in rows {
        worst = worst.max(r.error().abs());
        println!(
            "{:<40} {:>12} {:>12} {:>+7.1}%",
            r.label,
            human(r.predicted),
            human(r.measured),
            100.0 * r.error()
        );
    }
    let mean = rows.iter().map(|r| r.error().abs()).sum::<f64>() / rows.len().max(1) as f64;
    let within = rows.iter().filter(|r| r.error().abs() <= 0.15).count();
    println!(
        "mean |error| {:.1}%, largest {:.1}%, {within} of {} within 15%",
        100.0 * mean,
        100.0 * worst,
        rows.len()
    );
    worst
}

/// The sharing probe: seconds per pass of the whole model, alone and with
/// copies running at once, and what they imply.
pub fn print_sharing(rows: &[super::sharing::Sharing], cores: f64) {
    println!(
        "how passes share this CPU (whole model, forward + backward, ms per pass; p: cores one pass takes alone):"
    );
    println!(
        "{:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>6}",
        "batch", "main", "spawned", "fresh", "2 at once", "4 at once", "2/alone", "4/alone", "p"
    );
    for r in rows {
        println!(
            "{:>6} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8.2} {:>8.2} {:>6.2}",
            r.batch,
            r.main * 1e3,
            r.spawned * 1e3,
            r.fresh * 1e3,
            r.two * 1e3,
            r.four * 1e3,
            r.two / r.spawned,
            r.four / r.spawned,
            r.parallelism(cores)
        );
    }
}
