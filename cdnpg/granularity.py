"""The paper's Figure 2 for any sentence, as numbers: the granularity z (eq. 4) of every layer, per word.

z = sigmoid(W_G h) is what each GA-attention module computes for each token: z ≈ 1 phrase-level detail, z ≈ 0
sentence-level template. :func:`word_granularities` runs a C-DNPG model on one sentence, reads z from every encoder
self-attention (and, optionally, every decoder self-attention over the model's own paraphrase) and aggregates word
pieces into words; :mod:`cdnpg.figures` draws the result.

Aggregation rule: a word's z is the largest z of its word pieces (words as the fast tokenizer's `word_ids()` defines
them), computed by the function decoding weighs words with (`generation_cdnpg.word_detail`): a word is as much a
detail as its most detailed piece. Chosen by measurement against the mean on the tuning half (docs/novelty.md);
special tokens ([CLS], [SEP], ...) are omitted.

    from cdnpg.granularity import word_granularities
    from cdnpg.figures import render_png, render_text

    rows = word_granularities(model, tokenizer, "how do i learn python ?", decoder=True)
    render_png(rows, "figure.png")
    print(render_text(rows))
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from cdnpg.inference import decoding_name, encode, generation_kwargs, input_limit, longest_text_length
from modeling_cdnpg.generation_cdnpg import word_detail

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


class GranularityUnavailableError(ValueError):
    """The model computes no z: the `granularity_mask="none"` baseline, or not a C-DNPG model at all."""


@dataclass
class LayerRow:
    """z of one layer's granularity head (eq. 4), one value per word of `sentence`.

    name: "encoder 1", "decoder 2", ... (1-based). stack: "encoder" or "decoder". sentence: the text the words come
    from (the input for encoder rows, the model's paraphrase for decoder rows). description: what the row shows,
    e.g. "decoder self-attention over the model's paraphrase (beam search, 8 beams)".
    """

    name: str
    stack: str
    words: list[str]
    z: list[float]
    sentence: str
    description: str


def _group_by_word(word_ids: Sequence[int | None]) -> list[list[int]]:
    """Token positions of each word, in order; positions with no word (special tokens) are left out."""
    groups: dict[int, list[int]] = {}
    for position, word in enumerate(word_ids):
        if word is not None:
            groups.setdefault(word, []).append(position)
    return list(groups.values())


def _span_text(text: str, offsets: Sequence[tuple[int, int]], positions: list[int]) -> str:
    return text[min(offsets[p][0] for p in positions) : max(offsets[p][1] for p in positions)]


def _decoder_words(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> tuple[str, list[str], list[list[int]]]:
    """The paraphrase's text, its words and each word's positions in `ids` (special tokens omitted).

    Words come from re-tokenizing the decoded text when that reproduces the generated pieces exactly; otherwise
    (e.g. a sequence that starts with a "##" continuation) pieces are joined by the WordPiece continuation prefix.
    """
    special = set(tokenizer.all_special_ids)
    kept = [p for p, token in enumerate(ids) if token not in special]
    pieces = [ids[p] for p in kept]
    text = tokenizer.decode(pieces, skip_special_tokens=True)
    again = tokenizer(text, add_special_tokens=False)
    if again["input_ids"] == pieces and again.encodings is not None:
        piece_groups = _group_by_word(again.word_ids())  # indices into `pieces`
        words = [_span_text(text, again.encodings[0].offsets, group) for group in piece_groups]
        return text, words, [[kept[i] for i in group] for group in piece_groups]
    prefix = getattr(getattr(tokenizer.backend_tokenizer, "model", None), "continuing_subword_prefix", None) or "##"
    words, groups = [], []
    for position, token in zip(kept, tokenizer.convert_ids_to_tokens(pieces)):
        if token.startswith(prefix) and words:
            words[-1] += token[len(prefix) :]
            groups[-1].append(position)
        else:
            words.append(token)
            groups.append([position])
    return text, words, groups


def _check_model(model: PreTrainedModel) -> None:
    if getattr(model.config, "granularity_mask", None) == "none":
        raise GranularityUnavailableError(
            "this model was trained with granularity_mask='none' (the plain Transformer baseline): it has no "
            "granularity heads, so there is no z to show"
        )
    if getattr(model.config, "model_type", None) != "cdnpg":
        raise GranularityUnavailableError(
            f"z exists only in C-DNPG models; this is a {getattr(model.config, 'model_type', '?')!r} model"
        )


def _word_rows(
    granularities: Sequence[torch.Tensor],
    groups: list[list[int]],
    words: list[str],
    stack: str,
    sentence: str,
    description: str,
) -> list[LayerRow]:
    """One row per layer: each word's z by decoding's rule (`word_detail`), read at the word's first piece."""
    length = granularities[0].shape[-1]
    starts = torch.ones(1, length, dtype=torch.bool)  # special tokens are words of their own
    for group in groups:
        starts[0, group[1:]] = False
    firsts = [group[0] for group in groups]
    rows = []
    for layer, z in enumerate(granularities, start=1):
        per_word = word_detail(z[:1].float().cpu(), starts)[0, firsts].tolist()
        rows.append(LayerRow(f"{stack} {layer}", stack, list(words), per_word, sentence, description))
    return rows


@torch.inference_mode()
def word_granularities(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    decoder: bool = False,
    num_beams: int | None = None,
    max_new_tokens: int | None = None,
) -> list[LayerRow]:
    """z per word of every encoder layer for `text`; with `decoder`, then z of every decoder self-attention.

    Decoder rows teacher-force the model's own paraphrase of `text`, decoded with its generation_config
    (`num_beams`, `max_new_tokens` override it): z of decoder position t belongs to the paraphrase token fed at t.
    Needs a fast tokenizer (`word_ids()`); an over-long `text` is truncated to what the model takes, with a warning.
    """
    _check_model(model)
    if not tokenizer.is_fast:
        raise TypeError("word_granularities needs a fast tokenizer: words come from its word_ids()")
    text = text.strip()
    if not text:
        raise ValueError("the sentence is empty: there are no words to show")
    limit, reason = input_limit(model, tokenizer)
    batch = encode(tokenizer, [text], limit, reason)
    groups = _group_by_word(batch.word_ids(0))
    if not groups:
        raise ValueError(f"the sentence {text!r} has no words once special tokens are left out")
    offsets = batch.encodings[0].offsets
    words = [_span_text(text, offsets, group) for group in groups]
    batch = batch.to(model.device)

    encoder_out = model.get_encoder()(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_granularities=True
    )
    if encoder_out.granularities is None:
        raise GranularityUnavailableError("the model returned no encoder granularities (no granularity heads)")
    rows = _word_rows(
        encoder_out.granularities, groups, words, "encoder", text, "encoder self-attention over the input"
    )
    if not decoder:
        return rows

    settings = generation_kwargs(
        model, longest_text_length(tokenizer, batch), num_beams=num_beams, max_new_tokens=max_new_tokens
    )
    sequence = model.generate(**batch, **settings)[0].tolist()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    end = next((i for i, token in enumerate(sequence) if i > 0 and token in eos_ids), len(sequence) - 1)
    sequence = sequence[: end + 1]  # the start token, the paraphrase, its EOS; beam padding after EOS dropped
    paraphrase, dec_words, dec_groups = _decoder_words(tokenizer, sequence)
    if not dec_groups:
        logger.warning("the model's paraphrase of %r is empty: no decoder rows to show", text)
        return rows
    output = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=torch.tensor([sequence], device=model.device),
        output_granularities=True,
        use_cache=False,
    )
    description = f"decoder self-attention over the model's paraphrase ({decoding_name(model, settings['num_beams'])})"
    return rows + _word_rows(output.decoder_granularities, dec_groups, dec_words, "decoder", paraphrase, description)


