//! Every binary answers `--version` with the package's version.

use std::process::Command;

#[test]
fn every_binary_has_a_version() {
    for binary in [
        env!("CARGO_BIN_EXE_plan"),
        env!("CARGO_BIN_EXE_train"),
        env!("CARGO_BIN_EXE_bench"),
        env!("CARGO_BIN_EXE_sst2"),
    ] {
        let out = Command::new(binary).arg("--version").output().unwrap();
        assert!(out.status.success(), "{binary}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(env!("CARGO_PKG_VERSION")), "{binary}: {text}");
    }
}
