//! Model presets for `plan`: each unit's parameters, activations and forward
//! FLOPs from the model's configuration, and costs from FLOPs.

use burn_elastic_dp::LayerSpec;
use burn_elastic_dp::plan::{ModelSpec, UnitSpec};
use clap::ValueEnum;
use models::bert::BertConfig;
use models::vit::VitConfig;

/// For each of `$batches`, `$body` with `$stack` the layer stack of the
/// model of `$shape` (a [`Shape`]; fresh weights), `$input` a batch of
/// `$batch` samples of its synthetic task (ViT: band images, BERT:
/// majority tokens; seed 7) and `$device` the first device; the results in
/// a `Vec`. A macro: the two models' stacks are of different types.
macro_rules! on_each_batch {
    ($shape:expr, $batches:expr, |$stack:ident, $input:ident, $device:ident, $batch:ident| $body:expr) => {{
        use burn_freeze::IntoLayerStack as _;
        use pipetransformer_jobs::backend::Train;
        let $device = pipetransformer_jobs::backend::device(0);
        match $shape {
            $crate::plan::presets::Shape::Vit(config) => {
                let $stack = config.init::<Train>(&$device).into_layer_stack();
                let task = models::synthetic::BandImages::new(
                    config.num_classes,
                    config.channels,
                    config.image_size,
                    7,
                );
                on_each_batch!(@each task, $batches, |$input, $device, $batch| $body)
            }
            $crate::plan::presets::Shape::Bert(config, seq) => {
                let $stack = config.init::<Train>(&$device).into_layer_stack();
                let task = models::synthetic::MajorityTokens::new(config.vocab_size, *seq, *seq, 7);
                on_each_batch!(@each task, $batches, |$input, $device, $batch| $body)
            }
        }
    }};
    // `$body` on a batch of `$task` for each of `$batches`.
    (@each $task:ident, $batches:expr, |$input:ident, $device:ident, $batch:ident| $body:expr) => {
        $batches
            .iter()
            .map(|&$batch: &usize| {
                let $input = $task.batch::<Train>(0, $batch, &$device).0;
                $body
            })
            .collect::<Vec<_>>()
    };
}
pub(crate) use on_each_batch;

/// The models `plan` knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// ViT-B/16: 224 px, 16 px patches, 12 blocks of 768, 1000 classes (27 units).
    VitB16,
    /// ViT-L/16: 224 px, 24 blocks of 1024, 1000 classes (51 units).
    VitL16,
    /// BERT-base: 12 blocks of 768, sequences of 512 tokens (26 units).
    BertBase,
    /// BERT-large: 24 blocks of 1024, sequences of 384 tokens (SQuAD; 50 units).
    BertLarge,
    /// MiniLM-L6-H384 (all-MiniLM-L6-v2's shape), sequences of 128 tokens.
    Minilm,
    /// The main job's tiny ViT (16 px, 4 px patches, width 32, 4 classes).
    VitTiny,
    /// The main job's tiny BERT (vocabulary 64, width 32, sequences of 15).
    BertTiny,
    /// `bench pipe --quick`'s ViT (32 px, width 96, 3 blocks, 10 classes).
    VitBenchQuick,
}

/// A model's shape: what the cost estimates are worked out from.
#[derive(Debug, Clone)]
pub enum Shape {
    /// A ViT.
    Vit(VitConfig),
    /// A BERT and its sequence length.
    Bert(BertConfig, usize),
}

/// One unit, worked out from the shape.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitShape {
    /// Its name.
    pub name: String,
    /// Element count of each parameter tensor, in the module's order.
    pub tensors: Vec<usize>,
    /// Forward FLOPs per sample (a multiply-add is 2).
    pub forward_flops: f64,
    /// Elements of its output per sample.
    pub output_elems: usize,
}

