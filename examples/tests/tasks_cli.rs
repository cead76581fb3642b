//! `bench tasks`: flags that cannot work are refused before any work with a
//! one-line error and exit 2; the full run without MiniLM or SST refuses
//! its SST tasks with exit 1, naming the missing files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bench(args: &[&str], target: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .env("RUST_LOG", "error")
        .env_remove("MINILM_DIR")
        .env("CARGO_TARGET_DIR", target)
        .output()
        .unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bench-tasks-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Refused with `code`, the error starting with `error:` and naming
/// `fragment` (on its one line where `one_line`: clap's own parse errors
/// add its usage hint); nothing on stdout, nothing written.
fn assert_refused(output: &Output, code: i32, fragment: &str, target: &Path, one_line: bool) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "stderr:\n{stderr}");
    assert!(stderr.starts_with("error:"), "stderr: {stderr}");
    if one_line {
        assert_eq!(stderr.trim().lines().count(), 1, "not one line: {stderr}");
    }
    assert!(stderr.contains(fragment), "`{fragment}` not in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        String::from_utf8_lossy(&output.stdout).trim().is_empty(),
        "work began: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(!target.join("bench").exists(), "something was written");
}

#[test]
fn bad_seeds_and_tasks_are_refused_on_one_line_with_exit_2() {
    let target = scratch("flags");
    for (args, fragment) in [
        (&["tasks", "--seeds", "0,0"][..], "seed 0 twice"),
        (
            &["tasks", "--quick", "--seeds", "1,2,1"][..],
            "seed 1 twice",
        ),
        (
            &["tasks", "--seeds", "1,2,3,4,5,6,7,8,9,10,11"][..],
            "1 to 10",
        ),
        (&["tasks", "--tasks", "same,sst2,same"][..], "same twice"),
        (&["select-task", "--seeds", "3,3"][..], "seed 3 twice"),
    ] {
        let output = bench(args, &target);
        assert_refused(&output, 2, fragment, &target, true);
    }
    let _ = std::fs::remove_dir_all(target);
}

#[test]
fn values_clap_cannot_parse_are_usage_errors() {
    let target = scratch("parse");
    for (args, fragment) in [
        (&["tasks", "--seeds", "one"][..], "--seeds"),
        (&["tasks", "--tasks", "sst7"][..], "sst7"),
        // select-task's candidates are not the suite's tasks.
        (&["tasks", "--tasks", "first-token"][..], "first-token"),
        (&["tasks", "--lr", "1e-4"][..], "--lr"),
        (&["select-task", "--lr", "0"][..], "(0, 1]"),
    ] {
        let output = bench(args, &target);
        assert_refused(&output, 2, fragment, &target, false);
    }
    let _ = std::fs::remove_dir_all(target);
}

#[test]
fn the_full_run_without_minilm_refuses_its_sst_tasks_naming_the_files() {
    let target = scratch("missing");
    let output = bench(
        &[
            "tasks",
            "--tasks",
            "same,sst5",
            "--weights",
            "/nonexistent/minilm",
            "--data",
            "/nonexistent/sst",
        ],
        &target,
    );
    assert_refused(
        &output,
        1,
        "/nonexistent/minilm/model.safetensors",
        &target,
        true,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    for fragment in [
        "/nonexistent/sst/train.txt",
        "the SST tasks need",
        "--tasks",
    ] {
        assert!(stderr.contains(fragment), "`{fragment}` not in: {stderr}");
    }
    let _ = std::fs::remove_dir_all(target);
}

#[test]
fn the_quick_run_without_minilm_skips_its_sst_tasks_and_says_why() {
    let target = scratch("skip");
    let output = bench(
        &[
            "tasks",
            "--quick",
            "--tasks",
            "sst2,sst5",
            "--weights",
            "/nonexistent/minilm",
        ],
        &target,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for fragment in ["skipping sst2", "skipping sst5", "/nonexistent/minilm"] {
        assert!(stdout.contains(fragment), "`{fragment}` not in: {stdout}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(target.join("bench/tasks.json")).unwrap())
            .unwrap();
    assert_eq!(json["tasks"].as_array().unwrap().len(), 0);
    assert_eq!(json["skipped"].as_array().unwrap().len(), 2);
    let _ = std::fs::remove_dir_all(target);
}
