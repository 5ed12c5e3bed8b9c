//! Language models served through LayerZero: a Hugging Face folder (config and safetensors
//! weights) loaded for the decoder families in [`config::Arch`], and a forward pass in which
//! every op is a [`crate::LayerZero::dispatch`], so selection, plans, caches, fallback and
//! counters are exercised by a real workload.

#![deny(unsafe_code)]
#![warn(missing_docs)]

// The runtime's modules under the names this crate's code gives them.
use crate as llm;
use layerzero::{error, exec, files, key, knobs, model, plan, reason, runtime, tensor, transform};

pub mod config;
pub mod diff;
pub mod forward;
pub mod generate;
pub mod pass;
pub mod scope;
pub mod seq2seq;
pub mod speculative;
pub mod tokenizer;
pub mod vit;
pub mod weights;
pub mod workload;

use std::path::{Path, PathBuf};

pub use crate::tensor::Residence;
pub use config::{Arch, ModelConfig, MoeConfig};
pub use forward::{KvKind, OpStats, Session};
pub use generate::{Generated, Generation, Sequence};
pub use scope::ModelScope;
pub use speculative::{Speculated, speculate};
pub use tokenizer::Tokenizer;
pub use weights::{Ffn, MoeWeights, Weights};

use crate::error::Result;
use crate::model::dtype::DType;

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
        Model::load_as(dir, dtype, crate::knobs::WEIGHTS.value_in(&crate::knobs::process_env)?)
    }

    /// [`load`](Model::load) with the weights served as `residence` says.
    pub fn load_as(dir: &Path, dtype: Option<DType>, residence: Residence) -> Result<Model> {
        let config = ModelConfig::load(dir)?;
        let weights = Weights::load(dir, &config, dtype, residence)?;
        let dtype = dtype.unwrap_or(weights.stored);
        Ok(Model { dir: dir.to_path_buf(), config, weights, dtype })
    }
}