impl Preset {
    /// The preset's shape with `layers` blocks (`None`: its own count).
    pub fn shape(self, layers: Option<usize>) -> Shape {
        let shape = match self {
            Preset::VitB16 => Shape::Vit(VitConfig::vit_b16(1000)),
            Preset::VitL16 => Shape::Vit(
                VitConfig::vit_b16(1000)
                    .with_hidden(1024)
                    .with_layers(24)
                    .with_heads(16)
                    .with_mlp_dim(4096),
            ),
            Preset::BertBase => Shape::Bert(BertConfig::base(2), 512),
            Preset::BertLarge => Shape::Bert(
                BertConfig::base(2)
                    .with_hidden(1024)
                    .with_layers(24)
                    .with_heads(16)
                    .with_intermediate(4096),
                384,
            ),
            Preset::Minilm => Shape::Bert(BertConfig::minilm_l6_h384(2), 128),
            Preset::VitTiny => Shape::Vit(VitConfig::tiny(4).with_layers(4)),
            Preset::BertTiny => Shape::Bert(BertConfig::tiny(2).with_layers(4), 15),
            Preset::VitBenchQuick => Shape::Vit(crate::bench::pipe::model_config(true).0),
        };
        match (shape, layers) {
            (Shape::Vit(c), Some(l)) => Shape::Vit(c.with_layers(l)),
            (Shape::Bert(c, s), Some(l)) => Shape::Bert(c.with_layers(l), s),
            (shape, None) => shape,
        }
    }
}

impl Shape {
    /// Transformer blocks (the layers the freeze schedule counts).
    pub fn layers(&self) -> usize {
        match self {
            Shape::Vit(c) => c.layers,
            Shape::Bert(c, _) => c.layers,
        }
    }

    /// How the units make the layers the freeze rule counts: the embedding
    /// first, then two units (attention, MLP) per block, as the main job
    /// configures the trainer.
    pub fn layer_spec(&self) -> LayerSpec {
        LayerSpec::Uniform {
            offset: 1,
            per_layer: 2,
            layers: self.layers(),
        }
    }

    /// A one-line description.
    pub fn describe(&self) -> String {
        match self {
            Shape::Vit(c) => format!(
                "ViT {}px/{} hidden {} mlp {} layers {} classes {} ({} units)",
                c.image_size,
                c.patch_size,
                c.hidden,
                c.mlp_dim,
                c.layers,
                c.num_classes,
                c.num_units()
            ),
            Shape::Bert(c, s) => format!(
                "BERT hidden {} intermediate {} layers {} sequence {s} ({} units)",
                c.hidden,
                c.intermediate,
                c.layers,
                c.num_units()
            ),
        }
    }

    /// Every unit, first to last, as `models` builds them.
    pub fn units(&self) -> Vec<UnitShape> {
        match self {
            Shape::Vit(c) => vit_units(c),
            Shape::Bert(c, s) => bert_units(c, *s),
        }
    }

    /// Costs from FLOPs at `flops_per_second` (backward twice the forward),
    /// activations of `bytes_per_elem` bytes.
    pub fn analytic_costs(&self, flops_per_second: f64, bytes_per_elem: usize) -> ModelSpec {
        let units = self
            .units()
            .into_iter()
            .map(|u| {
                let forward = u.forward_flops / flops_per_second;
                UnitSpec {
                    name: u.name,
                    forward,
                    backward: 2.0 * forward,
                    forward_fixed: 0.0,
                    backward_fixed: 0.0,
                    measured: Vec::new(),
                    activation_bytes: u.output_elems * bytes_per_elem,
                    saved_bytes: 0,
                    param_tensors: u.tensors.iter().map(|n| n * bytes_per_elem).collect(),
                }
            })
            .collect();
        ModelSpec {
            model: self.describe(),
            source: format!(
                "analytic: forward FLOPs at {:.2} TFLOP/s, backward = 2 x forward, {bytes_per_elem}-byte values",
                flops_per_second / 1e12
            ),
            layers: self.layer_spec(),
            units,
        }
    }
}

/// Where an attention unit's layer norm sits: before the attention (ViT's
/// pre-norm blocks) or after the residual sum (BERT's post-norm blocks).
#[derive(Clone, Copy)]
enum Norm {
    Before,
    After,
}

/// Attention unit `layer` over `t` tokens of width `h`: its layer norm and
/// the query, key, value and output projections (weight and bias each);
/// FLOPs of the four projections, the scores and their weighted sum.
fn attention_unit(layer: usize, t: usize, h: usize, norm: Norm) -> UnitShape {
    let projections = [h * h, h].repeat(4);
    let tensors = match norm {
        Norm::Before => [vec![h, h], projections].concat(),
        Norm::After => [projections, vec![h, h]].concat(),
    };
    let (tf, hf) = (t as f64, h as f64);
    UnitShape {
        name: format!("attention {layer}"),
        tensors,
        forward_flops: 2.0 * tf * 4.0 * hf * hf + 2.0 * 2.0 * tf * tf * hf,
        output_elems: t * h,
    }
}

