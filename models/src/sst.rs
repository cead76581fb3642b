//! The Stanford Sentiment Treebank (Socher et al., 2013) as SST-2 or SST-5: a reader for its
//! PTB-tree files, a Burn [`Dataset`], and a [`Batcher`] that tokenizes for BERT.

use std::path::{Path, PathBuf};

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::prelude::*;

use crate::bert::BertInput;
use crate::tokenizer::WordPieceTokenizer;

/// Why SST could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SstError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A line is not a well-formed labelled tree.
    #[error("{source_name}:{line}: {message}")]
    Parse {
        /// The file (or a name for in-memory text).
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

/// One SST sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SstItem {
    /// The sentence, leaves joined by spaces, PTB escapes undone.
    pub text: String,
    /// SST-2: 0 negative, 1 positive; SST-5: the root's label, 0 (very
    /// negative) to 4 (very positive).
    pub label: usize,
}

/// Which labels a sentence gets from its tree's root.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SstLabels {
    /// SST-2: neutral sentences (root 2) dropped, 0-1 negative (0), 3-4
    /// positive (1).
    #[default]
    Binary,
    /// SST-5: every sentence, the root's label 0-4 as its class.
    FineGrained,
}

impl SstLabels {
    /// The classes a classifier of these labels needs: 2 or 5.
    pub fn classes(self) -> usize {
        match self {
            Self::Binary => 2,
            Self::FineGrained => 5,
        }
    }

    /// The label of a sentence whose root is `root` (0-4); `None` where the
    /// sentence is dropped (SST-2's neutral ones).
    ///
    /// ```
    /// use pipetransformer_models::sst::SstLabels;
    ///
    /// assert_eq!(SstLabels::Binary.label(1), Some(0));
    /// assert_eq!(SstLabels::Binary.label(2), None);
    /// assert_eq!(SstLabels::Binary.label(4), Some(1));
    /// assert_eq!(SstLabels::FineGrained.label(2), Some(2));
    /// ```
    pub fn label(self, root: u8) -> Option<usize> {
        match (self, root) {
            (Self::FineGrained, 0..=4) => Some(root as usize),
            (Self::Binary, 0 | 1) => Some(0),
            (Self::Binary, 3 | 4) => Some(1),
            _ => None,
        }
    }

    /// Its name in messages: `SST-2` or `SST-5`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Binary => "SST-2",
            Self::FineGrained => "SST-5",
        }
    }
}

/// The splits shipped in PTB-tree format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SstSplit {
    /// `train.txt` (8544 sentences, 6920 in SST-2).
    Train,
    /// `dev.txt` (1101 sentences, 872 in SST-2).
    Dev,
}

impl SstSplit {
    /// The split's file name.
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Train => "train.txt",
            Self::Dev => "dev.txt",
        }
    }
}

/// The sentences of a split: SST-2's binary, neutral-free ones, or SST-5's.
///
/// Each line of `train.txt` / `dev.txt` is a tree such as
/// `(3 (2 It) (4 (4 (2 's) (4 great)) (2 .)))`; every node carries a
/// sentiment from 0 (very negative) to 4 (very positive), the root's being the
/// sentence's. SST-2 drops neutral sentences (root 2), calls 0-1 negative and
/// 3-4 positive, and takes the text as the leaves joined by spaces, with the
/// PTB escapes (`-LRB-`, `` `` ``, `\/`, ...) undone.
///
/// SST-5 ([`SstLabels::FineGrained`], the `*_labelled` constructors) keeps
/// every sentence, the root's label 0-4 as its class.
///
/// The data is not part of this repository; see the README for where to get it.
///
/// ```
/// use burn::data::dataset::Dataset;
/// use pipetransformer_models::sst::{SstDataset, SstItem, SstLabels};
///
/// let trees = "(4 (2 -LRB-) (4 (4 Great) (2 fun)) (2 -RRB-))\n\
///              (2 (2 It) (2 exists))\n\
///              (1 (2 I) (1 (1 did) (2 n't)))\n";
/// let sst = SstDataset::parse(trees, "inline")?;
/// assert_eq!(sst.len(), 2); // the neutral sentence is dropped
/// assert_eq!(sst.get(0), Some(SstItem { text: "( Great fun )".into(), label: 1 }));
/// assert_eq!(sst.get(1).unwrap().label, 0);
/// let sst5 = SstDataset::parse_labelled(trees, "inline", SstLabels::FineGrained)?;
/// assert_eq!(sst5.items().iter().map(|i| i.label).collect::<Vec<_>>(), [4, 2, 1]);
/// # Ok::<(), pipetransformer_models::sst::SstError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct SstDataset {
    items: Vec<SstItem>,
}

