//! The SST reader: SST-2 counts of the real splits, PTB escapes undone,
//! malformed trees reported by line.

use std::path::{Path, PathBuf};

use burn::data::dataset::Dataset;
use pipetransformer_models::sst::{SstDataset, SstError, SstLabels, SstSplit};

/// `SST_DIR`, or `../shared/data/sst` beside the repository; the test that
/// calls this is `#[ignore]`d unless run with `--ignored`, and then the files
/// must be there.
fn sst_dir() -> PathBuf {
    let dir = std::env::var_os("SST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/sst"));
    assert!(
        dir.join("train.txt").is_file(),
        "no SST train.txt in {} (set SST_DIR; see the README)",
        dir.display()
    );
    dir
}

#[test]
#[ignore = "needs the SST trees (../shared/data/sst or SST_DIR); run with --ignored"]
fn sst5_keeps_every_sentence_with_its_root_label() {
    let dir = sst_dir();
    let train = SstDataset::split_labelled(&dir, SstSplit::Train, SstLabels::FineGrained).unwrap();
    let mut counts = [0usize; 5];
    for item in train.iter() {
        counts[item.label] += 1;
    }
    // The data's README: 1092, 2218, 1624, 2322, 1288 of labels 0..4.
    assert_eq!(counts, [1092, 2218, 1624, 2322, 1288]);
    let dev = SstDataset::split_labelled(&dir, SstSplit::Dev, SstLabels::FineGrained).unwrap();
    assert_eq!(dev.len(), 1101);
}

#[test]
#[ignore = "needs the SST trees (../shared/data/sst or SST_DIR); run with --ignored"]
fn sst2_splits_have_the_published_sizes_and_balance() {
    let dir = sst_dir();
    for (split, sentences, positive) in [(SstSplit::Train, 6920, 3610), (SstSplit::Dev, 872, 444)] {
        let sst = SstDataset::split(&dir, split).unwrap();
        assert_eq!(sst.len(), sentences, "{split:?}");
        let positives = sst.iter().filter(|item| item.label == 1).count();
        assert_eq!(positives, positive, "{split:?}");
        for item in sst.iter() {
            assert!(
                !item.text.contains("-LRB-")
                    && !item.text.contains("``")
                    && !item.text.contains("\\/"),
                "escape left in {:?}",
                item.text
            );
        }
    }
    let train = SstDataset::split(&dir, SstSplit::Train).unwrap();
    assert!(
        train.iter().any(|item| item.text.contains('(')),
        "-LRB- became ("
    );
}

#[test]
fn a_malformed_tree_is_reported_with_its_line() {
    let text = "(3 (2 fine) (3 film))\n(4 (2 broken\n";
    match SstDataset::parse(text, "trees.txt").unwrap_err() {
        SstError::Parse {
            source_name,
            line,
            message,
        } => {
            assert_eq!((source_name.as_str(), line), ("trees.txt", 2));
            assert!(message.contains("unbalanced"), "{message}");
        }
        other => panic!("expected a parse error, got {other}"),
    }
    let error = SstDataset::parse("(7 (2 x))", "t").unwrap_err();
    assert!(error.to_string().contains("label 0-4"), "{error}");
    let error = SstDataset::from_file("no/such/dev.txt").unwrap_err();
    assert!(matches!(error, SstError::Io { .. }) && error.to_string().contains("no/such/dev.txt"));
}
