//! `plan` from the outside: bad flags are one-line errors naming the range
//! (exit code 2), unreadable input exit code 1; the paper's
//! setting runs and prints its plan.

use std::process::{Command, Output};

fn plan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plan"))
        .args(args)
        .output()
        .expect("plan runs")
}

#[test]
fn bad_flags_are_one_line_errors_with_exit_code_2() {
    for (args, range) in [
        (vec!["--alpha", "1.5"], "(0, 1)"),
        (vec!["--alpha", "abc"], "expected a number"),
        (vec!["--nodes", "0"], "1..=65536"),
        (vec!["--devices-per-node", "5000"], "1..=4096"),
        (vec!["--intra-gbs", "-1"], "(0, 100000]"),
        (vec!["--bucket-mib", "-2"], "[0, 100000]"),
        (vec!["--epochs", "0"], "1..=10000"),
        (vec!["--stages", "40"], "stages must be in 1..=8"),
        (
            vec!["--scaling", "12"],
            "not a multiple of --devices-per-node 8",
        ),
        (vec!["--batch", "4"], "fewer than the 16 micro-batches"),
        (vec!["--cpu-cores", "0"], "(0, 1024] cores"),
        (vec!["--pass-parallelism", "2000"], "(0, 1024] cores"),
    ] {
        let out = plan(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(range), "{args:?}: {stderr}");
    }
}

#[test]
fn the_papers_setting_compresses_and_speeds_up() {
    let dir = std::env::temp_dir().join(format!("plan-cli-{}", std::process::id()));
    let out = plan(&["--epochs", "6", "--out-dir", dir.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("predicted speed-up"), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    let ks: Vec<u64> = json["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["stages"].as_u64().unwrap())
        .collect();
    assert_eq!(ks.first(), Some(&8));
    assert!(ks.windows(2).all(|w| w[1] <= w[0]), "{ks:?}");
    assert_eq!(ks.last(), Some(&1), "{ks:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn costs_round_trip_through_json() {
    let dir = std::env::temp_dir().join(format!("plan-costs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("costs.json");
    let out_dir = dir.to_str().unwrap();
    let first = plan(&[
        "--model",
        "minilm",
        "--nodes",
        "1",
        "--devices-per-node",
        "4",
        "--samples",
        "10000",
        "--epochs",
        "3",
        "--save-costs",
        file.to_str().unwrap(),
        "--out-dir",
        out_dir,
    ]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let second = plan(&[
        "--costs",
        file.to_str().unwrap(),
        "--nodes",
        "1",
        "--devices-per-node",
        "4",
        "--samples",
        "10000",
        "--epochs",
        "3",
        "--out-dir",
        out_dir,
    ]);
    assert!(second.status.success());
    let speedup = |o: &Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.contains("predicted speed-up"))
            .map(str::to_string)
    };
    assert_eq!(speedup(&first), speedup(&second));
    std::fs::write(&file, "{\"model\": 3}").unwrap();
    // Unreadable or wrong input is exit code 1 (bad flags are 2).
    let bad = plan(&["--costs", file.to_str().unwrap(), "--out-dir", out_dir]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not a cost file"));
    let missing = dir.join("missing.json");
    let bad = plan(&["--costs", missing.to_str().unwrap(), "--out-dir", out_dir]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("cannot read"));
    let _ = std::fs::remove_dir_all(dir);
}
