"""The paper's Figure 2 for any sentence, as numbers: the granularity z (eq. 4) of every layer, per word.

z = sigmoid(W_G h) is what each GA-attention module computes for each token: z ≈ 1 phrase-level detail, z ≈ 0
sentence-level template. :func:`word_granularities` runs a C-DNPG model on one sentence, reads z from every encoder
self-attention (and, optionally, every decoder self-attention over the model's own paraphrase) and aggregates word
pieces into words; :mod:`cdnpg.figures` draws the result.

Aggregation rule: a word's z is the largest z of its word pieces, words and z per word computed by the functions
decoding weighs words with (`generation_cdnpg.word_starts`, `word_detail`): a word is as much a detail as its
most detailed piece, and "?" after a word is a word of its own with every tokenizer. Chosen by measurement against the mean on the tuning half (docs/novelty.md);
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
from modeling_cdnpg.generation_cdnpg import DEFAULT_LAYER, weigh_source, word_detail, word_starts

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


def word_positions(
    tokenizer: PreTrainedTokenizerBase, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None
) -> list[list[list[int]]]:
    """Per row of `input_ids` (b, s), the positions of each word's pieces (decoding's word rule,
    `generation_cdnpg.word_starts`), in order; special tokens and padding belong to no word."""
    starts = word_starts(tokenizer, input_ids).tolist()
    special = set(tokenizer.all_special_ids)
    mask = attention_mask.tolist() if attention_mask is not None else [[1] * len(row) for row in starts]
    rows = []
    for ids, row_starts, row_mask in zip(input_ids.tolist(), starts, mask):
        words: list[list[int]] = []
        for position, (token, start, real) in enumerate(zip(ids, row_starts, row_mask)):
            if real and token not in special:
                if start or not words:
                    words.append([])
                words[-1].append(position)
        rows.append(words)
    return rows


def _span_text(text: str, offsets: Sequence[tuple[int, int]], positions: list[int]) -> str:
    """The text of a word's pieces (byte-level BPE's offsets include the space before a word)."""
    return text[min(offsets[p][0] for p in positions) : max(offsets[p][1] for p in positions)].strip()


def _words(
    tokenizer: PreTrainedTokenizerBase, ids: list[int], groups: list[list[int]], text: str | None = None, offsets=None
) -> list[str]:
    """Each word's text: its span of `text` when the tokenizer's offsets say where it is (an uncased tokenizer keeps
    the input's spelling), else its pieces joined as the tokenizer writes them."""
    if text is not None and offsets is not None and all(offsets[p][1] > offsets[p][0] for g in groups for p in g):
        return [_span_text(text, offsets, group) for group in groups]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    return [tokenizer.convert_tokens_to_string([pieces[p] for p in group]).strip() for group in groups]


def _read_words(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, text: str):
    """`text` as the model reads it: its batch of one on the model's device (truncated to what the model takes, with
    a warning), its words' token positions and texts (`word_positions`), and the part of `text` they come from."""
    text = text.strip()
    if not text:
        raise ValueError("the sentence is empty: there are no words to show")
    limit, reason = input_limit(model, tokenizer)
    batch = encode(tokenizer, [text], limit, reason)
    [groups] = word_positions(tokenizer, batch["input_ids"], batch["attention_mask"])
    if not groups:
        raise ValueError(f"the sentence {text!r} has no words once special tokens are left out")
    offsets = batch.encodings[0].offsets if batch.encodings else None
    words = _words(tokenizer, batch["input_ids"][0].tolist(), groups, text, offsets)
    if offsets is not None and batch.encodings[0].overflowing:  # truncated: the sentence is the part the model read
        text = text[: offsets[groups[-1][-1]][1]]
    return batch.to(model.device), groups, words, text


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
    starts: torch.Tensor,
    groups: list[list[int]],
    words: list[str],
    stack: str,
    sentence: str,
    description: str,
) -> list[LayerRow]:
    """One row per layer: each word's z by decoding's rule (`word_detail` over `word_starts`), read at the word's
    first piece."""
    firsts = [group[0] for group in groups]
    rows = []
    for layer, z in enumerate(granularities, start=1):
        per_word = word_detail(z[:1].float().cpu(), starts[:1].cpu())[0, firsts].tolist()
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
    Words are decoding's (`word_positions`); an over-long `text` is truncated to what the model
    takes, with a warning, and the rows' sentence is the part it read.
    """
    _check_model(model)
    batch, groups, words, text = _read_words(model, tokenizer, text)
    starts = word_starts(tokenizer, batch["input_ids"])

    encoder_out = model.get_encoder()(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_granularities=True
    )
    if encoder_out.granularities is None:
        raise GranularityUnavailableError("the model returned no encoder granularities (no granularity heads)")
    rows = _word_rows(
        encoder_out.granularities, starts, groups, words, "encoder", text, "encoder self-attention over the input"
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
    decoded = torch.tensor([sequence])
    [dec_groups] = word_positions(tokenizer, decoded)
    paraphrase = tokenizer.decode(sequence, skip_special_tokens=True)
    dec_words = _words(tokenizer, sequence, dec_groups)
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
    dec_rows = _word_rows(
        output.decoder_granularities, word_starts(tokenizer, decoded), dec_groups, dec_words, "decoder", paraphrase,
        description,
    )  # fmt: skip
    return rows + dec_rows


DETAIL_ENDS = ("0 = template", "1 = detail")  # the scale of what the rules read


def rules_reading(model: PreTrainedModel) -> tuple[int, bool, str]:
    """Which z novelty and keep_details read: the encoder layer (an index into `word_granularities`' rows), whether
    as 1 - z, and a caption saying so: the calibrated `novelty_z_layer` and `novelty_z_inverted` of the generation
    config (`cdnpg.calibration`), else the top layer's z as it is."""
    config, layers = model.generation_config, model.config.encoder_layers
    if getattr(config, "novelty_z_layer", None) is None:
        return DEFAULT_LAYER % layers, False, f"z of encoder layer {layers} (the top one: this z is not calibrated)"
    layer, inverted = config.novelty_z_layer % layers, bool(getattr(config, "novelty_z_inverted", False))
    read = f"1 − z of encoder layer {layer + 1}" if inverted else f"z of encoder layer {layer + 1}"
    return layer, inverted, f"{read} (the calibrated reading)"


@torch.inference_mode()
def word_details(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, text: str) -> LayerRow:
    """How much each word of `text` counts as a detail for novelty and keep_details, 0 (template) to 1 (detail): the
    detail decoding weighs the source with (`generation_cdnpg.weigh_source`, read as `rules_reading` says), per word
    as `word_granularities` has the words. Unlike raw z, 1 means detail whichever way calibration oriented z."""
    _check_model(model)
    layer, inverted, caption = rules_reading(model)
    batch, groups, words, text = _read_words(model, tokenizer, text)
    source = weigh_source(model, tokenizer, batch["input_ids"], batch["attention_mask"], layer, inverted)
    details = source.detail[0, [group[0] for group in groups]].float().cpu().tolist()
    return LayerRow(
        "detail", "encoder", words, details, text, f"detail as novelty and keep details read it: {caption}"
    )


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


@torch.no_grad()
def high_z_words(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: Sequence[str],
    threshold: float = 0.5,
    batch_size: int = 64,
) -> list[set[str]]:
    """Per source, its distinct words (lowercased) that z marks as details: z >= `threshold` in the encoder layer
    novelty decoding reads, oriented as calibrated (`novelty_z_layer`, `novelty_z_inverted` of the generation
    config), words and z per word as decoding and the figure have them (`word_positions`, `word_detail`). What
    keep_details rewards; empty sets for a model without z. Runs `batch_size` sources per encoder pass."""
    if model.config.granularity_mask == "none":
        return [set() for _ in sources]
    layer = getattr(model.generation_config, "novelty_z_layer", DEFAULT_LAYER)
    inverted = getattr(model.generation_config, "novelty_z_inverted", False)
    limit, reason = input_limit(model, tokenizer)
    found = []
    for start in range(0, len(sources), batch_size):
        texts = [source.strip() for source in sources[start : start + batch_size]]
        batch = encode(tokenizer, texts, limit, reason, range(start + 1, start + len(texts) + 1))
        z = model.get_encoder()(
            input_ids=batch["input_ids"].to(model.device),
            attention_mask=batch["attention_mask"].to(model.device),
            output_granularities=True,
        ).granularities[layer]
        z = z.float().cpu()
        # oriented, then per word, as decoding weighs it (`weigh_source`): inverted, a word's detail is its pieces'
        # largest 1 - z
        detail = word_detail(1 - z if inverted else z, word_starts(tokenizer, batch["input_ids"]))
        groups = word_positions(tokenizer, batch["input_ids"], batch["attention_mask"])
        for row, (text, words) in enumerate(zip(texts, groups)):
            offsets = batch.encodings[row].offsets if batch.encodings else None
            names = _words(tokenizer, batch["input_ids"][row].tolist(), words, text, offsets)
            found.append({name.lower() for name, group in zip(names, words) if detail[row, group[0]] >= threshold})
    return found
