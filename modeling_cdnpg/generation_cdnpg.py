"""Granularity-aware paraphrasing: `model.generate(**inputs, novelty=0.5, keep_details=0.5, num_return_sequences=5)`.

Beam search on a paraphrase model copies much of its input (a quarter of Quora questions come back verbatim), and
transformers' generic knobs against it (`encoder_no_repeat_ngram_size`, `encoder_repetition_penalty`) treat every
source word alike, so they break names and numbers as readily as the question's template. C-DNPG already knows which
is which: z (eq. 4) is ≈ 0 on sentence-level template tokens and ≈ 1 on phrase-level details. `novelty` uses it.

The rule (reasoning and measurements in docs/novelty.md):

- z is that of one encoder layer's self-attention, computed in the encoder pass that decoding uses: the layer named
  by `generation_config.novelty_z_layer` (default the top one), read as 1 - z when `novelty_z_inverted`. The
  resonance mask is nearly symmetric under z -> 1 - z, so which layer reads as the paper says (details high), and
  which way round, differs between trained models; `calibrate_granularity` finds it and stores it.
- A source bigram (a, b) (the decoder start token matching the source's first special token, so that the first word
  counts too) weighs w = 1 - max(z_a, z_b) over its non-special tokens: a bigram is as template-like as its most
  detailed token, so that no bigram inside or at the edge of a detail phrase is pushed apart. Bigrams ending in a
  special token weigh 0 (ending a sentence is never penalised). Given the tokenizer (generate()'s own `tokenizer`
  argument), words replace tokens: a word's z is its pieces' largest, and a bigram that ends inside a word weighs 0.
- While decoding, a hypothesis whose last token is a has `novelty * MAX_PENALTY * w` nats taken off token b (the
  largest w when the source has several bigrams (a, ·) ending in b): copying the template costs, copying a detail
  costs nothing. `SourceNgramPenaltyLogitsProcessor` is this rule for any n-gram size and any weights.
- A hypothesis that equals the source may not end (`NoCopyLogitsProcessor`), and the source with words appended is a
  candidate only when there is no other, unless `allow_copy=True`.
- `keep_details`, the other side of z: a small model trained on little data drops or garbles the source's names and
  rare words (it keeps a third of them where human paraphrases keep 60%). While decoding, a hypothesis that holds a
  source token fewer times than the source does gets `keep_details * MAX_BONUS * z` nats added to it, z being that
  token's (its word's) detail weight: template words are left to `novelty`, details are pulled back in, each as
  often as the source has it. `DetailBonusLogitsProcessor` is this rule for any weights.
- Without z (`granularity_mask="none"`, or `novelty_z_layer=None`) every bigram weighs 1 and every source token is
  kept with weight 1 (for the former, a warning).

Candidates and ranking: with `num_return_sequences=n` > 1 the n candidates come from n beam searches run one after
another (ceil(num_beams / n) beams each), each penalised also on the bigrams of the candidates already chosen (detail
tokens of the source exempt, as above; `DIVERSITY_PENALTY` nats): diverse beam search (Vijayakumar et al., 2018)
with groups decoded in turn rather than in lockstep, so that it runs on the standard beam search of transformers
4.57 and 5.x alike. From every group the best beam that is new (not empty, not chosen before, not the source) is
kept. Each candidate y of source x is scored

    score = log_likelihood - novelty * MAX_PENALTY * source_overlap + keep_details * MAX_BONUS * details_kept

with log_likelihood the mean log p(y_t | y_<t, x) over its tokens (end token included) under the model alone,
without any penalty (teacher-forced), source_overlap the mean bigram weight w over its tokens (0 for a token that
does not continue a source bigram) and details_kept the mean detail weight of the owed source tokens it wrote (0 for
the others): the quantity the beam search with both rules maximises, computed exactly. Candidates come back best
first, with their scores (`return_dict_in_generate=True`).

`novelty=0` is the model's own decoding, byte for byte: no penalty, no groups, no copy rule, the beams in their order
(with `keep_details` above 0, the model's own beam search with the pull towards the details alone).
The encoder runs once per `generate()` call: its output, expanded by transformers over beams and returned
sequences, serves every group and the scoring. Copied into every saved checkpoint (remote code): imports only torch
and transformers.
"""

import copy
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerBase
from transformers.utils import ModelOutput

NGRAM_SIZE = 2  # bigrams: a copied source bigram is what makes a paraphrase read as the source
MAX_PENALTY = 2.0  # nats off a template bigram's second token at novelty 1 (tuned on Quora, docs/novelty.md)
DIVERSITY_PENALTY = 2.0  # nats off a bigram of an earlier candidate (template tokens), whatever the novelty
MAX_BONUS = 4.0  # nats added to an owed detail token (z = 1) at keep_details 1 (tuned on Quora, docs/novelty.md)
NO_Z = (
    "novelty: this model has no granularity heads (granularity_mask='none'), so there is no z to tell template from "
    "detail: every source bigram is penalised, and every source token kept, alike (a uniform weight)"
)
UNCALIBRATED = (
    "novelty: this checkpoint's granularity is not calibrated, so the top encoder layer's z is used as it comes; "
    "which layer reads as the paper says (details high) differs between trained models: run "
    "generation_cdnpg.calibrate_granularity(model, tokenizer, texts) once and save the model"
)
UNSUPPORTED_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
DEFAULT_LAYER = -1  # the top encoder layer, when the checkpoint's generation_config names none (calibrate_granularity)
RESCORE_ELEMENTS = 2**24  # logits held at once when rescoring candidates (64 MiB of fp32)


