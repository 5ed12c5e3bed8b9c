//! The reference kernels' facts (`capabilities/cpu_reference.json`), each held to the line of
//! our code that implements or enforces it.

use super::*;

pub(super) fn facts() -> Vec<Fact> {
    vec![]
}
