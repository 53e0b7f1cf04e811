"""Regenerate the word-level tokenizer of the `tiny` model (package data).

Run from a checkout: ``python tools/make_tiny_tokenizer.py``. The output is committed, so
users never run this; it exists so the vocabulary is reproducible and reviewable. The
vocabulary covers the prompt corpora in ``prompts/`` (IOI, capitals) so the tiny model can
run every workflow end to end, with random weights.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL = ["[UNK]", "[PAD]", "[BOS]", "[EOS]"]
WORDS = """
when after then while and or but the a an to of in on at for with from by as is was were be it
that this there here they he she we you i his her their my your its not no yes so if
went go goes gone came come gave give gives given took take brought bring handed hand sent send
store shop shops park school house office market station garden kitchen beach city town river
drink bag ball apple book gift letter key card drink pen cup box ticket flower coin note
capital country city called named known largest famous
mary john tom james dan sid martin amy alice bob carol dave eve frank grace heidi ivan judy
kate leo mia noah olivia paul quinn rose sam tina
france paris germany berlin italy rome spain madrid canada ottawa japan tokyo china beijing
india delhi egypt cairo brazil brasilia russia moscow kenya nairobi peru lima greece athens
zero one two three four five six seven eight nine ten
red green blue yellow black white big small old new good bad
. , ! ? : ; ' " - ( )
""".split()


def build(out_dir: Path) -> None:
    vocab: dict[str, int] = {}
    for word in SPECIAL + WORDS:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()]
    )
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with single spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        bos_token="[BOS]",
        eos_token="[EOS]",
    )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    fast.save_pretrained(str(out_dir))
    print(f"wrote {len(vocab)} tokens to {out_dir}", file=sys.stderr)


if __name__ == "__main__":
    build(Path(__file__).resolve().parent.parent / "mcp_interp" / "data" / "tiny_tokenizer")
