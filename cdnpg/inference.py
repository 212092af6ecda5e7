"""Inference helpers every front end (the command line, the demo page, `cdnpg.augment`) shares: loading a checkpoint
(`load_model`), how long an input the model takes
(and the warning when one is cut: the pipeline's, `pipeline_cdnpg.input_limit` and `truncated`), and the generation
settings (length and beams) for a batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cdnpg.errors import InputError
from modeling_cdnpg.pipeline_cdnpg import NO_LIMIT, input_limit, truncated  # one input rule for the CLI and pipeline

if TYPE_CHECKING:
    from transformers import BatchEncoding, PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

__all__ = ["decoding_name", "encode", "generation_kwargs", "input_limit", "load_model", "longest_text_length",
           "new_tokens", "resolve_device", "warn_long_inputs"]  # fmt: skip


def resolve_device(name: str) -> str:
    """`auto` -> cuda when available, else cpu; a CUDA device that is not there is an error, not a silent fallback."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {name}: CUDA is not available on this machine (use --device cpu or auto)")
    return name


def load_model(
    name_or_path: str, device: str = "auto", trust_remote_code: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer through the Auto classes, from a local directory or a Hub repo id, in eval mode.

    A missing model fails at once, naming the path, before the model is downloaded or loaded: a local path that is
    not there without asking the Hub, a Hub id with one request (`cdnpg.hub.resolve_model_source`).
    """
    from cdnpg.hub import resolve_model_source

    try:
        source = resolve_model_source(name_or_path)
    except InputError as err:
        raise InputError(f"--model {err}") from err
    where = "directory"
    if not Path(source).is_dir():
        logger.info("%s: no such directory, trying it as a Hugging Face Hub repo", name_or_path)
        where = "no such directory; as a Hub repo"

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import modeling_cdnpg  # noqa: F401  (registers C-DNPG with the Auto classes: local checkpoints need no remote code)

    device = resolve_device(device)
    logger.info("loading %s on %s", name_or_path, device)
    try:  # the model first: a wrong path or repo fails on its config.json, before any tokenizer file is tried
        model = AutoModelForSeq2SeqLM.from_pretrained(source, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"--model {name_or_path}: cannot load it ({where}): {reason}") from err
    return model.to(device).eval(), tokenizer


def warn_long_inputs(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    limit: int,
    reason: str,
    numbers: Sequence[int] | None = None,
) -> int:
    """One warning per input longer than the model takes (`truncated`: the pipeline says the same); returns the
    longest input's length in tokens after truncation, special tokens not counted.

    `numbers` names the inputs in the warnings (default 1, 2, ...), e.g. their line numbers in the input file.
    """
    numbers = list(numbers) if numbers is not None else list(range(1, len(texts) + 1))
    longest = 0
    # verbose=False: this warning replaces transformers' own "sequence length is longer than" one
    for number, ids in zip(numbers, tokenizer(list(texts), verbose=False)["input_ids"]):
        if note := truncated(len(ids), limit, reason):
            logger.warning("input %d %s", number, note)
        longest = max(longest, min(len(ids), limit))
    return max(0, longest - tokenizer.num_special_tokens_to_add())


def encode(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    limit: int,
    reason: str,
    numbers: Sequence[int] | None = None,
) -> BatchEncoding:
    """Tokenize a batch, truncating only what the model cannot take, with one warning per truncated input
    (`warn_long_inputs`)."""
    warn_long_inputs(tokenizer, texts, limit, reason, numbers)
    return tokenizer(
        list(texts),
        truncation=True,
        max_length=limit,
        padding=True,
        return_tensors="pt",
        return_token_type_ids=False,  # BERT tokenizers add them; the model (and generate) takes none
    )


def new_tokens(model: PreTrainedModel, input_tokens: int, max_new_tokens: int | None = None) -> int:
    """How many tokens a paraphrase may have: `max_new_tokens` if given. Otherwise the generation_config's length
    (`max_new_tokens`, or `max_length`; 20 new tokens for C-DNPG, the paper's setting), raised to `input_tokens` (the
    longest input of the batch, special tokens excluded) so that a longer input's paraphrase is not cut at the
    paper's 20 tokens; 2 × `input_tokens` + 10 when the config sets no length. Never more than the decoder's
    position table holds (`max_position_embeddings` - 1: the start token takes one position)."""
    config = model.generation_config
    positions = getattr(model.config, "max_position_embeddings", None)
    cap = int(positions) - 1 if positions else NO_LIMIT
    if max_new_tokens is not None:
        if max_new_tokens > cap:
            logger.warning(
                "max_new_tokens=%d is more than the decoder can take: using %d (max_position_embeddings=%s)",
                max_new_tokens,
                cap,
                positions,
            )
        length = max_new_tokens
    elif config.max_new_tokens is not None:
        length = max(config.max_new_tokens, input_tokens)
    elif config.max_length is not None:  # encoder-decoder: max_length counts the start token
        length = max(config.max_length - 1, input_tokens)
    else:
        length = 2 * input_tokens + 10
    return max(1, min(length, cap))


def generation_kwargs(
    model: PreTrainedModel, input_tokens: int, num_beams: int | None = None, max_new_tokens: int | None = None
) -> dict[str, int | None]:
    """Keyword arguments for `model.generate` of one paraphrase: `num_beams` if given, else the generation_config's
    (1 if unset), and the length of `new_tokens`. max_length=None: max_new_tokens alone decides, without
    transformers' "both were set" warning."""
    beams = num_beams if num_beams is not None else (model.generation_config.num_beams or 1)
    return {"num_beams": beams, "max_new_tokens": new_tokens(model, input_tokens, max_new_tokens), "max_length": None}


def longest_text_length(tokenizer: PreTrainedTokenizerBase, batch: BatchEncoding) -> int:
    """The longest input of an encoded batch in tokens, not counting the special tokens the tokenizer adds."""
    return max(0, int(batch["attention_mask"].sum(-1).max()) - tokenizer.num_special_tokens_to_add())


def decoding_name(model: PreTrainedModel, num_beams: int) -> str:
    """How the paraphrase was decoded, in words, for the figure's decoder rows."""
    if model.generation_config.do_sample:
        return "sampling"
    return "greedy decoding" if num_beams == 1 else f"beam search, {num_beams} beams"
