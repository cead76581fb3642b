//! Where benchmark results go: a JSON file under `target/bench/`.

use std::path::PathBuf;

use serde::Serialize;

/// A benchmark that could not run or could not save its results.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Writing the JSON report failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The report's path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The measured code failed.
    #[error("{0}")]
    Run(String),
}

/// Writes `value` as pretty JSON to `target/bench/<name>.json` (under
/// `CARGO_TARGET_DIR` when set) and returns the path.
pub fn write_report<T: Serialize>(name: &str, value: &T) -> Result<PathBuf, BenchError> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    let dir = target.join("bench");
    let path = dir.join(format!("{name}.json"));
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        let json = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
        std::fs::write(&path, json)
    };
    write().map_err(|source| BenchError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// The median of `values` (the upper one of an even count).
///
/// # Panics
/// When `values` is empty.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A benchmark's first line: `bench NAME (quick|full; backend B; DETAILS)`.
///
/// ```
/// let line = pipetransformer_harness::bench::title("pipe", true, "batch 8");
/// assert!(line.starts_with("bench pipe (quick; backend ") && line.ends_with("; batch 8)"));
/// ```
pub fn title(name: &str, quick: bool, details: &str) -> String {
    let size = if quick { "quick" } else { "full" };
    format!(
        "bench {name} ({size}; backend {}; {details})",
        pipetransformer_jobs::backend::NAME
    )
}
