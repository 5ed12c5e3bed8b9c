//! The bookkeeping every op family's checks share: present tensors of the right rank,
//! layout and dtype, and `INVALID_REQUEST` reasons for whatever is not.

use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::request::Request;
use crate::model::tensor::TensorDesc;
use crate::reason::{Reason, ReasonCode};

/// Collects `INVALID_REQUEST` reasons while an op family's checks walk the request.
pub(super) struct Validator<'r> {
    pub(super) req: &'r Request,
    pub(super) errors: Vec<Reason>,
}

impl<'r> Validator<'r> {
    pub(super) fn new(req: &'r Request) -> Self {
        Validator { req, errors: Vec::new() }
    }

    pub(super) fn err(&mut self, msg: String) {
        self.errors.push(Reason::new(ReasonCode::INVALID_REQUEST, msg));
    }

    pub(super) fn tensor(&self, name: &str) -> Option<&'r TensorDesc> {
        self.req.tensors.get(name)
    }

    /// The tensor if present with the given rank; records an error otherwise.
    pub(super) fn ranked(&mut self, name: &str, rank: usize) -> Option<&'r TensorDesc> {
        let t = self.tensor(name)?;
        if t.rank() != rank {
            self.err(format!(
                "tensor `{name}` has rank {} (shape {:?}); {} needs rank {rank}",
                t.rank(),
                t.shape,
                self.req.op
            ));
            return None;
        }
        Some(t)
    }

    pub(super) fn layout_in(&mut self, name: &str, t: &TensorDesc, allowed: &[Layout]) -> Option<Layout> {
        match t.layout {
            Some(l) if allowed.contains(&l) => Some(l),
            Some(l) => {
                let names: Vec<&str> = allowed.iter().map(|l| l.as_str()).collect();
                self.err(format!("tensor `{name}` has layout {l}; {} accepts {}", self.req.op, names.join(" or ")));
                None
            }
            None => {
                let names: Vec<&str> = allowed.iter().map(|l| l.as_str()).collect();
                self.err(format!("tensor `{name}` needs an explicit layout ({})", names.join(" or ")));
                None
            }
        }
    }

    pub(super) fn dtype_in(&mut self, name: &str, t: &TensorDesc, allowed: &[DType]) -> bool {
        if allowed.contains(&t.dtype) {
            return true;
        }
        let names: Vec<&str> = allowed.iter().map(|d| d.as_str()).collect();
        self.err(format!("tensor `{name}` has dtype {}; expected {}", t.dtype, names.join(" or ")));
        false
    }

    pub(super) fn eq(&mut self, what: &str, a: u64, b: u64) -> bool {
        if a != b {
            self.err(format!("{what}: {a} != {b}"));
            return false;
        }
        true
    }

    pub(super) fn positive(&mut self, what: &str, v: u64) -> bool {
        if v == 0 {
            self.err(format!("{what} is 0; it must be at least 1"));
            return false;
        }
        true
    }
}

/// [b, s, h, d] of a BSHD/BHSD tensor.
pub(super) fn bshd(t: &TensorDesc, layout: Layout) -> [u64; 4] {
    let s = &t.shape;
    match layout {
        Layout::Bhsd => [s[0], s[2], s[1], s[3]],
        _ => [s[0], s[1], s[2], s[3]],
    }
}

pub(super) const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::Fp8E4M3, DType::Fp8E5M2];
pub(super) const INDEX: &[DType] = &[DType::I32, DType::I64];
