//! Language models served through LayerZero: a Hugging Face folder (config and safetensors
//! weights) loaded for the decoder families in [`config::Arch`], and a forward pass in which
//! every op is a [`layerzero::LayerZero::dispatch`], so selection, plans, caches, fallback and
//! counters are exercised by a real workload.
//!
//! A forward pass reads like the model: layers (`nn`: `Linear`, `Norm`, `Embedding`,
//! `Attention`, the MLP and the mixture of experts) hold references into the weights and the
//! slot their outputs are kept in, and dispatch through `pass::Pass` (counted dispatch,
//! named outputs, stage dumps), which the encoder-decoder ([`seq2seq`]) and the vision model
//! ([`vit`]) use too. `decoder` assembles a decoder's layers (embedding, blocks, final norm,
//! LM head); [`forward::Session`] runs sequences through it over `kv`'s cache.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
mod decoder;
pub mod diff;
pub mod forward;
pub mod generate;
mod kv;
mod nn;
pub mod pass;
mod quant;
mod refill;
pub mod scope;
pub mod seq2seq;
pub mod speculative;
pub mod tokenizer;
pub mod vit;
pub mod weights;
pub mod workload;

use std::path::{Path, PathBuf};

pub use config::{Arch, ModelConfig, MoeConfig};
pub use forward::{KvKind, OpStats, Session};
pub use generate::{Generated, Generation, Sequence};
pub use layerzero::tensor::Residence;
pub use pass::StageCheck;
pub use scope::ModelScope;
pub use speculative::{Speculated, speculate, speculate_scoped};
pub use tokenizer::Tokenizer;
pub use weights::{Ffn, MoeWeights, Proj, Qkv, WeightQuant, Weights};

use layerzero::error::Result;
use layerzero::model::dtype::DType;

/// What a unit test, or a helper of one, returns: a failed call is an `Err` the harness
/// prints, not a panic.
#[cfg(test)]
type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A loaded model: its config and its weights in the compute dtype.
#[derive(Debug, Clone)]
pub struct Model {
    /// The folder it was read from.
    pub dir: PathBuf,
    /// The config.
    pub config: ModelConfig,
    /// The weights.
    pub weights: Weights,
    /// The dtype every op computes in.
    pub dtype: DType,
}

impl Model {
    /// Loads `dir` (`config.json` and `*.safetensors`), computing in `dtype` or, when `None`,
    /// in the dtype the weights are stored in; weights served as `LAYERZERO_WEIGHTS` says
    /// (resident by default).
    pub fn load(dir: &Path, dtype: Option<DType>) -> Result<Model> {
        Model::load_as(dir, dtype, layerzero::knobs::WEIGHTS.value_in(&layerzero::knobs::process_env)?)
    }

    /// [`load`](Model::load) with the weights served as `residence` says.
    pub fn load_as(dir: &Path, dtype: Option<DType>, residence: Residence) -> Result<Model> {
        Model::load_with(dir, dtype, residence, None)
    }

    /// [`load_as`](Model::load_as) with the projections quantized at load as `quant` says
    /// (`lz generate --weights`).
    pub fn load_with(
        dir: &Path,
        dtype: Option<DType>,
        residence: Residence,
        quant: Option<WeightQuant>,
    ) -> Result<Model> {
        let config = ModelConfig::load(dir)?;
        let weights = Weights::load_with(dir, &config, dtype, residence, quant)?;
        let dtype = dtype.unwrap_or(weights.stored);
        Ok(Model { dir: dir.to_path_buf(), config, weights, dtype })
    }
}
