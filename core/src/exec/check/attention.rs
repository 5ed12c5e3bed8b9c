//! Attention attributes every attention kernel relies on.

use super::invalid;
use crate::exec::executor::KernelError;
use crate::model::attrs::AttentionAttrs;

impl AttentionAttrs {
    /// Checks the attributes every attention kernel relies on.
    pub fn check(&self) -> Result<(), KernelError> {
        let a = self;
        if a.dropout_p != 0.0 {
            if a.dropout_p > 0.0 && a.dropout_p < 1.0 {
                return Err(KernelError::Unsupported(format!(
                    "attrs.dropout_p is {}; the reference kernels are inference-only (no dropout)",
                    a.dropout_p
                )));
            }
            return Err(invalid(format!("attrs.dropout_p is {}; it must be in [0, 1)", a.dropout_p)));
        }
        if let Some(c) = a.softcap
            && !(c.is_finite() && c > 0.0)
        {
            return Err(invalid(format!("attrs.softcap is {c}; it must be a positive number")));
        }
        if let Some(s) = a.scale
            && !(s.is_finite() && s > 0.0)
        {
            return Err(invalid(format!("attrs.scale is {s}; it must be a positive number")));
        }
        // No kernel reads a block layout: selection plans its expansion into a dense mask.
        if let Some(block) = a.mask_block {
            return Err(KernelError::Unsupported(format!(
                "attrs.mask_block is {block:?}: a block-sparse mask reaches a kernel only expanded to a dense bool mask (transform expand_block_mask)"
            )));
        }
        Ok(())
    }
}