@dataclass
class CDNPGParaphraseOutput(ModelOutput):
    """What `generate(..., novelty=x, return_dict_in_generate=True)` returns: for every input its
    `num_return_sequences` candidates, best first (rows `i * n` to `i * n + n - 1` belong to input i).

    sequences (`(batch * n, length)`): the candidates' ids; a row that could not be filled (fewer distinct
        candidates than asked for) is all padding, with score -inf.
    sequences_scores (`(batch * n,)`): the ranking score, log_likelihood - novelty * MAX_PENALTY * source_overlap
        + keep_details * MAX_BONUS * details_kept.
    log_likelihoods (`(batch * n,)`): mean log-probability of the candidate's tokens under the model alone.
    source_overlaps (`(batch * n,)`): mean template weight of the source bigrams the candidate repeats, in [0, 1].
    details_kept (`(batch * n,)`): mean detail weight of the source tokens the candidate keeps, in [0, 1].
    """

    sequences: torch.LongTensor | None = None
    sequences_scores: torch.FloatTensor | None = None
    log_likelihoods: torch.FloatTensor | None = None
    source_overlaps: torch.FloatTensor | None = None
    details_kept: torch.FloatTensor | None = None


# ------------------------------------------------------------------------------------------------------------------
# The rule: weighted source n-grams, and the penalty of a token that would continue one
# ------------------------------------------------------------------------------------------------------------------


def content_tokens(
    input_ids: torch.LongTensor, attention_mask: torch.Tensor, special_ids: torch.Tensor
) -> torch.Tensor:
    """(b, s) bool: the tokens that are text, neither padding nor special."""
    return attention_mask.bool() & ~torch.isin(input_ids, special_ids)


def word_starts(tokenizer, input_ids: torch.LongTensor) -> torch.Tensor:
    """(b, s) bool: whether each token starts a word, i.e. the tokenizer writes a space between it and the token
    before it (special tokens, and the tokens after them, start words). WordPiece's "##" pieces, byte-level BPE's
    pieces without "Ġ" and SentencePiece's without "▁" continue a word."""
    special = set(tokenizer.all_special_ids)
    starts = []
    for ids in input_ids.tolist():
        tokens = tokenizer.convert_ids_to_tokens(ids)
        row = [True]
        for j in range(1, len(ids)):
            joined = tokenizer.convert_tokens_to_string(tokens[j - 1 : j + 1]).strip()
            row.append(ids[j] in special or ids[j - 1] in special or any(c.isspace() for c in joined))
        starts.append(row)
    return torch.tensor(starts, dtype=torch.bool, device=input_ids.device)


