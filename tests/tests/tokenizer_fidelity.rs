//! Tokenizer fidelity (E2E spec §6.8, issue 15 item 2): ids, offsets and decoded text exactly
//! as the Python `tokenizers` library gives them, for three kinds of tokenizer (byte-level
//! BPE with added and special tokens, SentencePiece-style BPE with byte fallback, BERT's
//! WordPiece) and texts with Unicode edge cases: combining marks, full-width and half-width
//! forms, ligatures, emoji joined by zero-width joiners, skin tones and flags, zero-width
//! spaces, right-to-left scripts and overrides, unseen planes, specials inside the text.
//! Fixtures: `tools/gen_tokenizer_fixtures.py` (Python `tokenizers` 0.23.2, whose regex engine
//! is Oniguruma where the Rust crate's is pure Rust).

use layerzero_llm::tokenizer::Tokenizer;
use layerzero_tests::{TestResult, repo_root};

fn fixtures() -> std::path::PathBuf {
    repo_root().join("tests/fixtures/tokenizers")
}

/// Python's offsets count characters; LayerZero's count bytes of the UTF-8 text.
fn byte_offsets(text: &str, chars: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let at: Vec<usize> = text.char_indices().map(|(b, _)| b).chain(std::iter::once(text.len())).collect();
    chars.iter().map(|&(s, e)| (at[s], at[e])).collect()
}

#[test]
fn every_fixture_case_encodes_and_decodes_exactly_as_python_tokenizers_does() -> TestResult {
    let text = std::fs::read_to_string(fixtures().join("cases.json"))?;
    let doc: serde_json::Value = serde_json::from_str(&text)?;
    let cases = doc["cases"].as_array().cloned().unwrap_or_default();
    assert!(cases.len() >= 100, "the fixture holds every case: {}", cases.len());
    let mut loaded = std::collections::BTreeMap::new();
    let mut round_trips = 0;
    for case in &cases {
        let name = case["tokenizer"].as_str().unwrap_or_default().to_owned();
        let tok = match loaded.entry(name.clone()) {
            std::collections::btree_map::Entry::Occupied(known) => known.into_mut(),
            std::collections::btree_map::Entry::Vacant(new) => new
                .insert(Tokenizer::load(&fixtures().join(format!("{name}.json"))).map_err(|e| format!("{name}: {e}"))?),
        };
        let text = case["text"].as_str().unwrap_or_default();
        let special = case["add_special"].as_bool().unwrap_or_default();
        let what = format!("{name} special={special} {text:?}");
        let want_ids: Vec<u32> = serde_json::from_value(case["ids"].clone())?;
        let chars: Vec<(usize, usize)> = serde_json::from_value(case["char_offsets"].clone())?;
        let got = tok.encode(text, special).map_err(|e| format!("{what}: {e}"))?;
        assert_eq!(got.ids, want_ids, "ids of {what}");
        assert_eq!(got.offsets, byte_offsets(text, &chars), "offsets of {what}");
        assert_eq!(tok.decode(&got.ids, false).ok().as_deref(), case["decoded"].as_str(), "decoding {what}");
        assert_eq!(
            tok.decode(&got.ids, true).ok().as_deref(),
            case["decoded_skip_special"].as_str(),
            "decoding {what} without specials"
        );
        // Where Python's round trip is lossless, ours is too.
        if case["round_trip"] == true && !special {
            round_trips += 1;
            assert_eq!(tok.decode(&got.ids, false).ok().as_deref(), Some(text), "round trip of {what}");
        }
    }
    assert_eq!(loaded.len(), 3);
    assert!(round_trips >= 20, "lossless cases checked: {round_trips}");
    Ok(())
}

#[test]
fn the_three_fixture_tokenizers_have_three_identities() -> TestResult {
    let hashes: std::collections::BTreeSet<String> = ["bytelevel", "metaspace", "wordpiece"]
        .iter()
        .map(|n| Tokenizer::load(&fixtures().join(format!("{n}.json"))).map(|t| t.hash().to_owned()))
        .collect::<Result<_, _>>()?;
    assert_eq!(hashes.len(), 3);
    Ok(())
}
