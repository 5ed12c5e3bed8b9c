//! A model's `tokenizer.json`, through the HF `tokenizers` crate (pure-Rust regex), with an
//! identity hash: two tokenizers that could encode a text differently never share one.

use std::path::Path;

use layerzero::error::{Error, Result};

/// A loaded tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    hash: String,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("hash", &self.hash).field("vocab", &self.vocab_size()).finish()
    }
}

/// Ids and the byte offsets of the text each came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoding {
    /// Token ids.
    pub ids: Vec<u32>,
    /// `(start, end)` byte offsets into the text, per id (special tokens: `(0, 0)`).
    pub offsets: Vec<(usize, usize)>,
}

/// The parts of `tokenizer.json` that decide how text becomes ids.
const IDENTITY: [&str; 6] = ["model", "normalizer", "pre_tokenizer", "added_tokens", "post_processor", "decoder"];

impl Tokenizer {
    /// Reads `path`; a file that does not parse is an error naming it.
    pub fn load(path: &Path) -> Result<Tokenizer> {
        let origin = path.display().to_string();
        let text = layerzero::files::read_to_string(path)?;
        Tokenizer::parse(&text, &origin)
    }

    /// Parses `tokenizer.json` text.
    pub fn parse(text: &str, origin: &str) -> Result<Tokenizer> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
        let inner: tokenizers::Tokenizer =
            text.parse().map_err(|e| Error::invalid(format!("{origin}: not a tokenizer this build reads: {e}")))?;
        let mut h = blake3::Hasher::new();
        for part in IDENTITY {
            h.update(part.as_bytes());
            // serde_json writes object keys sorted (no `preserve_order`): a canonical form.
            let v = value.get(part).cloned().unwrap_or(serde_json::Value::Null);
            h.update(serde_json::to_string(&v).unwrap_or_default().as_bytes());
        }
        Ok(Tokenizer { inner, hash: h.finalize().to_hex().to_string() })
    }

    /// The identity hash (blake3 over vocabulary, merges, normalizer, pre-tokenizer,
    /// post-processor, decoder and added/special tokens).
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// Checks that this is the tokenizer `pinned` names (its identity hash, or a prefix of at
    /// least 12 hex digits): a deployment that pins the tokenizer its prompts and ids were
    /// made with refuses another one (`TOKENIZER_MISMATCH`) instead of decoding other text.
    pub fn expect(&self, pinned: &str, origin: &str) -> Result<()> {
        let pinned = pinned.trim().to_ascii_lowercase();
        if pinned.len() < 12 || pinned.len() > 64 || !pinned.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid(format!(
                "--tokenizer-hash {pinned:?}: expected 12 to 64 hex digits of a tokenizer identity hash"
            )));
        }
        if self.hash.starts_with(&pinned) {
            return Ok(());
        }
        let reason = layerzero::reason::Reason::new(
            layerzero::reason::ReasonCode::TOKENIZER_MISMATCH,
            format!(
                "{origin}: identity hash {} does not match the pinned {pinned}; its vocabulary, merges, \
                 normalizer or special tokens differ",
                self.hash
            ),
        );
        Err(Error::invalid(reason.to_string()).with_reasons(vec![reason]))
    }

    /// Ids the tokenizer knows.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Encodes `text`, adding the special tokens the post-processor adds (BOS, say) when
    /// `special` is true.
    pub fn encode(&self, text: &str, special: bool) -> Result<Encoding> {
        let e =
            self.inner.encode(text, special).map_err(|e| Error::invalid(format!("cannot encode the prompt: {e}")))?;
        Ok(Encoding { ids: e.get_ids().to_vec(), offsets: e.get_offsets().to_vec() })
    }

    /// Decodes ids to text.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner.decode(ids, skip_special).map_err(|e| Error::invalid(format!("cannot decode: {e}")))
    }

    /// A decoder fed one id at a time that yields text as soon as it is complete (a
    /// multi-byte character split over tokens comes out whole). Each step decodes only the
    /// ids since the last emitted text, so a long generation stays linear.
    pub fn stream(&self, skip_special: bool) -> Stream<'_> {
        Stream { tokenizer: self, ids: Vec::new(), prefix: 0, read: 0, skip_special }
    }
}

/// Streaming decode: text for each new id, once it no longer changes.
#[derive(Debug)]
pub struct Stream<'t> {
    tokenizer: &'t Tokenizer,
    ids: Vec<u32>,
    /// Ids before `prefix` are emitted and no longer decoded; `prefix..read` is context
    /// whose text was emitted, kept so that word-boundary decoders see it.
    prefix: usize,
    read: usize,
    skip_special: bool,
}

impl Stream<'_> {
    /// Adds `id`; returns the text it completes (empty while a character is incomplete).
    pub fn step(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let before = self.tokenizer.decode(&self.ids[self.prefix..self.read], self.skip_special)?;
        let now = self.tokenizer.decode(&self.ids[self.prefix..], self.skip_special)?;
        // An incomplete UTF-8 sequence decodes to U+FFFD at the end: wait for the next id.
        if now.len() <= before.len() || now.ends_with('\u{fffd}') {
            return Ok(String::new());
        }
        let Some(new) = now.get(before.len()..).map(str::to_owned) else { return Ok(String::new()) };
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(new)
    }
}