def word_detail(detail: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Every token's detail (b, s) replaced by its word's, the largest over the word's pieces: a word is as much a
    detail as its most detailed piece."""
    word = starts.long().cumsum(-1) - 1
    per_word = torch.zeros_like(detail).scatter_reduce(1, word, detail, "amax", include_self=False)
    return per_word.gather(1, word)


def source_ngrams(
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor,
    detail: torch.Tensor,
    special_ids: torch.Tensor,
    starts: torch.Tensor | None = None,
    ngram_size: int = NGRAM_SIZE,
) -> tuple[torch.LongTensor, torch.Tensor]:
    """The n-grams of each source (b, k, n) and their template weights (b, k): 1 - max(detail) over the n-gram's
    non-special tokens. Weight 0 (and id -1, which no generated token matches) for an n-gram that ends in a special
    token, holds padding, has no other token, or, given word `starts` (b, s), ends inside a word: penalising that
    token would split the word into a non-word.

    detail (b, s): z of each source token, in [0, 1] (all 0 for a uniform weight).
    """
    ids = input_ids.masked_fill(~attention_mask.bool(), -1)
    windows = ids.unfold(1, ngram_size, 1)  # (b, k, n)
    special = torch.isin(windows, special_ids)
    details = detail.float().unfold(1, ngram_size, 1).masked_fill(special, 0.0)
    weights = 1 - details.amax(-1)
    valid = (windows >= 0).all(-1) & ~special[..., -1] & ~special.all(-1)
    if starts is not None:
        valid &= starts.unfold(1, ngram_size, 1)[..., -1]
    return windows.masked_fill(~valid[..., None], -1), weights.masked_fill(~valid, 0.0)


def diversity_ngrams(
    candidate: torch.LongTensor,
    source_ids: torch.LongTensor,
    detail: torch.Tensor,
    special_ids: torch.Tensor,
    tokenizer,
) -> tuple[torch.LongTensor, torch.Tensor]:
    """The bigrams of a candidate already chosen, and what repeating each costs a later candidate: DIVERSITY_PENALTY
    times its template weight, a token's detail being its largest z in the source (0 for a token not in it)."""
    token_detail = ((candidate[:, None] == source_ids[None, :]) * detail[None, :]).amax(-1)
    ids = candidate[None]
    starts = word_starts(tokenizer, ids) if tokenizer is not None else None
    grams, template = source_ngrams(ids, torch.ones_like(ids), token_detail[None], special_ids, starts)
    return grams[0], DIVERSITY_PENALTY * template[0]


def ngram_penalties(sequences: torch.LongTensor, ngrams: torch.LongTensor, weights: torch.Tensor) -> torch.Tensor:
    """For each position t of each sequence (r, t), the weight of the n-gram that token t completes (its largest
    weight if several match; 0 if none): what `SourceNgramPenaltyLogitsProcessor` took off that token.

    ngrams (r, k, n) and weights (r, k) are each row's own (already expanded to the rows).
    """
    context = ngrams.shape[-1] - 1
    padded = F.pad(sequences, (context, 0), value=-2)  # -2: before the start, matches nothing
    windows = padded.unfold(1, context + 1, 1)  # (r, t, n): token t with its context
    match = (windows[:, :, None, :] == ngrams[:, None, :, :]).all(-1)  # (r, t, k)
    return (match * weights[:, None, :]).amax(-1)


class PerInputLogitsProcessor(LogitsProcessor):
    """A processor that holds tensors per input (b, ...) and reads them per row: `generate()` passes the inputs
    expanded over beams or returned sequences, input-major (rows = b x expansion)."""

    def __init__(self, **per_input: torch.Tensor):
        self.per_input, self.per_row, self.rows = per_input, per_input, 0

    def expanded(self, rows: int) -> dict[str, torch.Tensor]:
        if rows != self.rows:  # once per generate() call
            expand, remainder = divmod(rows, next(iter(self.per_input.values())).shape[0])
            if remainder:
                raise ValueError(f"{rows} hypotheses are not a whole number per input")
            self.rows = rows
            self.per_row = {name: value.repeat_interleave(expand, 0) for name, value in self.per_input.items()}
        return self.per_row


class SourceNgramPenaltyLogitsProcessor(PerInputLogitsProcessor):
    """Takes `penalties[i, j]` off the score of token `ngrams[i, j, -1]` whenever a hypothesis of input i ends in
    `ngrams[i, j, :-1]`: a soft, weighted `encoder_no_repeat_ngram_size`. Where several n-grams end in the same
    token, the largest penalty applies.

    ngrams (b, k, n) and penalties (b, k) are per input; padded slots have id -1 and penalty 0. It works with any
    model's `generate()` (beams and returned sequences included), e.g. 1.5 nats off every source bigram of a BART:

        ngrams, weights = source_ngrams(input_ids, attention_mask, torch.zeros(input_ids.shape), special_ids)
        penalty = SourceNgramPenaltyLogitsProcessor(ngrams, 1.5 * weights)
        model.generate(input_ids, attention_mask=attention_mask, logits_processor=[penalty], num_beams=4)
    """

    def __init__(self, ngrams: torch.LongTensor, penalties: torch.Tensor):
        super().__init__(contexts=ngrams[..., :-1], targets=ngrams[..., -1].clamp(min=0), penalties=penalties)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows = self.expanded(input_ids.shape[0])
        size = rows["contexts"].shape[-1]
        suffix = F.pad(input_ids[:, -size:], (max(0, size - input_ids.shape[1]), 0), value=-2)  # (r, n - 1)
        match = (rows["contexts"] == suffix[:, None, :]).all(-1)  # (r, k)
        # min(score, score - penalty of each matching n-gram): the score less the largest penalty, in place
        penalised = scores.gather(1, rows["targets"]) - match * rows["penalties"].to(scores.dtype)
        return scores.scatter_reduce_(1, rows["targets"], penalised, "amin")


class NoCopyLogitsProcessor(PerInputLogitsProcessor):
    """Forbids the end token to a hypothesis whose tokens (special ones left out) are exactly its source's: an exact
    copy can never be finished, whatever the penalties.

    source_ids (b, s) with attention_mask (b, s); special_ids and eos_token_ids 1-D.
    """

    def __init__(self, source_ids: torch.LongTensor, attention_mask: torch.Tensor, special_ids, eos_token_ids):
        content = content_tokens(source_ids, attention_mask, special_ids)
        order = torch.sort((~content).int(), dim=1, stable=True).indices  # content tokens first, in their order
        tokens = source_ids.gather(1, order).masked_fill(~content.gather(1, order), -1)
        super().__init__(content=tokens, lengths=content.sum(-1))
        self.special_ids, self.eos_token_ids = special_ids, eos_token_ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows = self.expanded(input_ids.shape[0])
        content = rows["content"]
        is_content = ~torch.isin(input_ids, self.special_ids)
        index = is_content.long().cumsum(-1) - 1  # where each generated content token sits in the source's
        agrees = ~is_content | (
            (index < content.shape[1]) & (input_ids == content.gather(1, index.clamp(0, content.shape[1] - 1)))
        )
        copy_so_far = agrees.all(-1) & (is_content.sum(-1) == rows["lengths"])
        ends = scores[:, self.eos_token_ids]
        scores[:, self.eos_token_ids] = ends.masked_fill(copy_so_far[:, None], -math.inf)
        return scores


def earlier_copies(ids: torch.LongTensor) -> torch.Tensor:
    """(b, s): how many times each token already occurred before it in its row."""
    return (ids[:, :, None] == ids[:, None, :]).tril(-1).sum(-1)


class DetailBonusLogitsProcessor(PerInputLogitsProcessor):
    """Adds `bonuses[i, j]` to the score of source token `source_ids[i, j]` for a hypothesis of input i that holds
    that token no more often than the source does before j: a pull towards keeping each of the source's tokens once,
    as strong as the token is a detail (keep_details, module docstring). Where several source tokens are the same
    one, the largest bonus still owed applies.

    source_ids (b, s) and bonuses (b, s) are per input; give padding and special tokens bonus 0 (or id -1). It works
    with any model's `generate()`, e.g. 2 nats towards every source token of a BART (a uniform weight):

        keep = DetailBonusLogitsProcessor(input_ids, 2.0 * content_tokens(input_ids, attention_mask, special_ids))
        model.generate(input_ids, attention_mask=attention_mask, logits_processor=[keep], num_beams=4)
    """

    def __init__(self, source_ids: torch.LongTensor, bonuses: torch.Tensor):
        super().__init__(
            targets=source_ids.clamp(min=0),
            earlier=earlier_copies(source_ids),
            bonuses=bonuses.masked_fill(source_ids < 0, 0.0),
        )

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows = self.expanded(input_ids.shape[0])
        held = (input_ids[:, None, :] == rows["targets"][:, :, None]).sum(-1)  # (r, s): copies already generated
        owed = (held <= rows["earlier"]) * rows["bonuses"].to(scores.dtype)
        return scores + torch.zeros_like(scores).scatter_reduce_(1, rows["targets"], owed, "amax")


# ------------------------------------------------------------------------------------------------------------------
# Scoring candidates
# ------------------------------------------------------------------------------------------------------------------


def generated_mask(sequences: torch.LongTensor, eos_token_ids: torch.Tensor) -> torch.Tensor:
    """(r, t - 1): the generated tokens of each sequence (after the start token, up to its first end token)."""
    ended_before = torch.isin(sequences[:, 1:], eos_token_ids).long().cumsum(-1)
    ended_before = F.pad(ended_before[:, :-1], (1, 0))
    return ended_before == 0


@torch.no_grad()
def log_likelihoods(model, source_ids, encoder_states, attention_mask, sequences, eos_token_ids) -> torch.Tensor:
    """Mean log p(y_t | y_<t, x) over each sequence's generated tokens, teacher-forced, under the model alone.

    source_ids and attention_mask (r, s) and encoder_states (r, s, d) are already expanded to the rows of
    `sequences` (r, t); the source ids are where a copy mechanism puts its probabilities.
    """
    targets, counted = sequences[:, 1:], generated_mask(sequences, eos_token_ids)
    chunk = max(1, RESCORE_ELEMENTS // (targets.shape[1] * model.config.vocab_size))
    totals = []
    for start in range(0, sequences.shape[0], chunk):
        rows = slice(start, start + chunk)
        logits = model(
            input_ids=source_ids[rows],  # the encoder is not run again: its states are given
            encoder_outputs=(encoder_states[rows],),
            attention_mask=attention_mask[rows],
            decoder_input_ids=sequences[rows, :-1],
            use_cache=False,
        ).logits
        token = logits.float().log_softmax(-1).gather(-1, targets[rows, :, None]).squeeze(-1)
        totals.append((token * counted[rows]).sum(-1))
    return torch.cat(totals) / counted.sum(-1).clamp(min=1)


def source_overlaps(sequences, ngrams, weights, eos_token_ids) -> torch.Tensor:
    """Mean template weight of the source n-grams each sequence continues, over its generated tokens, in [0, 1]."""
    counted = generated_mask(sequences, eos_token_ids)
    penalties = ngram_penalties(sequences, ngrams, weights)[:, 1:]
    return (penalties * counted).sum(-1) / counted.sum(-1).clamp(min=1)


def detail_bonuses(sequences: torch.LongTensor, source_ids: torch.LongTensor, keep: torch.Tensor) -> torch.Tensor:
    """For each position t of each sequence (r, t), the detail weight `DetailBonusLogitsProcessor` gave token t: the
    largest `keep` of the source tokens equal to it that were still owed after the tokens before t.

    source_ids (r, s) and keep (r, s) are each row's own (already expanded to the rows).
    """
    same = sequences[:, :, None] == source_ids[:, None, :]  # (r, t, s)
    before = earlier_copies(sequences)  # (r, t): copies of token t generated before it
    owed = same & (before[:, :, None] <= earlier_copies(source_ids)[:, None, :])
    return (owed * keep[:, None, :]).amax(-1)


def details_kept(sequences, source_ids, keep, eos_token_ids) -> torch.Tensor:
    """Mean detail weight of the source tokens each sequence keeps, over its generated tokens, in [0, 1]."""
    counted = generated_mask(sequences, eos_token_ids)
    bonuses = detail_bonuses(sequences, source_ids, keep)[:, 1:]
    return (bonuses * counted).sum(-1) / counted.sum(-1).clamp(min=1)


# ------------------------------------------------------------------------------------------------------------------
# Which layer's z, which way round
# ------------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def calibrate_granularity(
    model, tokenizer, texts: list[str], common_tokens: int = 1000, batch_size: int = 64
) -> dict[str, object]:
    """Choose the encoder layer whose z best tells details from template, and its orientation; store both in
    `model.generation_config` (`novelty_z_layer`, `novelty_z_inverted`), which `save_pretrained` keeps.

    GA-attention learns z without labels, and the resonance mask is nearly symmetric under z -> 1 - z, so each
    layer's head may learn the paper's reading (details high) or its mirror image, or stay flat. Rare tokens stand
    in for details: per layer, separation = mean z of the tokens outside the `common_tokens` most frequent ones of
    `texts` minus mean z of the frequent ones. The layer with the largest |separation| is chosen, inverted when its
    separation is negative. Only the choice comes from frequencies; the weights stay z. Returns the choice and every
    layer's separation.
    """
    if model.config.granularity_mask == "none":
        raise ValueError("calibrate_granularity: this model has no granularity heads (granularity_mask='none')")
    special = set(tokenizer.all_special_ids)
    counts: dict[int, int] = {}
    for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:
        for token in ids:
            counts[token] = counts.get(token, 0) + 1
    common = sorted(counts, key=lambda token: -counts[token])[:common_tokens]
    common_ids = torch.tensor(common, device=model.device)
    special_ids = torch.tensor(sorted(special), device=model.device)
    sums, totals = 0.0, torch.zeros(2, device=model.device)
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(
            list(texts[start : start + batch_size]),
            padding=True,
            truncation=True,
            max_length=min(model.config.max_position_embeddings, tokenizer.model_max_length),
            return_tensors="pt",
        ).to(model.device)
        encoded = model.get_encoder()(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_granularities=True
        )
        z = torch.stack(encoded.granularities)  # (layers, b, s)
        content = content_tokens(batch["input_ids"], batch["attention_mask"], special_ids)
        frequent = content & torch.isin(batch["input_ids"], common_ids)
        groups = torch.stack([content & ~frequent, frequent]).float()  # (2, b, s): rare, frequent
        sums = sums + torch.einsum("lbs,gbs->lg", z, groups)
        totals += groups.sum((1, 2))
    means = sums / totals.clamp(min=1)
    separation = means[:, 0] - means[:, 1]
    layer = int(separation.abs().argmax())
    model.generation_config.novelty_z_layer = layer
    model.generation_config.novelty_z_inverted = bool(separation[layer] < 0)
    # a generation config marked as derived from the model config loses its own fields when loaded again
    model.generation_config._from_model_config = False
    return {
        "novelty_z_layer": layer,
        "novelty_z_inverted": bool(separation[layer] < 0),
        "separation": [round(float(value), 4) for value in separation],
    }


# ------------------------------------------------------------------------------------------------------------------
# generate(..., novelty=x)
# ------------------------------------------------------------------------------------------------------------------


def _token_ids(*values) -> list[int]:
    """The distinct ids among generation-config values that are None, an int, a list or a tensor."""
    ids = []
    for value in values:
        if torch.is_tensor(value):
            ids += value.flatten().tolist()
        elif isinstance(value, (list, tuple)):
            ids += list(value)
        elif value is not None:
            ids.append(value)
    return sorted(set(ids))


def _pad_stack(tensors: list[torch.Tensor], value: int | float) -> torch.Tensor:
    """Tensors (k_i, ...) padded with `value` along their first dimension to (len(tensors), max k_i, ...)."""
    width = max(1, max(tensor.shape[0] for tensor in tensors))
    padding = [(0, 0) * (tensor.dim() - 1) + (0, width - tensor.shape[0]) for tensor in tensors]
    return torch.stack([F.pad(tensor, pad, value=value) for tensor, pad in zip(tensors, padding)])


@dataclass
class ParaphraseSearch:
    """One `generate(novelty=..., keep_details=...)` call: its settings, read once, shared by every step."""

    generate: Callable  # the model's standard `GenerationMixin.generate`
    config: GenerationConfig  # with novelty_z_layer / _inverted; num_return_sequences is `wanted` here
    novelty: float = 0.0
    keep_details: float = 0.0
    wanted: int = 1  # candidates per input
    allow_copy: bool = False
    return_dict: bool = False
    processors: LogitsProcessorList = field(default_factory=LogitsProcessorList)  # the caller's, the detail pull
    model_kwargs: dict = field(default_factory=dict)
    tokenizer: PreTrainedTokenizerBase | None = None  # generate()'s own (stop strings): where words start


@dataclass
class WeighedSource:
    """A batch of sources read for `novelty` and `keep_details` (module docstring): the encoder's output, which
    decoding and scoring reuse; each token's detail (z of the chosen layer, per word given the tokenizer; 0 for a
    uniform weight); the weighted n-grams of `source_ngrams`; each token's weight to keep (its detail, 1 for a uniform
    weight, 0 for special tokens and padding); the ids the rules treat as special and as the end."""

    input_ids: torch.LongTensor
    attention_mask: torch.Tensor
    encoded: ModelOutput
    detail: torch.Tensor
    ngrams: torch.LongTensor
    weights: torch.Tensor
    keep: torch.Tensor
    special_ids: torch.Tensor
    eos_ids: torch.Tensor


def weigh_source(model, search: ParaphraseSearch, input_ids, attention_mask, token_type_ids=None) -> WeighedSource:
    """Run the encoder once and weigh the source's bigrams by how template-like they are, and its tokens by how much
    they are details: z of the encoder layer `novelty_z_layer` (1 - z if `novelty_z_inverted`), per word given the
    tokenizer; a uniform weight without granularity heads or layer."""
    config, layer = search.config, search.config.novelty_z_layer
    has_z = model.config.granularity_mask != "none"
    read_z = has_z and layer is not None
    encoded = model.get_encoder()(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        output_granularities=read_z,
        return_dict=True,
    )
    if read_z:
        z = encoded.granularities[layer]
        detail = (1 - z if config.novelty_z_inverted else z).masked_fill(~attention_mask.bool(), 0.0)
    else:
        detail = torch.zeros(input_ids.shape, device=input_ids.device)
    specials = [config.pad_token_id, config.bos_token_id, config.eos_token_id, config.decoder_start_token_id]
    special_ids = torch.tensor(_token_ids(*specials), device=input_ids.device)
    starts = word_starts(search.tokenizer, input_ids) if search.tokenizer is not None else None
    if starts is not None:
        detail = word_detail(detail, starts)
    ngrams, weights = source_ngrams(input_ids, attention_mask, detail, special_ids, starts)
    keep = (detail if read_z else torch.ones_like(detail)) * content_tokens(input_ids, attention_mask, special_ids)
    eos_ids = torch.tensor(_token_ids(config.eos_token_id), device=input_ids.device)
    encoded = type(encoded)(last_hidden_state=encoded.last_hidden_state, source_ids=input_ids)  # for a copy mechanism
    return WeighedSource(input_ids, attention_mask, encoded, detail, ngrams, weights, keep, special_ids, eos_ids)


def beam_search(search: ParaphraseSearch, source: WeighedSource, settings, processors) -> torch.LongTensor:
    """The model's own `generate` on the source, reusing its encoder pass, with extra logits processors."""
    return search.generate(
        source.input_ids,
        generation_config=settings,
        logits_processor=LogitsProcessorList([*search.processors, *processors]),
        attention_mask=source.attention_mask,
        encoder_outputs=copy.copy(source.encoded),  # a new one: generate() expands it in place
        **search.model_kwargs,
    )


class CandidateSelection:
    """Per input, the candidates chosen so far and the beams kept in reserve.

    A beam is new when its content (special tokens left out) is not empty, not chosen before and, unless
    `allow_copy`, not the source; the source with words appended ("... 2016 ? why ?", what a copy that may not end
    turns into) is a last resort, taken only when nothing else is left.
    """

    def __init__(self, search: ParaphraseSearch, source: WeighedSource):
        self.search, self.source, self.allow_copy = search, source, search.allow_copy
        self.special = set(source.special_ids.tolist())
        self.copies = [self.content(ids[mask.bool()]) for ids, mask in zip(source.input_ids, source.attention_mask)]
        self.chosen: list[list[torch.Tensor]] = [[] for _ in self.copies]
        self.taken: list[set[tuple[int, ...]]] = [{()} for _ in self.copies]
        self.reserve: list[list[torch.Tensor]] = [[] for _ in self.copies]
        self.last_resort: list[list[torch.Tensor]] = [[] for _ in self.copies]

    def content(self, ids: torch.Tensor) -> tuple[int, ...]:
        return tuple(token for token in ids.tolist() if token not in self.special)

    def verdict(self, i: int, ids: torch.Tensor) -> str | None:
        """Whether `ids` may be a candidate of input i: "new", "last resort", or None (never)."""
        tokens, copy_of_source = self.content(ids), self.copies[i]
        if tokens in self.taken[i] or (not self.allow_copy and tokens == copy_of_source):
            return None
        if not self.allow_copy and tokens[: len(copy_of_source)] == copy_of_source:
            return "last resort"
        return "new"

    def choose(self, i: int, ids: torch.Tensor) -> None:
        self.chosen[i].append(ids)
        self.taken[i].add(self.content(ids))

    def penalised_ngrams(self) -> tuple[torch.LongTensor, torch.Tensor]:
        """Per input (b, k, n) and (b, k): its source's n-grams at novelty * MAX_PENALTY times their weight, and the
        bigrams of its candidates chosen so far (`diversity_ngrams`)."""
        source, tokenizer, grams, costs = self.source, self.search.tokenizer, [], []
        for i, candidates in enumerate(self.chosen):
            bag = [(source.ngrams[i], self.search.novelty * MAX_PENALTY * source.weights[i])]
            bag += [
                diversity_ngrams(ids, source.input_ids[i], source.detail[i], source.special_ids, tokenizer)
                for ids in candidates
            ]
            grams.append(torch.cat([ngrams for ngrams, _ in bag]))
            costs.append(torch.cat([penalties for _, penalties in bag]))
        return _pad_stack(grams, -1), _pad_stack(costs, 0.0)

    def offer(self, sequences: torch.LongTensor, beams: int) -> None:
        """The beams of one search (`beams` rows per input, best first): per input, the first new one is chosen, the
        other new ones and the last resorts are kept for `fill`."""
        lengths = (1 + generated_mask(sequences, self.source.eos_ids).sum(-1)).tolist()
        for i in range(len(self.chosen)):
            found = [sequences[row, : lengths[row]] for row in range(i * beams, (i + 1) * beams)]
            verdicts = [self.verdict(i, ids) for ids in found]
            self.last_resort[i] += [ids for ids, verdict in zip(found, verdicts) if verdict == "last resort"]
            new = [ids for ids, verdict in zip(found, verdicts) if verdict == "new"]
            if new:
                self.choose(i, new[0])
            self.reserve[i] += new[1:]

    def fill(self) -> list[list[torch.Tensor]]:
        """Every input's candidates, those short of `wanted` made up from the reserve in order, then last resorts."""
        for i, chosen in enumerate(self.chosen):
            for ids in self.reserve[i] + self.last_resort[i]:
                if len(chosen) < self.search.wanted and self.verdict(i, ids) is not None:
                    self.choose(i, ids)
        return self.chosen


def decode_groups(search: ParaphraseSearch, source: WeighedSource) -> list[list[torch.Tensor]]:
    """Up to `wanted` candidates per input from `wanted` beam searches run one after another, each with
    ceil(num_beams / wanted) beams (all of them for one candidate), penalised on the source's n-grams and on those of
    the candidates chosen before; the best new beam of each search is chosen (`CandidateSelection`). Each group is a
    search of its own, so `wanted` may exceed num_beams."""
    settings = copy.deepcopy(search.config)
    settings.num_beams = max(1, math.ceil(search.config.num_beams / search.wanted))
    settings.num_return_sequences = settings.num_beams  # every beam: the later ones stand in for a repeated one
    copy_rule = []
    if not search.allow_copy:
        copy_rule.append(
            NoCopyLogitsProcessor(source.input_ids, source.attention_mask, source.special_ids, source.eos_ids)
        )
    selection = CandidateSelection(search, source)
    for _ in range(search.wanted):
        penalty = SourceNgramPenaltyLogitsProcessor(*selection.penalised_ngrams())
        selection.offer(beam_search(search, source, settings, [penalty, *copy_rule]), settings.num_beams)
    return selection.fill()


def score_candidates(model, search: ParaphraseSearch, source: WeighedSource, sequences) -> tuple[torch.Tensor, ...]:
    """(score, log_likelihood, source_overlap, details_kept) of each row of `sequences` (input-major, as many rows
    per input): score = log_likelihood - novelty * MAX_PENALTY * source_overlap
    + keep_details * MAX_BONUS * details_kept."""
    batch = source.input_ids.shape[0]
    rows = torch.arange(batch, device=sequences.device).repeat_interleave(sequences.shape[0] // batch)
    states = source.encoded.last_hidden_state[rows]
    likelihood = log_likelihoods(
        model, source.input_ids[rows], states, source.attention_mask[rows], sequences, source.eos_ids
    )
    overlap = source_overlaps(sequences, source.ngrams[rows], source.weights[rows], source.eos_ids)
    kept = details_kept(sequences, source.input_ids[rows], source.keep[rows], source.eos_ids)
    score = likelihood - search.novelty * MAX_PENALTY * overlap + search.keep_details * MAX_BONUS * kept
    return score, likelihood, overlap, kept


def ranked_candidates(model, search: ParaphraseSearch, source: WeighedSource, chosen: list[list[torch.Tensor]]):
    """The candidates as `wanted` rows per input, best first by their score; a row without a candidate is padding
    with score -inf. One candidate each is returned as it is, scored only for `return_dict`."""
    batch, wanted, device = len(chosen), search.wanted, source.input_ids.device
    length = max((ids.shape[0] for candidates in chosen for ids in candidates), default=2)
    sequences = torch.full((batch * wanted, length), search.config.pad_token_id or 0, dtype=torch.long, device=device)
    filled = torch.zeros(batch * wanted, dtype=torch.bool, device=device)
    for i, candidates in enumerate(chosen):
        for slot, ids in enumerate(candidates):
            sequences[i * wanted + slot, : ids.shape[0]] = ids
            filled[i * wanted + slot] = True
    if wanted == 1 and not search.return_dict:
        return sequences
    score, likelihood, overlap, kept = score_candidates(model, search, source, sequences)
    score, likelihood = score.masked_fill(~filled, -math.inf), likelihood.masked_fill(~filled, -math.inf)
    best_first = score.view(batch, wanted).argsort(dim=-1, descending=True, stable=True)
    order = (best_first + torch.arange(batch, device=device)[:, None] * wanted).flatten()
    if not search.return_dict:
        return sequences[order]
    overlap, kept = overlap.masked_fill(~filled, math.nan), kept.masked_fill(~filled, math.nan)
    return CDNPGParaphraseOutput(sequences[order], score[order], likelihood[order], overlap[order], kept[order])


def paraphrase_generate(
    model,
    generate: Callable,
    novelty: float,
    inputs: torch.LongTensor | None = None,
    generation_config: GenerationConfig | None = None,
    logits_processor: LogitsProcessorList | None = None,
    allow_copy: bool = False,
    keep_details: float = 0.0,
    **kwargs,
) -> torch.LongTensor | CDNPGParaphraseOutput:
    """`generate()` with `novelty` and `keep_details` (module docstring); `generate` is the model's standard
    `GenerationMixin.generate`. Weighs the source (`weigh_source`), decodes the candidate groups (`decode_groups`),
    and returns the candidates (batch * num_return_sequences, length) best first (`ranked_candidates`), or with
    `return_dict_in_generate=True` a `CDNPGParaphraseOutput` that adds their scores. `allow_copy=True` lets the
    source itself be a candidate. With `novelty=0` and `keep_details` above 0 it is the model's own beam search with
    the pull towards the details alone.
    """
    for name, value in (("novelty", novelty), ("keep_details", keep_details)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"{name} must be a number in [0, 1] (0: the model's own decoding), got {value!r}")
    config = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
    # n candidates are n searches of their own, so GenerationConfig's check of one search (n <= num_beams) must not
    # see n: it is kept out of the config until the model's own decoding (novelty 0) needs it
    wanted = kwargs.pop("num_return_sequences", None) or config.num_return_sequences or 1
    calibrated = hasattr(config, "novelty_z_layer")
    config.novelty_z_layer = getattr(config, "novelty_z_layer", DEFAULT_LAYER)
    config.novelty_z_inverted = getattr(config, "novelty_z_inverted", False)
    model_kwargs = config.update(**kwargs)  # novelty_z_layer / _inverted given to generate() win
    requested = [name for name in UNSUPPORTED_OUTPUTS if getattr(config, name, False)]
    if requested:
        raise ValueError(f"generate(novelty=...) returns candidates and their scores; it cannot also give {requested}")
    return_dict, config.return_dict_in_generate = config.return_dict_in_generate, False
    input_ids = inputs if inputs is not None else model_kwargs.pop("input_ids", None)
    if input_ids is None or "encoder_outputs" in model_kwargs or "inputs_embeds" in model_kwargs:
        raise ValueError("generate(novelty=...) needs the source as input_ids (it reads z from its own encoder pass)")
    processors = LogitsProcessorList(logits_processor or [])
    if novelty == 0:
        config.num_return_sequences = wanted
        if not return_dict and keep_details == 0:  # the model's own decoding, untouched
            return generate(input_ids, generation_config=config, logits_processor=processors, **model_kwargs)

    attention_mask = model_kwargs.pop("attention_mask", None)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    token_type_ids = model_kwargs.pop("token_type_ids", None)
    if model.config.granularity_mask == "none":
        warnings.warn(NO_Z, UserWarning, stacklevel=3)
    elif config.novelty_z_layer is not None and not calibrated:
        warnings.warn(UNCALIBRATED, UserWarning, stacklevel=3)
    search = ParaphraseSearch(
        generate, config, novelty, keep_details, wanted, allow_copy, return_dict, processors, model_kwargs,
        model_kwargs.get("tokenizer"),
    )  # fmt: skip
    source = weigh_source(model, search, input_ids, attention_mask, token_type_ids)
    if keep_details:
        search.processors.append(DetailBonusLogitsProcessor(source.input_ids, keep_details * MAX_BONUS * source.keep))
    if novelty == 0:  # the model's own sequences, in their order (with the pull towards the details)
        sequences = beam_search(search, source, config, [])
        if not return_dict:
            return sequences
        return CDNPGParaphraseOutput(sequences, *score_candidates(model, search, source, sequences))
    return ranked_candidates(model, search, source, decode_groups(search, source))


__all__ = [
    "CDNPGParaphraseOutput",
    "DetailBonusLogitsProcessor",
    "NoCopyLogitsProcessor",
    "PerInputLogitsProcessor",
    "SourceNgramPenaltyLogitsProcessor",
    "calibrate_granularity",
    "content_tokens",
    "paraphrase_generate",
    "source_ngrams",
]
