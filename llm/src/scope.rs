//! A model served in its own scope of a shared runtime ([`layerzero::runtime::Scope`]): its
//! weights, its tokenizer, and a handle whose plan, selection caches and counters are its
//! own while capabilities, hardware, PerfDB and health are shared with every other model of
//! the process. Requests for several scopes may run on any threads at once; each model gets
//! exactly what it gets alone.

use std::path::Path;

use super::generate::{Generated, Generation, generate};
use super::speculative::{Speculated, speculate_scoped};
use super::{Model, Tokenizer};
use layerzero::error::{Error, Result};
use layerzero::model::dtype::DType;
use layerzero::reason::Reason;
use layerzero::runtime::{LayerZero, PlanMode, Scope};

/// A model, its tokenizer and its scope of a runtime.
pub struct ModelScope {
    model: Model,
    tokenizer: Option<Tokenizer>,
    lz: LayerZero,
}

impl ModelScope {
    /// Loads the model folder `dir` (its `tokenizer.json` too, when there is one) as model
    /// `id` in a new scope of `runtime`.
    pub fn open(runtime: &LayerZero, id: &str, dir: &Path, dtype: Option<DType>) -> Result<ModelScope> {
        let model = Model::load(dir, dtype)?;
        let file = dir.join("tokenizer.json");
        let tokenizer = if file.exists() { Some(Tokenizer::load(&file)?) } else { None };
        ModelScope::new(runtime, id, model, tokenizer)
    }

    /// A loaded model and tokenizer as model `id` in a new scope of `runtime`.
    pub fn new(runtime: &LayerZero, id: &str, model: Model, tokenizer: Option<Tokenizer>) -> Result<ModelScope> {
        if let Some(t) = &tokenizer
            && t.vocab_size() > model.config.vocab
        {
            return Err(Error::invalid(format!(
                "model {id:?}: its tokenizer knows {} ids but the model's vocabulary is {} (config.json `vocab_size`)",
                t.vocab_size(),
                model.config.vocab
            )));
        }
        let lz = runtime.scoped(Scope::new(id, tokenizer.as_ref().map(Tokenizer::hash))?)?;
        Ok(ModelScope { model, tokenizer, lz })
    }

    /// Serves this model's selections from the dispatch table at `path` (solved from its
    /// workload; a table solved for another tokenizer is refused with
    /// `TOKENIZER_HASH_MISMATCH`).
    pub fn with_plan_file(mut self, path: &Path, mode: PlanMode) -> Result<ModelScope> {
        self.lz = self.lz.with_plan_file(path, mode)?;
        Ok(self)
    }

    /// The model id.
    pub fn id(&self) -> &str {
        self.lz.scope().map_or("", |s| s.model.as_str())
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The tokenizer, if the model has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// The scope's handle: its plan, caches and counters.
    pub fn runtime(&self) -> &LayerZero {
        &self.lz
    }

    /// Token ids of `text` by this model's tokenizer (special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.tokenizer {
            Some(t) => Ok(t.encode(text, true)?.ids),
            None => Err(Error::invalid(format!("model {:?} has no tokenizer; give token ids", self.id()))),
        }
    }

    /// Text of `ids` by this model's tokenizer (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.tokenizer {
            Some(t) => t.decode(ids, true),
            None => Err(Error::invalid(format!("model {:?} has no tokenizer", self.id()))),
        }
    }

    /// Generates from `prompt` through this scope.
    pub fn generate(&self, prompt: &[u32], g: &Generation) -> Result<Generated> {
        generate(&self.model, &self.lz, prompt, g, |_| {})
    }

    /// Speculative decoding with `draft`'s model proposing up to `k` tokens a round and this
    /// one verifying them, each through its own scope: the tokens are this model's, and
    /// neither scope's plan or cached selections serve the other (see
    /// [`crate::speculative::speculate_scoped`]).
    pub fn speculate(
        &self,
        draft: &ModelScope,
        prompt: &[u32],
        g: &Generation,
        k: usize,
        on_token: impl FnMut(u32),
    ) -> Result<Speculated> {
        speculate_scoped((&self.model, &self.lz), (&draft.model, &draft.lz), prompt, g, k, on_token)
    }

    /// Replaces the tokenizer. When its identity hash differs, the scope's cached selections
    /// and a plan solved for the old one are not served again; the reason
    /// (`TOKENIZER_HASH_MISMATCH`) is returned. In strict plan mode a plan for the old
    /// tokenizer makes this an error, and nothing changes.
    pub fn set_tokenizer(&mut self, tokenizer: Option<Tokenizer>) -> Result<Option<Reason>> {
        let reason = self.lz.retokenize(tokenizer.as_ref().map(Tokenizer::hash))?;
        self.tokenizer = tokenizer;
        Ok(reason)
    }
}
