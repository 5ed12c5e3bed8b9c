//! What one rank of a tensor-parallel group runs (Megatron's split, as vLLM shards a decoder):
//! the attention heads and the MLP's inner size divided over the ranks; key/value heads divided
//! too, or replicated (one per rank) when there are fewer of them than ranks. The hidden size,
//! the embedding and the head stay whole, so the rank's projections are the column or row
//! slices of the full ones.

use layerzero::error::{Error, Result};

use super::ModelConfig;

impl ModelConfig {
    /// The shapes one of `ranks` tensor-parallel ranks runs; an error names what does not
    /// divide.
    pub fn tensor_parallel(&self, ranks: usize) -> Result<ModelConfig> {
        let bad = |what: &str, n: usize| {
            Error::invalid(format!("--tp {ranks}: {what} {n} cannot be split over {ranks} ranks"))
        };
        if ranks == 0 {
            return Err(Error::invalid("--tp 0: a tensor-parallel group has at least one rank"));
        }
        if !self.heads.is_multiple_of(ranks) {
            return Err(bad("the attention heads", self.heads));
        }
        let kv_heads = if self.kv_heads >= ranks {
            if !self.kv_heads.is_multiple_of(ranks) {
                return Err(bad("the key/value heads", self.kv_heads));
            }
            self.kv_heads / ranks
        } else if ranks.is_multiple_of(self.kv_heads) {
            1 // replicated: each rank keeps the one key/value head its query heads read
        } else {
            return Err(bad("the key/value heads", self.kv_heads));
        };
        if !self.intermediate.is_multiple_of(ranks) {
            return Err(bad("the MLP inner size", self.intermediate));
        }
        let mut out = self.clone();
        out.heads = self.heads / ranks;
        out.kv_heads = kv_heads;
        out.intermediate = self.intermediate / ranks;
        if let Some(moe) = &mut out.moe {
            if !moe.intermediate.is_multiple_of(ranks) {
                return Err(bad("the experts' inner size", moe.intermediate));
            }
            moe.intermediate /= ranks;
            if let Some(shared) = &mut moe.shared_intermediate {
                if !shared.is_multiple_of(ranks) {
                    return Err(bad("the shared expert's inner size", *shared));
                }
                *shared /= ranks;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    #[test]
    fn heads_and_inner_size_divide_and_fewer_kv_heads_than_ranks_are_replicated() -> TestResult {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/models/llama-gqa");
        let c = ModelConfig::load(&dir)?;
        let two = c.tensor_parallel(2)?;
        assert_eq!((two.heads, two.kv_heads, two.intermediate), (c.heads / 2, c.kv_heads / 2, c.intermediate / 2));
        assert_eq!((two.hidden, two.head_dim, two.vocab), (c.hidden, c.head_dim, c.vocab));
        let wide = c.tensor_parallel(c.kv_heads * 2)?;
        assert_eq!(wide.kv_heads, 1, "fewer KV heads than ranks: each rank keeps one");
        let e = c.tensor_parallel(c.heads + 1).err().ok_or("an uneven split must be refused")?;
        assert!(e.to_string().contains("attention heads"), "{e}");
        Ok(())
    }
}
