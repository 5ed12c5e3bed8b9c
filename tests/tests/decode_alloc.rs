//! The decode step allocates nothing: a counting global allocator watches one token's
//! forward pass on a committed tiny model, once the session is warm.

use std::alloc::System;
use std::path::PathBuf;

use layerzero::LayerZero;
use layerzero::llm::Model;
use layerzero::llm::forward::{KvKind, Session};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn model(name: &str) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models").join(name);
    Model::load(&dir, None).expect("the committed model loads")
}

#[test]
fn decode_step_allocation_count() {
    for (name, kv) in [("llama-gqa", KvKind::Contiguous), ("llama-gqa", KvKind::Paged { page_size: 4 })] {
        let m = model(name);
        let lz = LayerZero::host().unwrap();
        let mut s = Session::with_cache(&m, &lz, &[64], kv).unwrap();
        s.forward(&[1, 2, 3, 4, 5], false).unwrap();
        for t in 0..3 {
            s.forward(&[7 + t], false).unwrap();
        }
        let region = Region::new(GLOBAL);
        s.forward(&[11], false).unwrap();
        let st = region.change();
        eprintln!(
            "{name} {kv:?}: {} allocations, {} bytes, {} reallocs",
            st.allocations, st.bytes_allocated, st.reallocations
        );
    }
}
