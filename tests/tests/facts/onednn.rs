//! oneDNN facts (`capabilities/onednn.json`), each held to its upstream line.

use super::*;

pub(super) fn facts() -> Vec<Fact> {
    vec![]
}