fn vit_units(c: &VitConfig) -> Vec<UnitShape> {
    let (h, t) = (c.hidden, c.num_patches() + 1);
    let patch = c.channels * c.patch_size * c.patch_size;
    let mut units = vec![UnitShape {
        name: "embedding".into(),
        tensors: vec![h * patch, h, h, t * h],
        forward_flops: 2.0 * (c.num_patches() * patch * h) as f64,
        output_elems: t * h,
    }];
    for l in 0..c.layers {
        units.push(attention_unit(l, t, h, Norm::Before));
        units.push(UnitShape {
            name: format!("mlp {l}"),
            tensors: vec![h, h, h * c.mlp_dim, c.mlp_dim, c.mlp_dim * h, h],
            forward_flops: 2.0 * 2.0 * (t * h * c.mlp_dim) as f64,
            output_elems: t * h,
        });
    }
    units.push(UnitShape {
        name: "norm".into(),
        tensors: vec![h, h],
        forward_flops: 8.0 * (t * h) as f64,
        output_elems: t * h,
    });
    units.push(UnitShape {
        name: "head".into(),
        tensors: vec![h * c.num_classes, c.num_classes],
        forward_flops: 2.0 * (h * c.num_classes) as f64,
        output_elems: c.num_classes,
    });
    units
}

fn bert_units(c: &BertConfig, s: usize) -> Vec<UnitShape> {
    let h = c.hidden;
    let mut units = vec![UnitShape {
        name: "embeddings".into(),
        tensors: vec![
            c.vocab_size * h,
            c.max_position * h,
            c.type_vocab_size * h,
            h,
            h,
        ],
        forward_flops: 12.0 * (s * h) as f64,
        output_elems: s * h,
    }];
    for l in 0..c.layers {
        units.push(attention_unit(l, s, h, Norm::After));
        units.push(UnitShape {
            name: format!("feed-forward {l}"),
            tensors: vec![
                h * c.intermediate,
                c.intermediate,
                c.intermediate * h,
                h,
                h,
                h,
            ],
            forward_flops: 2.0 * 2.0 * (s * h * c.intermediate) as f64,
            output_elems: s * h,
        });
    }
    units.push(UnitShape {
        name: "head".into(),
        tensors: vec![h * h, h, h * c.num_classes, c.num_classes],
        forward_flops: 2.0 * (h * h + h * c.num_classes) as f64,
        output_elems: c.num_classes,
    });
    units
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_freeze::IntoLayerStack;

    type B = pipetransformer_jobs::backend::Train;

    /// The worked-out parameter counts are the models' own, unit by unit.
    #[test]
    fn unit_tensors_match_the_models() {
        let device = pipetransformer_jobs::backend::device(0);
        for preset in [Preset::VitTiny, Preset::VitBenchQuick] {
            let Shape::Vit(config) = preset.shape(None) else {
                unreachable!()
            };
            let stack = config.init::<B>(&device).into_layer_stack();
            let ours: Vec<usize> = preset
                .shape(None)
                .units()
                .iter()
                .map(|u| u.tensors.iter().sum())
                .collect();
            assert_eq!(ours, stack.unit_params(), "{preset:?}");
        }
        let Shape::Bert(config, _) = Preset::BertTiny.shape(None) else {
            unreachable!()
        };
        let stack = config.init::<B>(&device).into_layer_stack();
        let ours: Vec<usize> = Preset::BertTiny
            .shape(None)
            .units()
            .iter()
            .map(|u| u.tensors.iter().sum())
            .collect();
        assert_eq!(ours, stack.unit_params());
    }

    #[test]
    fn vit_b16_has_27_units_and_86_million_parameters() {
        let units = Preset::VitB16.shape(None).units();
        assert_eq!(units.len(), 27);
        let params: usize = units.iter().flat_map(|u| u.tensors.iter()).sum();
        assert!((86_000_000..87_000_000).contains(&params), "{params}");
        // About 17.5 GMACs per image forward.
        let flops: f64 = units.iter().map(|u| u.forward_flops).sum();
        assert!((33e9..37e9).contains(&flops), "{flops}");
    }
}
