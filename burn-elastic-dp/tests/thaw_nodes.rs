//! The thaw across the ranks of an MPI job: two ranks of 4 logical devices
//! run the schedule of fronts that goes up and then down (0, 2, 3, 1, 2),
//! every part on; every rank thaws at the same step (the decision comes
//! from the policy, the same on every rank), the per-step shape check
//! passes, the ranks end bit for bit identical and within 1e-6 of plain
//! Burn in one process with the same fronts applied by hand on the same
//! global batches.
//!
//! The test binary runs itself under `mpirun` as the ranks: the variable
//! `THAW_ROLE` makes it a rank. Without `mpirun` on PATH the test fails with
//! the line that installs it.

#![cfg(feature = "mpi")]

use std::path::PathBuf;
use std::time::Duration;

use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::{Mpi, NodeConfig};

mod common;

use common::thaw::{FRONTS, Recording, UNITS, WIDTH, config, dataset, plain, worst};
use common::{B, block_stack, finish, flat_weights, from_bytes, loss, mpirun, to_bytes};

const ROLE: &str = "THAW_ROLE";
const OUT: &str = "THAW_OUT";
const TEST: &str = "two_ranks_thaw_in_lockstep_and_train_as_plain_burn";

/// One rank: the schedule on 4 devices across the job; writes its weights,
/// its `(K, total R, front)` by epoch and the samples of each of its steps.
fn rank() {
    let mpi = Mpi::init().unwrap();
    let out = PathBuf::from(std::env::var(OUT).unwrap());
    let config = config();
    let replicas = config
        .replicas
        .clone()
        .with_timeout_ms(60_000)
        .with_nodes(Some(NodeConfig::new()));
    let device: Device<B> = Default::default();
    let mut trainer = config
        .with_replicas(replicas)
        .init(
            block_stack(UNITS, WIDTH),
            vec![device; 4],
            || AdamConfig::new().init(),
            loss,
        )
        .unwrap();
    let data = dataset();
    let batcher = Recording::default();
    let mut batches = Vec::new();
    let mut shapes = Vec::new();
    for _ in 0..FRONTS.len() {
        let report = trainer.fit_epoch(&data, &batcher).unwrap();
        batches.push(std::mem::take(&mut *batcher.batches.lock().unwrap()));
        shapes.push((report.stages, report.total_replicas, report.front));
    }
    let rank = mpi.rank();
    let weights = to_bytes(&flat_weights(&trainer.to_layer_stack().unwrap()));
    std::fs::write(out.join(format!("weights-{rank}")), weights).unwrap();
    std::fs::write(out.join(format!("shapes-{rank}")), format!("{shapes:?}")).unwrap();
    let batches = serde_json::to_string(&batches).unwrap();
    std::fs::write(out.join(format!("batches-{rank}")), batches).unwrap();
}

fn read(out: &std::path::Path, name: &str) -> Vec<u8> {
    let path = out.join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn two_ranks_thaw_in_lockstep_and_train_as_plain_burn() {
    if std::env::var(ROLE).is_ok() {
        return rank();
    }
    let out =
        std::env::temp_dir().join(format!("burn-elastic-dp-thaw-nodes-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let vars = [(ROLE, "rank".to_string()), (OUT, out.display().to_string())];
    let (status, stderr) = finish(mpirun(TEST, 2, false, &vars), Duration::from_secs(600));
    assert!(
        status.is_some_and(|s| s.success()),
        "the MPI job failed ({status:?}):\n{stderr}"
    );
    // Per rank: K, the job's replicas and the front by epoch; the thaw
    // (front 3 -> 1 after epoch 2) takes K back to 4 on both at once.
    let expected = vec![(4, 2, 2), (2, 4, 3), (2, 4, 1), (4, 2, 2), (2, 4, 2)];
    for rank in 0..2 {
        let shapes = String::from_utf8(read(&out, &format!("shapes-{rank}"))).unwrap();
        assert_eq!(shapes, format!("{expected:?}"), "rank {rank}");
    }
    let weights = [read(&out, "weights-0"), read(&out, "weights-1")];
    assert_eq!(weights[0], weights[1], "the ranks' weights differ");
    // The global batch of each step: the samples both ranks ran.
    let batches: Vec<Vec<Vec<Vec<usize>>>> = (0..2)
        .map(|r| serde_json::from_slice(&read(&out, &format!("batches-{r}"))).unwrap())
        .collect();
    let global: Vec<Vec<Vec<usize>>> = batches[0]
        .iter()
        .zip(&batches[1])
        .map(|(a, b)| {
            assert_eq!(a.len(), b.len(), "the ranks ran as many steps");
            a.iter()
                .zip(b)
                .map(|(a, b)| {
                    let mut step: Vec<usize> = a.iter().chain(b).copied().collect();
                    step.sort_unstable();
                    step.dedup();
                    step
                })
                .collect()
        })
        .collect();
    for (epoch, steps) in global.iter().enumerate() {
        let mut seen: Vec<usize> = steps.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..64).collect::<Vec<_>>(),
            "epoch {epoch}: every sample once"
        );
    }
    let (expected, _) = plain(&global);
    let ranks = from_bytes(&weights[0]);
    let diff = worst(&ranks, &expected);
    println!("thaw schedule {FRONTS:?} on 2 ranks x 4 devices against plain Burn: {diff:e}");
    assert!(diff <= 1e-6, "two ranks and plain Burn differ by {diff}");
    let _ = std::fs::remove_dir_all(&out);
}
