//! Bad input to the binaries: each case is refused before any work with a
//! one-line error that names the accepted range or the flag to set, and exit
//! code 2 (arguments) or 1 (data), never a panic, a crash or exit 0.

use std::process::Command;

/// (binary, arguments, exit code, a fragment the error names)
const CASES: &[(&str, &[&str], i32, &str)] = &[
    ("train", &["--batch-size", "0"], 2, "1..=4096"),
    ("train", &["--epochs", "0"], 2, "1..=1000"),
    ("train", &["--samples", "0"], 2, "1..=10000000"),
    ("train", &["--eval-samples", "0"], 2, "1..=1000000"),
    ("train", &["--devices", "0"], 2, "1..=64"),
    ("train", &["--devices", "65"], 2, "1..=64"),
    ("train", &["--stages", "0"], 2, "1..=64"),
    (
        "train",
        &["--stages", "5", "--devices", "4"],
        2,
        "at most one stage per device",
    ),
    ("train", &["--micro-batches", "0"], 2, "1..=4096"),
    ("train", &["--device-memory", "0"], 2, "0"),
    // Less than one unit's parameters, gradients and Adam's state: refused
    // before pretraining, naming the unit.
    (
        "train",
        &["--device-memory", "1000"],
        2,
        "unit 0 alone needs",
    ),
    ("train", &["--freeze-alpha", "2"], 2, "(0, 1)"),
    ("train", &["--freeze-alpha=-1"], 2, "(0, 1)"),
    ("train", &["--freeze-alpha", "nan"], 2, "(0, 1)"),
    ("train", &["--lr", "nan"], 2, "(0, 1]"),
    ("train", &["--lr", "0"], 2, "(0, 1]"),
    ("train", &["--layers", "0"], 2, "1..=48"),
    ("train", &["--hidden", "6"], 2, "multiple of 4"),
    (
        "train",
        &["--samples", "8", "--batch-size", "32"],
        2,
        "sample count",
    ),
    ("train", &["--batch-size", "8"], 2, "micro-batches"),
    ("train", &["--pretrain-batch-size", "0"], 2, "1..=4096"),
    ("train", &["--pretrain-lr", "0"], 2, "(0, 1]"),
    (
        "train",
        &[
            "--samples",
            "8",
            "--batch-size",
            "8",
            "--pretrain-batch-size",
            "32",
        ],
        2,
        "pretraining: the batch must be 1 to the sample count (8)",
    ),
    (
        "train",
        &["--plain", "--no-strongest"],
        2,
        "cannot be used with",
    ),
    ("train", &["--weights", "/nonexistent"], 2, "--data"),
    ("train", &["--data", "/nonexistent"], 2, "--weights"),
    (
        "train",
        &["--eval-file", "x.txt"],
        2,
        "--weights and --data",
    ),
    ("train", &["--sst", "sst5"], 2, "--weights and --data"),
    ("train", &["--sst", "sst3"], 2, "--sst"),
    (
        "train",
        &["--data", "/nonexistent", "--weights", "/nonexistent"],
        1,
        "/nonexistent",
    ),
    (
        "train",
        &[
            "--model",
            "vit",
            "--weights",
            "/nonexistent",
            "--data",
            "/nonexistent",
        ],
        2,
        "--model vit",
    ),
    // With --weights, BERT is the model (given or not): on to the data.
    (
        "train",
        &[
            "--model",
            "bert",
            "--weights",
            "/nonexistent",
            "--data",
            "/nonexistent",
        ],
        1,
        "/nonexistent",
    ),
    ("train", &["--max-length", "600"], 2, "8..=512"),
    // The ViT fine-tunes on its bands; the other tasks are BERT's.
    (
        "train",
        &["--model", "vit", "--task", "first-token"],
        2,
        "BERT's",
    ),
    ("train", &["--task", "first"], 2, "--task <TASK>"),
    (
        "train",
        &[
            "--task",
            "middle-majority",
            "--weights",
            "/nonexistent",
            "--data",
            "/nonexistent",
        ],
        2,
        "drop --task",
    ),
    ("bench", &["select-task", "--lr", "0"], 2, "(0, 1]"),
    ("bench", &["tasks", "--seeds", "1,1"], 2, "twice"),
    ("train", &["--backend", "cuda"], 2, "--features cuda"),
    ("sst2", &["--batch-size", "0"], 2, "1..=4096"),
    ("sst2", &["--max-length", "0"], 2, "3..=512"),
    ("sst2", &["--max-length", "600"], 2, "3..=512"),
    ("sst2", &["--epochs", "0"], 2, "1..=1000"),
    ("sst2", &["--max-train-samples", "0"], 2, "1.."),
    ("sst2", &["--max-dev-samples", "0"], 2, "1.."),
    ("sst2", &["--lr", "nan"], 2, "(0, 1]"),
    ("sst2", &["--weight-decay=-1"], 2, "[0, 1]"),
    (
        "sst2",
        &["--data", "/nonexistent"],
        1,
        "/nonexistent/train.txt",
    ),
];

