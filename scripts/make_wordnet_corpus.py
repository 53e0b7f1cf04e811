"""Build ``mcp_interp/data/corpora/wordnet_examples.json``: the offline corpus `feature_examples` and
`score_explanation` search by default.

Why WordNet's example sentences: the corpus must ship with the package (no network at run time), be real English
written by people rather than templates, cover every topic and register a feature might respond to, and carry a
licence that allows redistribution. WordNet 3.0's glosses hold ~48 000 example sentences ("the dog barked all
night", quotations from literature and the press) written by Princeton's lexicographers for every sense of every
noun, verb, adjective and adverb — as varied in topic as the English lexicon — under the WordNet 3.0 licence
(permissive: use, copy, modify and distribute with the copyright notice, which the corpus file carries). They are
short (≈ 11 SmolLM2 tokens), which is what makes one pass over thousands of them affordable on a CPU.

Source: Debian's ``wordnet-base`` package (1:3.0-37; ``apt-get install wordnet-base`` or ``apt-get download
wordnet-base`` and ``dpkg-deb -x``), files ``usr/share/wordnet/data.{noun,verb,adj,adv}``.

Selection (deterministic): every double-quoted example in a gloss, in file order; kept when it has 7–30 words and only
printable ASCII; senses whose gloss marks the word as a slur or as offensive, obscene, vulgar, derogatory or
disparaging are skipped; case-insensitive duplicates dropped; shuffled with ``random.Random(34)``; the first 2,000
are the *search* pool (`feature_examples` ranks these), the next 1,000 the *held-out* pool (detection quizzes draw
only from these, so a quiz never shows a text the examples showed).

    python scripts/make_wordnet_corpus.py [--wordnet /usr/share/wordnet]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "mcp_interp" / "data" / "corpora" / "wordnet_examples.json"
SEARCH, HELD_OUT = 2000, 1000
SEED = 34
SKIPPED_GLOSS = re.compile(r"slur|offensive|obscene|vulgar|derogatory|disparaging", re.IGNORECASE)
QUOTED = re.compile(r'"([^"]+)"')

LICENCE = """WordNet 3.0 license. This software and database is being provided to you, the LICENSEE, by Princeton \
University under the following license. By obtaining, using and/or copying this software and database, you agree \
that you have read, understood, and will comply with these terms and conditions.: Permission to use, copy, modify \
and distribute this software and database and its documentation for any purpose and without fee or royalty is \
hereby granted, provided that you agree to comply with the following copyright notice and statements, including the \
disclaimer, and that the same appear on ALL copies of the software, database and documentation, including \
modifications that you make for internal use or for distribution. WordNet 3.0 Copyright 2006 by Princeton \
University. All rights reserved. THIS SOFTWARE AND DATABASE IS PROVIDED "AS IS" AND PRINCETON UNIVERSITY MAKES NO \
REPRESENTATIONS OR WARRANTIES, EXPRESS OR IMPLIED. BY WAY OF EXAMPLE, BUT NOT LIMITATION, PRINCETON UNIVERSITY \
MAKES NO REPRESENTATIONS OR WARRANTIES OF MERCHANT- ABILITY OR FITNESS FOR ANY PARTICULAR PURPOSE OR THAT THE USE OF \
THE LICENSED SOFTWARE, DATABASE OR DOCUMENTATION WILL NOT INFRINGE ANY THIRD PARTY PATENTS, COPYRIGHTS, TRADEMARKS OR \
OTHER RIGHTS. The name of Princeton University or Princeton may not be used in advertising or publicity pertaining \
to distribution of the software and/or database. Title to copyright in this software, database and any associated \
documentation shall at all times remain with Princeton University and LICENSEE agrees to preserve same."""


def examples(folder: Path) -> list[str]:
    found: list[str] = []
    seen: set[str] = set()
    for part in ("noun", "verb", "adj", "adv"):
        for line in (folder / f"data.{part}").read_text(encoding="latin-1").splitlines():
            if line.startswith("  ") or " | " not in line:
                continue  # the licence header, or a line without a gloss
            gloss = line.split(" | ", 1)[1]
            if SKIPPED_GLOSS.search(gloss):
                continue
            for sentence in QUOTED.findall(gloss):
                sentence = " ".join(sentence.split())
                words = len(sentence.split())
                key = sentence.lower()
                if 7 <= words <= 30 and sentence.isascii() and sentence.isprintable() and key not in seen:
                    seen.add(key)
                    found.append(sentence)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"))
    args = parser.parse_args()
    pool = examples(args.wordnet)
    random.Random(SEED).shuffle(pool)
    texts = pool[: SEARCH + HELD_OUT]
    document = {
        "name": "wordnet_examples",
        "description": (
            f"{len(texts)} English example sentences from WordNet 3.0's glosses (7–30 words each, every part of "
            "speech and topic of the lexicon), the default corpus of feature_examples and score_explanation. "
            f"Texts 0..{SEARCH - 1} are the search pool (feature_examples ranks them), texts {SEARCH}.."
            f"{SEARCH + HELD_OUT - 1} the held-out pool (detection quizzes draw only from them)."
        ),
        "source": (
            "WordNet 3.0 (Princeton University), the example sentences quoted in the glosses of data.noun, "
            "data.verb, data.adj and data.adv as Debian's wordnet-base 1:3.0-37 installs them; built by "
            f"scripts/make_wordnet_corpus.py (of {len(pool)} eligible sentences, seed {SEED})."
        ),
        "license": LICENCE,
        "search": SEARCH,
        "held_out": HELD_OUT,
        "texts": texts,
    }
    OUT.write_text(json.dumps(document, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"{len(pool)} eligible sentences; wrote {len(texts)} to {OUT}")


if __name__ == "__main__":
    main()
