#!/usr/bin/env python
"""How long METEOR's WordNet takes to load in a scoring process: the metric's `WordNet30Reader` against NLTK's own
reader of the same corpus, side by side in one process. Each round builds both readers anew, in alternating order,
and looks up one word; CPU seconds, the median over rounds, and their ratio.

    python benchmarks/wordnet_load.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from common import check_positive
from nltk.corpus.reader.wordnet import WordNetCorpusReader

from cdnpg.training.paraphrase_metrics import require_wordnet
from cdnpg.wordnet import WORDNET, WordNet30Reader

READERS = {"WordNet30Reader": WordNet30Reader, "nltk": WordNetCorpusReader}


def load_seconds(reader: type[WordNetCorpusReader]) -> float:
    """CPU seconds to build `reader` on the metric's corpus and look up one word."""
    start = time.process_time()
    reader(WORDNET.root, WORDNET._omw_reader).synsets("car")
    return time.process_time() - start


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="loads of each reader (default 5)")
    args = parser.parse_args(argv)
    check_positive(parser, args, "rounds")
    require_wordnet()
    seconds = {name: [] for name in READERS}
    for round_ in range(args.rounds):
        for name in list(READERS)[:: 1 if round_ % 2 == 0 else -1]:
            seconds[name].append(load_seconds(READERS[name]))
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    result = {"cpu_seconds": seconds, "median_s": medians, "ratio": medians["WordNet30Reader"] / medians["nltk"]}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