impl SstDataset {
    /// Reads a split of SST-2 from the directory holding `train.txt` and
    /// `dev.txt`.
    pub fn split(dir: impl AsRef<Path>, split: SstSplit) -> Result<Self, SstError> {
        Self::split_labelled(dir, split, SstLabels::Binary)
    }

    /// [`split`](Self::split) with `labels` (SST-2 or SST-5).
    pub fn split_labelled(
        dir: impl AsRef<Path>,
        split: SstSplit,
        labels: SstLabels,
    ) -> Result<Self, SstError> {
        Self::from_file_labelled(dir.as_ref().join(split.file_name()), labels)
    }

    /// Reads one PTB-tree file as SST-2.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, SstError> {
        Self::from_file_labelled(path, SstLabels::Binary)
    }

    /// [`from_file`](Self::from_file) with `labels` (SST-2 or SST-5).
    pub fn from_file_labelled(path: impl AsRef<Path>, labels: SstLabels) -> Result<Self, SstError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| SstError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse_labelled(&text, &path.display().to_string(), labels)
    }

    /// Parses PTB trees as SST-2, one per line (blank lines are skipped);
    /// `source_name` names the text in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, SstError> {
        Self::parse_labelled(text, source_name, SstLabels::Binary)
    }

    /// [`parse`](Self::parse) with `labels`: SST-2 drops the neutral
    /// sentences, SST-5 keeps every one.
    pub fn parse_labelled(
        text: &str,
        source_name: &str,
        labels: SstLabels,
    ) -> Result<Self, SstError> {
        let mut items = Vec::new();
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let (root, leaves) = parse_tree(line).map_err(|message| SstError::Parse {
                source_name: source_name.into(),
                line: index + 1,
                message,
            })?;
            let Some(label) = labels.label(root) else {
                continue;
            };
            let text = leaves
                .iter()
                .map(|leaf| unescape_ptb(leaf))
                .collect::<Vec<_>>()
                .join(" ");
            items.push(SstItem { text, label });
        }
        Ok(Self { items })
    }

    /// Keeps the first `n` sentences.
    pub fn take(mut self, n: usize) -> Self {
        self.items.truncate(n);
        self
    }

    /// All sentences.
    pub fn items(&self) -> &[SstItem] {
        &self.items
    }
}

impl From<Vec<SstItem>> for SstDataset {
    fn from(items: Vec<SstItem>) -> Self {
        Self { items }
    }
}

impl Dataset<SstItem> for SstDataset {
    fn get(&self, index: usize) -> Option<SstItem> {
        self.items.get(index).cloned()
    }

    fn len(&self) -> usize {
        self.items.len()
    }
}

/// Parses one labelled tree into its root label and its leaves, in order.
///
/// ```
/// use pipetransformer_models::sst::parse_tree;
///
/// let (root, leaves) = parse_tree("(3 (2 A) (3 (3 good) (2 film)))").unwrap();
/// assert_eq!((root, leaves), (3, vec!["A".to_string(), "good".into(), "film".into()]));
/// assert!(parse_tree("(3 (2 A)").unwrap_err().contains("unbalanced"));
/// ```
pub fn parse_tree(line: &str) -> Result<(u8, Vec<String>), String> {
    let bytes = line.trim().as_bytes();
    let mut parser = TreeParser {
        text: line.trim(),
        bytes,
        at: 0,
        leaves: Vec::new(),
    };
    let root = parser.node()?;
    parser.skip_spaces();
    if parser.at != bytes.len() {
        return Err(format!(
            "unexpected text after the tree at column {}",
            parser.at + 1
        ));
    }
    Ok((root, parser.leaves))
}

struct TreeParser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
    leaves: Vec<String>,
}

