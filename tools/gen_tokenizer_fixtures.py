#!/usr/bin/env python3
"""Tokenizer fidelity fixtures (E2E spec §6.8): three small tokenizers trained with the Python
`tokenizers` library and what it makes of texts with Unicode edge cases, for the Rust test
`tests/tests/tokenizer_fidelity.rs` to hold LayerZero's tokenizer (the Rust `tokenizers` crate
with its pure-Rust regex engine, where Python's uses Oniguruma) to ids, offsets and decoded
text identical to these.

Tokenizers (tests/fixtures/tokenizers/<name>.json):
  bytelevel  - byte-level BPE as GPT-2 / Llama 3 build it: NFC, the GPT-2 split regex, custom
               merges (trained), added special tokens <|bos|>, <|eot|> and an added plain
               token, a template adding <|bos|>.
  metaspace  - SentencePiece-style BPE as Llama 2 / Mistral build it: NFKC, spaces to U+2581,
               byte fallback for unseen characters, <s> added by the template.
  wordpiece  - BERT: its normalizer (NFD, accents stripped, lowercase, CJK split), WordPiece,
               [CLS] ... [SEP].
Cases (tests/fixtures/tokenizers/cases.json): for every tokenizer and text, with and without
special tokens: ids, offsets as (start, end) character indices (as Python reports them), the
decoded text with and without special tokens, and whether decode(encode(text)) is the text.

Usage: tools/.venv/bin/python tools/gen_tokenizer_fixtures.py   (pip install tokenizers==0.23.2,
the version of the Rust crate LayerZero builds with)
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tokenizers"

# Training text: several scripts, so that merges exist for each.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 12:30 and we're testing tokenizers!",
    "Les élèves étudient à l'école; naïve façade, crème brûlée, coöperation.",
    "Der Straßenbahnfahrer fährt über die Brücke. Ärger, Öl, Übung.",
    "東京は日本の首都です。大阪と京都も有名な都市です。",
    "Привет, как дела? Хорошо, спасибо.",
    "مرحبا بالعالم، كيف حالك؟ العربية تكتب من اليمين إلى اليسار",
    "שלום עולם, מה שלומך?",
    "def main():\n    return [x ** 2 for x in range(10)]\n\tprint('done')",
    "emoji 😀😃 and 👍🏽 thumbs, family 👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "ＡＢＣ　１２３ full-width, ﬁ ligature, ① circled, ½ fraction, ℌ fraktur",
] * 20

# The texts the fixtures hold: the edge cases of §6.8 and the ordinary.
TEXTS = [
    "Hello, world!",
    "  leading spaces and  double  spaces  ",
    "tabs\tand\nnewlines\r\n and trailing\n",
    "café (precomposed) vs cafe\u0301 (combining acute)",
    "Zalgo: z\u0337\u0321a\u0336\u0322l\u0334g\u0335o\u0338",
    "ＡＢＣ１２３ full-width and ｶﾀｶﾅ half-width",
    "ligatures ﬁ ﬂ and ① ½ ℌ ²",
    "family 👩\u200d👩\u200d👧\u200d👦 emoji with zero-width joiners",
    "skin tone 👍🏽 and flag 🇯🇵 and keycap 1\ufe0f\u20e3",
    "zero\u200bwidth space, non\u200cjoiner, word\u2060joiner",
    "RTL: مرحبا بالعالم 123 and עברית 456 mixed",
    "\u202eoverride\u202c and \u200fmark",
    "東京は日本の首都です。",
    "Ελληνικά και Русский текст",
    "code: fn main() { let x = a[0] + b[1]; }",
    "<|bos|> embedded special <|eot|> tokens and the added token stay_whole",
    "[CLS] bert specials [SEP] in text [MASK]",
    "<s> sentencepiece specials </s>",
    "unseen: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀 ꙮ",
    "",
    " ",
    "a",
]


def bytelevel() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<|bos|>", "<|eot|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens(["stay_whole"])
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", bos)]
    )
    return tok


def metaspace() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" "), "\u2581")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=900, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens, show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return tok


def wordpiece() -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=800, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    return tok


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    cases = []
    for name, build in [("bytelevel", bytelevel), ("metaspace", metaspace), ("wordpiece", wordpiece)]:
        tok = build()
        tok.save(str(OUT / f"{name}.json"))
        for text in TEXTS:
            for special in (False, True):
                enc = tok.encode(text, add_special_tokens=special)
                decoded = tok.decode(enc.ids, skip_special_tokens=False)
                cases.append({
                    "tokenizer": name,
                    "text": text,
                    "add_special": special,
                    "ids": enc.ids,
                    "char_offsets": [list(o) for o in enc.offsets],
                    "decoded": decoded,
                    "decoded_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
                    "round_trip": tok.decode(tok.encode(text, add_special_tokens=False).ids) == text,
                })
    doc = {"tokenizers_version": tokenizers.__version__, "cases": cases}
    (OUT / "cases.json").write_text(json.dumps(doc, ensure_ascii=False, indent=0) + "\n")
    print(f"{len(cases)} cases for 3 tokenizers in {OUT}")


if __name__ == "__main__":
    main()
