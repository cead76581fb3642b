//! The Stanford Sentiment Treebank (Socher et al., 2013) as SST-2: a reader for its PTB-tree
//! files, a Burn [`Dataset`], and a [`Batcher`] that tokenizes for BERT.

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

/// One SST-2 sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SstItem {
    /// The sentence, leaves joined by spaces, PTB escapes undone.
    pub text: String,
    /// 0 negative, 1 positive.
    pub label: usize,
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

/// SST-2: the binary, neutral-free sentences of a split.
///
/// Each line of `train.txt` / `dev.txt` is a tree such as
/// `(3 (2 It) (4 (4 (2 's) (4 great)) (2 .)))`; every node carries a
/// sentiment from 0 (very negative) to 4 (very positive), the root's being the
/// sentence's. SST-2 drops neutral sentences (root 2), calls 0-1 negative and
/// 3-4 positive, and takes the text as the leaves joined by spaces, with the
/// PTB escapes (`-LRB-`, `` `` ``, `\/`, ...) undone.
///
/// The data is not part of this repository; see the README for where to get it.
///
/// ```
/// use burn::data::dataset::Dataset;
/// use pipetransformer_models::sst::{SstDataset, SstItem};
///
/// let trees = "(4 (2 -LRB-) (4 (4 Great) (2 fun)) (2 -RRB-))\n\
///              (2 (2 It) (2 exists))\n\
///              (1 (2 I) (1 (1 did) (2 n't)))\n";
/// let sst = SstDataset::parse(trees, "inline")?;
/// assert_eq!(sst.len(), 2); // the neutral sentence is dropped
/// assert_eq!(sst.get(0), Some(SstItem { text: "( Great fun )".into(), label: 1 }));
/// assert_eq!(sst.get(1).unwrap().label, 0);
/// # Ok::<(), pipetransformer_models::sst::SstError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct SstDataset {
    items: Vec<SstItem>,
}

impl SstDataset {
    /// Reads a split from the directory holding `train.txt` and `dev.txt`.
    pub fn split(dir: impl AsRef<Path>, split: SstSplit) -> Result<Self, SstError> {
        Self::from_file(dir.as_ref().join(split.file_name()))
    }

    /// Reads one PTB-tree file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, SstError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| SstError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses PTB trees, one per line (blank lines are skipped);
    /// `source_name` names the text in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, SstError> {
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
            let label = match root {
                0 | 1 => 0,
                3 | 4 => 1,
                _ => continue,
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

/// A tokenized SST-2 batch.
#[derive(Debug, Clone)]
pub struct SstBatch<B: Backend> {
    /// The sentences as BERT input.
    pub input: BertInput<B>,
    /// 0 negative, 1 positive, `[batch]`.
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