@torch.no_grad()
def granularity_spread(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: Sequence[str],
    targets: Sequence[str],
    max_length: int = 20,
) -> dict[str, list[float]] | None:
    """How far training moved z (eq. 4) from where a warm start puts it (0.5 everywhere): per layer, the standard
    deviation of z over the tokens of the pairs, truncated to `max_length` (the paper's 20): encoder self-attention
    over the sources, decoder self- and cross-attention over the teacher-forced targets. None for a model without z."""
    if getattr(model.config, "model_type", None) != "cdnpg" or model.config.granularity_mask == "none":
        return None
    batch = tokenizer(list(sources), text_target=list(targets), max_length=max_length, truncation=True,
                      padding=True, return_tensors="pt").to(model.device)  # fmt: skip
    target = batch["labels"] != tokenizer.pad_token_id
    labels = batch["labels"].masked_fill(~target, -100)
    out = model.eval()(**batch.data | {"labels": labels}, output_granularities=True)
    parts = {"encoder": (out.encoder_granularities, batch["attention_mask"].bool()),
             "decoder": (out.decoder_granularities, target), "cross": (out.cross_granularities, target)}  # fmt: skip
    return {part: [round(z[mask].std().item(), 4) for z in layers or ()] for part, (layers, mask) in parts.items()}


def high_z_words(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sources: Sequence[str], threshold: float = 0.5
) -> list[set[str]]:
    """Per source, its distinct words (lowercased) that z marks as details: z >= `threshold` in the encoder layer
    novelty decoding reads, oriented as calibrated (`novelty_z_layer`, `novelty_z_inverted` of the generation
    config). What keep_details rewards; empty sets for a model without z."""
    if model.config.granularity_mask == "none":
        return [set() for _ in sources]
    layer, inverted = model.generation_config.novelty_z_layer, model.generation_config.novelty_z_inverted
    rows = [word_granularities(model, tokenizer, source)[layer] for source in sources]
    return [{w.lower() for w, z in zip(row.words, row.z) if (1 - z if inverted else z) >= threshold} for row in rows]
