//! `train --resume` as a user runs it: on a finished run it says so and
//! exits 0 with no NaN figure, with more `--epochs` it trains on, and on
//! fewer devices it trains on (R derived again) instead of panicking.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn train(dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_train"))
        .args(["--size", "ci", "--no-baseline", "--checkpoint-every", "2"])
        .arg("--output-dir")
        .arg(dir)
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .expect("train runs")
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pipetransformer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn resume_says_a_finished_run_is_finished_trains_on_with_more_epochs_and_on_fewer_devices() {
    let dir = fresh_dir("resume-cli");
    let first = train(&dir, &[]);
    let (stdout, stderr) = text(&first);
    assert!(first.status.success(), "{stdout}\n{stderr}");

    // The run had finished its 3 epochs: said so, exit 0, no NaN.
    let again = train(&dir, &["--resume"]);
    let (stdout, stderr) = text(&again);
    assert_eq!(again.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("nothing left to train"), "{stdout}");
    assert!(!stdout.contains("NaN"), "{stdout}");

    // Two more epochs, on 2 devices instead of 4: the run goes on.
    let more = train(&dir, &["--resume", "--epochs", "5", "--devices", "2"]);
    let (stdout, stderr) = text(&more);
    assert_eq!(more.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(!stdout.contains("nothing left to train"), "{stdout}");
    assert!(!stdout.contains("NaN"), "{stdout}");
    assert!(stdout.contains("epoch 4"), "the fifth epoch ran: {stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}