fn binary(name: &str) -> &'static str {
    match name {
        "train" => env!("CARGO_BIN_EXE_train"),
        "sst2" => env!("CARGO_BIN_EXE_sst2"),
        "bench" => env!("CARGO_BIN_EXE_bench"),
        other => panic!("no binary {other}"),
    }
}

/// Runs `command` and checks that it was refused with exit `code` and a
/// one-line error naming `fragment`; returns its stdout.
fn assert_refused(command: &mut Command, what: &str, code: i32, fragment: &str) -> String {
    let output = command.env("RUST_LOG", "error").output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let first = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    assert_eq!(
        output.status.code(),
        Some(code),
        "{what}: exit {:?}, stderr:\n{stderr}",
        output.status.code()
    );
    assert!(
        first.starts_with("error:") && first.contains(fragment),
        "{what}: the first line does not name `{fragment}`:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{what} panicked:\n{stderr}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn bad_input_is_a_one_line_error_with_the_right_exit_code() {
    let out = std::env::temp_dir().join(format!("bad-input-{}", std::process::id()));
    for (name, args, code, fragment) in CASES {
        let mut command = Command::new(binary(name));
        command.args(*args);
        if *name == "train" {
            command.args(["--size", "ci", "--output-dir", out.to_str().unwrap()]);
        }
        assert_refused(&mut command, &format!("{name} {args:?}"), *code, fragment);
    }
    let _ = std::fs::remove_dir_all(out);
}

/// An `--output-dir` that cannot be written (here: below a plain file, which
/// refuses even root) is refused before any work, not after pretraining:
/// exit 1 like other paths the file system refuses (unreadable weights or
/// data), and nothing printed on stdout.
#[test]
fn unwritable_output_dir_is_refused_before_any_work() {
    let file = std::env::temp_dir().join(format!("bad-input-file-{}", std::process::id()));
    std::fs::write(&file, b"not a directory").unwrap();
    let out = file.join("out");
    let mut command = Command::new(binary("train"));
    command.args([
        "--size",
        "ci",
        "--pretrain-epochs",
        "1",
        "--epochs",
        "1",
        "--output-dir",
    ]);
    command.arg(&out);
    let stdout = assert_refused(
        &mut command,
        "train --output-dir <below a file>",
        1,
        "--output-dir",
    );
    let _ = std::fs::remove_file(&file);
    assert!(
        stdout.trim().is_empty(),
        "work began before the output directory was checked:\n{stdout}"
    );
}

/// Started by an MPI launcher as one of several processes (its environment
/// says so) but built without the cargo feature `mpi`: `train` and `bench`
/// refuse before any work, naming the feature, instead of running as N
/// independent jobs into the same output directory.
#[cfg(not(feature = "mpi"))]
#[test]
fn a_build_without_mpi_under_an_mpi_launcher_is_refused() {
    let out = std::env::temp_dir().join(format!("bad-input-mpi-{}", std::process::id()));
    for (var, value) in [("OMPI_COMM_WORLD_SIZE", "2"), ("PMI_SIZE", "4")] {
        let mut train = Command::new(binary("train"));
        train
            .args(["--size", "ci", "--output-dir", out.to_str().unwrap()])
            .env(var, value);
        let stdout = assert_refused(
            &mut train,
            &format!("train with {var}={value}"),
            2,
            "cargo feature `mpi`",
        );
        assert!(stdout.trim().is_empty(), "work began:\n{stdout}");
        let mut bench = Command::new(env!("CARGO_BIN_EXE_bench"));
        bench.args(["elastic", "--quick"]).env(var, value);
        assert_refused(
            &mut bench,
            &format!("bench with {var}={value}"),
            2,
            "cargo feature `mpi`",
        );
    }
    // One process under a launcher is a job of one: not refused here (the
    // flag check below refuses it, before any work).
    let mut one = Command::new(binary("train"));
    one.args(["--size", "ci", "--batch-size", "0"])
        .env("OMPI_COMM_WORLD_SIZE", "1");
    assert_refused(&mut one, "train with OMPI_COMM_WORLD_SIZE=1", 2, "1..=4096");
    let _ = std::fs::remove_dir_all(out);
}
