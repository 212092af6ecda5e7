"""Paraphrase corpora and the default tokenizer for C-DNPG.

C-DNPG (Gu et al., "Continuous Decomposition of Granularity for Neural Paraphrase Generation", COLING 2022) is trained
and evaluated on Quora Question Pairs and the Twitter URL corpus, lowercased and BERT-basic-tokenized
(``what ' s the best way to learn ?``). One module per concern:

* ``template``: :func:`template_corpus`, a small corpus written for this project, so that training runs offline;
* ``pairs``: :func:`load_pair_files`, local JSONL / CSV / TSV pair files, with malformed lines counted and reported;
  :func:`both_directions` and :func:`drop_near_copies`, what the training split may be turned into;
* ``corpora``: :func:`prepare_quora` and :func:`prepare_twitter_url`, the paper's corpora rebuilt from their raw
  downloads, and :func:`normalize_text`, the paper's text format;
* ``tokenizer``: :func:`train_wordpiece_tokenizer`, :func:`save_tokenizer`, :func:`load_tokenizer`,
  :func:`model_token_ids`;
* ``records``: the reports every loader returns.

Every loader returns ``(DatasetDict, PairDataReport)`` with columns ``source`` and ``target``. Bad lines never stop a
run: they are counted, logged with their line numbers, and returned in the report.
"""

from .corpora import UnknownWordMapper, normalize_text, prepare_quora, prepare_twitter_url
from .pairs import both_directions, drop_near_copies, load_pair_files, near_copy_bleu, write_pair_files
from .records import DataFileError, FileReport, MissingColumnError, PairDataReport, TooFewPairsError
from .template import SLOT_FILLERS, TEMPLATE_FAMILIES, SlotPool, template_corpus, template_slots, write_template_corpus
from .tokenizer import (
    MODEL_INPUT_NAMES,
    PORTABLE_TOKENIZER_CLASS,
    SPECIAL_TOKENS,
    load_tokenizer,
    make_tokenizer_config_portable,
    model_token_ids,
    save_tokenizer,
    train_wordpiece_tokenizer,
)

__all__ = [
    "MODEL_INPUT_NAMES",
    "PORTABLE_TOKENIZER_CLASS",
    "SLOT_FILLERS",
    "SPECIAL_TOKENS",
    "TEMPLATE_FAMILIES",
    "DataFileError",
    "FileReport",
    "MissingColumnError",
    "PairDataReport",
    "SlotPool",
    "TooFewPairsError",
    "UnknownWordMapper",
    "both_directions",
    "drop_near_copies",
    "load_pair_files",
    "load_tokenizer",
    "make_tokenizer_config_portable",
    "model_token_ids",
    "near_copy_bleu",
    "normalize_text",
    "prepare_quora",
    "prepare_twitter_url",
    "save_tokenizer",
    "template_corpus",
    "template_slots",
    "train_wordpiece_tokenizer",
    "write_pair_files",
    "write_template_corpus",
]
