"""The default tokenizer of C-DNPG: a lowercase WordPiece tokenizer trained on the corpus, as the paper's
bert-base-uncased is, saved in a form both transformers 5.x and 4.57 load.

The model has no segment embeddings, so every tokenizer saved or loaded here returns only ``input_ids`` and
``attention_mask``: BERT tokenizers would otherwise add ``token_type_ids``, which ``generate()`` refuses.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # in id order: [PAD] is 0 as in BERT
PORTABLE_TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # a class name known to both transformers 4.57 and 5.x
MODEL_INPUT_NAMES = ("input_ids", "attention_mask")  # no token_type_ids: the model has no segment embeddings


def model_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """The config fields a tokenizer decides: its vocabulary size and special ids, BERT-style ([CLS] starts
    decoding, [SEP] ends it)."""
    return {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.cls_token_id,
        "eos_token_id": tokenizer.sep_token_id,
        "decoder_start_token_id": tokenizer.cls_token_id,
    }


def train_wordpiece_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 8000,
    min_frequency: int = 2,
    model_max_length: int = 128,
) -> PreTrainedTokenizerFast:
    """Train a lowercase BERT-style WordPiece tokenizer on ``texts``.

    Same pipeline as bert-base-uncased (BertNormalizer, BertPreTokenizer, ``[CLS] text [SEP]``), with [PAD] = 0.
    The WordPiece decoder does not "clean up" spaces, so decoding reproduces the space-separated format of the
    references ("weight ?", not "weight?"), which BLEU against the paper's data needs. ``[CLS]`` / ``[SEP]`` double
    as BOS / EOS for generation. ``model_max_length`` bounds inputs only; the paper truncates sentences to 20 tokens
    in preprocessing. The ``tokenizers`` trainer breaks frequency ties in a different order in every process, so two
    trainings on the same text may differ in a few rare pieces: save the tokenizer with the run and reuse it.
    """
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    logger.info("trained a WordPiece tokenizer with %d tokens", tokenizer.get_vocab_size())
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        bos_token="[CLS]",
        eos_token="[SEP]",
        model_max_length=model_max_length,
        model_input_names=list(MODEL_INPUT_NAMES),
        clean_up_tokenization_spaces=False,
    )


def make_tokenizer_config_portable(directory: str | os.PathLike[str]) -> bool:
    """Fix a saved ``tokenizer_config.json`` for this model: a ``tokenizer_class`` transformers 4.57 can load, and
    ``model_input_names`` without ``token_type_ids``.

    transformers 5.x saves generic fast tokenizers as ``"TokenizersBackend"``, a class 4.57 does not have. Call this
    on any directory a 5.x ``save_pretrained`` wrote (checkpoints included). Returns True when the file changed.
    """
    config_path = Path(directory) / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    fixed = dict(config, model_input_names=list(MODEL_INPUT_NAMES))
    if config.get("tokenizer_class") in (None, "TokenizersBackend"):
        fixed["tokenizer_class"] = PORTABLE_TOKENIZER_CLASS
    if fixed == config:
        return False
    config_path.write_text(json.dumps(fixed, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, out_dir: str | os.PathLike[str]) -> Path:
    """``save_pretrained`` plus :func:`make_tokenizer_config_portable`, so the files load in transformers 4.57 too
    and never return ``token_type_ids``."""
    out_dir = Path(out_dir)
    tokenizer.save_pretrained(str(out_dir))
    make_tokenizer_config_portable(out_dir)
    return out_dir


def load_tokenizer(name_or_path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained`` on a local directory (or the local HF cache), never downloading.

    BERT tokenizers have no BOS/EOS; ``[CLS]`` / ``[SEP]`` are set as BOS / EOS when missing so that seq2seq
    generation has its start and end tokens, as in :func:`train_wordpiece_tokenizer`. They also return
    ``token_type_ids``, which this model does not take: the tokenizer is loaded with ``model_input_names`` set to
    ``input_ids`` and ``attention_mask``, and saves so.
    """
    path = Path(name_or_path)
    if path.exists():
        if not path.is_dir():
            raise NotADirectoryError(f"a tokenizer is loaded from a directory, got the file {path}")
        tokenizer = AutoTokenizer.from_pretrained(str(path), model_input_names=list(MODEL_INPUT_NAMES))
    else:
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                str(name_or_path), local_files_only=True, model_input_names=list(MODEL_INPUT_NAMES)
            )
        except (OSError, ValueError) as err:
            raise FileNotFoundError(
                f"tokenizer {str(name_or_path)!r} not found: no such directory and not in the local Hugging Face "
                "cache (this project never downloads from the Hub)"
            ) from err
    if tokenizer.bos_token is None and tokenizer.cls_token is not None:
        tokenizer.bos_token = tokenizer.cls_token
    if tokenizer.eos_token is None and tokenizer.sep_token is not None:
        tokenizer.eos_token = tokenizer.sep_token
    return tokenizer
