"""Inference helpers the `cdnpg` command line and the granularity figure share: how long an input the model takes
(and the warning when one is cut), and the generation settings (length and beams) for a batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from modeling_cdnpg.pipeline_cdnpg import NO_LIMIT  # the pipeline's: one "no real limit" for both

if TYPE_CHECKING:
    from transformers import BatchEncoding, PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def input_limit(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[int, str]:
    """The most input tokens (specials included) the model can take, and where that limit comes from.

    The learned position table (`max_position_embeddings`) is the hard limit; a tokenizer that declares a smaller
    `model_max_length` lowers it. The paper's 20-token truncation is a preprocessing choice, deliberately not applied.
    """
    limit, reason = None, ""
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions:
        limit, reason = int(positions), f"the model's max_position_embeddings={positions}"
    tokenizer_max = getattr(tokenizer, "model_max_length", None)
    if tokenizer_max and tokenizer_max < NO_LIMIT and (limit is None or tokenizer_max < limit):
        limit, reason = int(tokenizer_max), f"the tokenizer's model_max_length={tokenizer_max}"
    if limit is None:
        limit, reason = NO_LIMIT, "no limit declared"
    return limit, reason


def warn_long_inputs(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    limit: int,
    reason: str,
    numbers: Sequence[int] | None = None,
) -> int:
    """One warning per input longer than the model takes (it will be truncated to `limit` tokens); returns the
    longest input's length in tokens after truncation, special tokens not counted.

    `numbers` names the inputs in the warnings (default 1, 2, ...), e.g. their line numbers in the input file.
    """
    numbers = list(numbers) if numbers is not None else list(range(1, len(texts) + 1))
    longest = 0
    # verbose=False: this warning replaces transformers' own "sequence length is longer than" one
    for number, ids in zip(numbers, tokenizer(list(texts), verbose=False)["input_ids"]):
        if len(ids) > limit:
            logger.warning(
                "input %d has %d tokens, more than the model takes: truncated to its first %d tokens (%s)",
                number,
                len(ids),
                limit,
                reason,
            )
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


def generation_kwargs(
    model: PreTrainedModel,
    input_tokens: int,
    num_beams: int | None = None,
    num_return_sequences: int = 1,
    max_new_tokens: int | None = None,
) -> dict[str, int | None]:
    """Keyword arguments for `model.generate`: the model's generation_config unless overridden, within what fits.

    `input_tokens`: the longest input of the batch in tokens, special tokens excluded.
    Length: `max_new_tokens` if given. Otherwise the generation_config's length (`max_new_tokens`, or `max_length`;
    20 new tokens for C-DNPG, the paper's setting), raised to `input_tokens` for a longer input so that its paraphrase
    is not cut at the paper's 20 tokens; 2 × `input_tokens` + 10 when the config sets no length. Never more than the
    decoder's position table holds (`max_position_embeddings` - 1: the start token takes one position).
    Beams: `num_beams` if given, else the generation_config's (1 if unset), raised to `num_return_sequences` when
    that is larger (beam search returns at most one sequence per beam).
    """
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
    length = max(1, min(length, cap))
    beams = num_beams if num_beams is not None else (config.num_beams or 1)
    if num_return_sequences > beams and not config.do_sample:
        if num_beams is not None:
            raise ValueError(f"num_return_sequences={num_return_sequences} cannot exceed num_beams={num_beams}")
        logger.info("using %d beams to return %d sequences", num_return_sequences, num_return_sequences)
        beams = num_return_sequences
    # max_length=None: max_new_tokens alone decides, without transformers' "both were set" warning
    return {
        "num_beams": beams,
        "num_return_sequences": num_return_sequences,
        "max_new_tokens": length,
        "max_length": None,
    }


def longest_text_length(tokenizer: PreTrainedTokenizerBase, batch: BatchEncoding) -> int:
    """The longest input of an encoded batch in tokens, not counting the special tokens the tokenizer adds."""
    return max(0, int(batch["attention_mask"].sum(-1).max()) - tokenizer.num_special_tokens_to_add())


def decoding_name(model: PreTrainedModel, num_beams: int) -> str:
    """How the paraphrase was decoded, in words, for the figure's decoder rows."""
    if model.generation_config.do_sample:
        return "sampling"
    return "greedy decoding" if num_beams == 1 else f"beam search, {num_beams} beams"