impl TreeParser<'_> {
    fn skip_spaces(&mut self) {
        while self.bytes.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), String> {
        match self.bytes.get(self.at) {
            Some(&b) if b == byte => {
                self.at += 1;
                Ok(())
            }
            Some(&b) => Err(format!(
                "expected `{}` at column {}, found `{}`",
                byte as char,
                self.at + 1,
                b as char
            )),
            None => Err(format!(
                "unbalanced tree: expected `{}` at the end",
                byte as char
            )),
        }
    }

    /// `( label (leaf | node+) )`; returns the label.
    fn node(&mut self) -> Result<u8, String> {
        self.skip_spaces();
        self.expect(b'(')?;
        let label = match self.bytes.get(self.at) {
            Some(digit @ b'0'..=b'4') => digit - b'0',
            _ => return Err(format!("expected a label 0-4 at column {}", self.at + 1)),
        };
        self.at += 1;
        self.skip_spaces();
        if self.bytes.get(self.at) == Some(&b'(') {
            while self.bytes.get(self.at) == Some(&b'(') {
                self.node()?;
                self.skip_spaces();
            }
        } else {
            let start = self.at;
            while self
                .bytes
                .get(self.at)
                .is_some_and(|b| !matches!(b, b'(' | b')') && !b.is_ascii_whitespace())
            {
                self.at += 1;
            }
            if start == self.at {
                return Err(format!("empty leaf at column {}", start + 1));
            }
            self.leaves.push(self.text[start..self.at].to_string());
            self.skip_spaces();
        }
        self.expect(b')')?;
        Ok(label)
    }
}

/// Undoes the Penn Treebank escapes of one token: brackets (`-LRB-` ...),
/// LaTeX-style quotes (`` `` `` and `''` to `"`, `` ` `` to `'`) and escaped
/// `\/` and `\*`.
///
/// ```
/// use pipetransformer_models::sst::unescape_ptb;
///
/// assert_eq!(unescape_ptb("-LRB-"), "(");
/// assert_eq!(unescape_ptb("``"), "\"");
/// assert_eq!(unescape_ptb("1\\/2"), "1/2");
/// assert_eq!(unescape_ptb("film"), "film");
/// ```
pub fn unescape_ptb(token: &str) -> String {
    match token {
        "-LRB-" => "(".into(),
        "-RRB-" => ")".into(),
        "-LSB-" => "[".into(),
        "-RSB-" => "]".into(),
        "-LCB-" => "{".into(),
        "-RCB-" => "}".into(),
        "``" | "''" => "\"".into(),
        "`" => "'".into(),
        _ => token.replace("\\/", "/").replace("\\*", "*"),
    }
}

/// A tokenized SST batch.
#[derive(Debug, Clone)]
pub struct SstBatch<B: Backend> {
    /// The sentences as BERT input.
    pub input: BertInput<B>,
    /// The items' labels, `[batch]`.
    pub labels: Tensor<B, 1, Int>,
}

/// Tokenizes [`SstItem`]s into [`SstBatch`]es for Burn's data loaders.
///
/// ```
/// use burn::backend::Flex;
/// use burn::data::dataloader::batcher::Batcher;
/// use pipetransformer_models::sst::{SstBatch, SstBatcher, SstItem};
/// use pipetransformer_models::tokenizer::WordPieceTokenizer;
///
/// let tokenizer = WordPieceTokenizer::from_vocab(&["[PAD]", "[UNK]", "[CLS]", "[SEP]", "good"])?;
/// let batcher = SstBatcher::new(tokenizer);
/// let items = vec![SstItem { text: "good good".into(), label: 1 }, SstItem { text: "bad".into(), label: 0 }];
/// let batch: SstBatch<Flex> = batcher.batch(items, &Default::default());
/// assert_eq!(batch.input.tokens.dims(), [2, 4]);
/// assert_eq!(batch.labels.into_data().iter::<i64>().collect::<Vec<_>>(), vec![1, 0]);
/// # Ok::<(), pipetransformer_models::tokenizer::TokenizerError>(())
/// ```
#[derive(Debug, Clone)]
pub struct SstBatcher {
    tokenizer: WordPieceTokenizer,
}

impl SstBatcher {
    /// A batcher with this tokenizer (set its maximum length and padding first).
    pub fn new(tokenizer: WordPieceTokenizer) -> Self {
        Self { tokenizer }
    }
}

impl<B: Backend> Batcher<B, SstItem, SstBatch<B>> for SstBatcher {
    /// # Panics
    /// When the tokenizer cannot encode the batch (a fixed padding shorter
    /// than a sentence without a maximum length).
    fn batch(&self, items: Vec<SstItem>, device: &B::Device) -> SstBatch<B> {
        let texts: Vec<&str> = items.iter().map(|item| item.text.as_str()).collect();
        let encoded = self
            .tokenizer
            .encode_batch(&texts)
            .unwrap_or_else(|error| panic!("cannot tokenize an SST batch: {error}"));
        let labels: Vec<i64> = items.iter().map(|item| item.label as i64).collect();
        SstBatch {
            input: encoded.to_input(device),
            labels: Tensor::from_data(TensorData::new(labels, [items.len()]), device),
        }
    }
}
