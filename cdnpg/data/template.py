"""The embedded template corpus: a small paraphrase corpus written for this project (no third-party text), so that
training runs offline on a fresh machine.

Sentence-level templates are paired with paraphrased templates and filled with phrase-level details that must be
copied from source to target: the two granularities C-DNPG separates. The word lists live in
``template_corpus.json`` beside this module (package data):

* ``template_families``: each family lists 2-4 paraphrases with the same slots, in the Quora style, already lowercased
  and BERT-basic-tokenized. ``{city2}`` is a second, different ``city``.
* ``slot_fillers``: the phrase-level details of each slot type. ``held_out`` fillers never occur in train, so a model
  can only produce them by copying.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetDict, List, Value

from .pairs import write_pair_files
from .records import PAIR_FEATURES


@dataclass(frozen=True)
class SlotPool:
    """Fillers of one slot type: ``seen`` ones fill train, ``held_out`` ones appear only in valid and test."""

    seen: tuple[str, ...]
    held_out: tuple[str, ...]


_WORDS = json.loads(resources.files(__package__).joinpath("template_corpus.json").read_text(encoding="utf-8"))
SLOT_FILLERS: dict[str, SlotPool] = {
    slot_type: SlotPool(tuple(pool["seen"]), tuple(pool["held_out"]))
    for slot_type, pool in _WORDS["slot_fillers"].items()
}
TEMPLATE_FAMILIES: tuple[tuple[str, ...], ...] = tuple(tuple(family) for family in _WORDS["template_families"])

_SLOT = re.compile(r"\{(\w+?)(\d*)\}")
TEMPLATE_HELD_OUT_RATE = 0.5  # chance that a slot in valid/test is filled with a held-out filler


def template_slots(template: str) -> list[tuple[str, str]]:
    """``(slot name, slot type)`` for each distinct slot of ``template``, in order: ``{city2}`` -> ``("city2", "city")``."""
    slots: dict[str, str] = {}
    for match in _SLOT.finditer(template):
        slots.setdefault(match.group(1) + match.group(2), match.group(1))
    return list(slots.items())


def _fill(template: str, values: dict[str, str]) -> str:
    return _SLOT.sub(lambda match: values[match.group(1) + match.group(2)], template)


def _sample_template_pair(rng: random.Random, held_out_rate: float) -> tuple[int, str, str, list[str]]:
    family_index = rng.randrange(len(TEMPLATE_FAMILIES))
    family = TEMPLATE_FAMILIES[family_index]
    source_template, target_template = rng.sample(family, 2)
    values: dict[str, str] = {}
    for name, slot_type in template_slots(source_template):
        pool = SLOT_FILLERS[slot_type]
        use_held_out = rng.random() < held_out_rate
        choices = [v for v in (pool.held_out if use_held_out else pool.seen) if v not in values.values()]
        values[name] = rng.choice(choices)
    return family_index, _fill(source_template, values), _fill(target_template, values), list(values.values())


def template_corpus(
    num_train: int = 6000,
    num_valid: int = 500,
    num_test: int = 500,
    seed: int = 0,
    held_out_rate: float = TEMPLATE_HELD_OUT_RATE,
    with_metadata: bool = False,
) -> DatasetDict:
    """Generate the embedded template corpus: paraphrased sentence templates filled with copied details.

    Each pair picks one of :data:`TEMPLATE_FAMILIES`, two different paraphrase templates of it (ordered: either can
    be the source), and one filler per slot, used identically in source and target. Templates are shared by all
    splits; *details* are held out: train uses only ``SlotPool.seen`` fillers, while in valid and test each slot is
    filled from ``SlotPool.held_out`` with probability ``held_out_rate``, so a model has to copy those words rather
    than recall them. Pairs are unique within a split, and valid / test sources never repeat a source of an earlier
    split (small template families saturate first, so larger ones fill the rest). Deterministic for a
    ``seed``, and each split's content depends only on the seed and its own size. ``with_metadata`` adds ``family``
    (template family index) and ``fillers`` (the slot values) columns, used by tests.
    """
    if not 0.0 <= held_out_rate <= 1.0:
        raise ValueError(f"held_out_rate must be in [0, 1], got {held_out_rate}")
    features = PAIR_FEATURES.copy()
    if with_metadata:
        features["family"] = Value("int32")
        features["fillers"] = List(Value("string"))
    seen_sources: set[str] = set()
    result = DatasetDict()
    for split, size, rate in (
        ("train", num_train, 0.0),
        ("valid", num_valid, held_out_rate),
        ("test", num_test, held_out_rate),
    ):
        rng = random.Random(f"cdnpg-template-corpus-{seed}-{split}")
        columns: dict[str, list[Any]] = {name: [] for name in features}
        split_sources: set[str] = set()
        split_pairs: set[tuple[str, str]] = set()
        attempts = 0
        while len(columns["source"]) < size:
            attempts += 1
            if attempts > 100 * size + 1000:
                raise RuntimeError(f"could not draw {size} new {split} pairs; ask for fewer")
            family, source, target, fillers = _sample_template_pair(rng, rate)
            if (source, target) in split_pairs or source in seen_sources:
                continue
            split_pairs.add((source, target))
            split_sources.add(source)
            columns["source"].append(source)
            columns["target"].append(target)
            if with_metadata:
                columns["family"].append(family)
                columns["fillers"].append(fillers)
        seen_sources |= split_sources
        result[split] = Dataset.from_dict(columns, features=features)
    return result


def write_template_corpus(
    out_dir: str | os.PathLike[str],
    num_train: int = 6000,
    num_valid: int = 500,
    num_test: int = 500,
    seed: int = 0,
) -> dict[str, Path]:
    """Write :func:`template_corpus` as ``train.jsonl`` / ``valid.jsonl`` / ``test.jsonl`` in ``out_dir``."""
    corpus = template_corpus(num_train=num_train, num_valid=num_valid, num_test=num_test, seed=seed)
    return write_pair_files(corpus, out_dir)
