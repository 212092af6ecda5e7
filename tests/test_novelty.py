"""Granularity-aware paraphrasing (modeling_cdnpg/generation_cdnpg.py): the penalty rule, the copy rule, diverse ranked
candidates, and where users reach them: `paraphrase()`, `granularity_processors` with `model.generate`, the pipeline
(also in fresh processes with remote code, on transformers 5.x and 4.57) and `cdnpg paraphrase` through its entry
point.

Most mechanics run on `Copier`, a stand-in for a paraphrase model that copies its input, with z set by hand: what
the rule must change is then known exactly.
"""

import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoTokenizer, BartConfig, BartForConditionalGeneration, GenerationConfig, LogitsProcessor
from transformers.modeling_outputs import Seq2SeqLMOutput

from cdnpg.calibration import calibrate_granularity
from cdnpg.cli import main
from cdnpg.data import model_token_ids, template_corpus, train_wordpiece_tokenizer, write_template_corpus
from cdnpg.hub import save_checkpoint
from modeling_cdnpg import CDNPGForConditionalGeneration, CDNPGText2TextPipeline
from modeling_cdnpg.generation_cdnpg import (
    MAX_BONUS,
    MAX_PENALTY,
    DetailBonusLogitsProcessor,
    NoCopyLogitsProcessor,
    ParaphraseSettings,
    SourceNgramPenaltyLogitsProcessor,
    granularity_processors,
    paraphrase,
    source_ngrams,
    weigh_source,
    word_starts,
)
from modeling_cdnpg.modeling_cdnpg import CDNPGEncoderOutput
from modeling_cdnpg.pipeline_cdnpg import unreadable
from tests.conftest import BOS, EOS, PAD, printed_scores, tiny_config, tiny_model
from tests.test_cli import run_cli
from tests.test_hub import PYTHONS, run_isolated

ROOT = Path(__file__).resolve().parents[1]
SPECIALS = torch.tensor([PAD, BOS, EOS])
ALTERNATIVE = 40  # the copier's second choice at decoder position p is token ALTERNATIVE + p


class CopierEncoder(nn.Module):
    """Returns the source ids as its hidden states (the copier reads them back) and z = 1 on `detail` tokens, 0 on
    the others, in every layer; `rare_layer` instead marks tokens >= 30 (for the calibration test)."""

    main_input_name = "input_ids"

    def __init__(self, detail: set[int], layers: int = 2):
        super().__init__()
        self.detail, self.layers = detail, layers

    def forward(self, input_ids=None, attention_mask=None, output_granularities=None, **kwargs):
        z = torch.isin(input_ids, torch.tensor(sorted(self.detail) or [-1])).float()
        states = input_ids[..., None].float().expand(-1, -1, 4)
        return CDNPGEncoderOutput(last_hidden_state=states, granularities=(z,) * self.layers)


class Copier(CDNPGForConditionalGeneration):
    """A paraphrase model that copies its input: at decoder position p, source token p + 1 (after [CLS]; then [SEP],
    then the end) has log-probability ~0, token ALTERNATIVE + p is `cost` nats worse, everything else far worse."""

    def __init__(self, detail=(), cost: float = MAX_PENALTY / 2, **config):
        super().__init__(tiny_config(**config))
        self.encoder, self.cost = CopierEncoder(set(detail)), cost
        self.generation_config.use_cache = False  # the copier reads the whole prefix at every step
        self.generation_config.novelty_z_layer, self.generation_config.novelty_z_inverted = -1, False
        self.eval()

    def get_encoder(self, *args, **kwargs):
        return self.encoder

    def forward(self, attention_mask=None, decoder_input_ids=None, encoder_outputs=None, **kwargs):
        source = encoder_outputs[0][..., 0].long()  # (r, s)
        rows, length = decoder_input_ids.shape
        positions = torch.arange(length)
        copied = torch.nn.functional.pad(source, (0, length + 1), value=PAD)[:, positions + 1]
        copied = copied.masked_fill(copied == PAD, EOS)  # (r, t): what position p copies
        logits = torch.full((rows, length, self.config.vocab_size), -30.0)
        logits.scatter_(-1, copied[..., None], 0.0)
        logits[:, positions, ALTERNATIVE + positions] = -self.cost
        return Seq2SeqLMOutput(logits=logits.log_softmax(-1))


def sources(*rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[CLS] tokens [SEP], right-padded."""
    width = max(len(row) for row in rows) + 2
    ids = torch.full((len(rows), width), PAD)
    for i, row in enumerate(rows):
        ids[i, : len(row) + 2] = torch.tensor([BOS, *row, EOS])
    return ids, (ids != PAD).long()


def calibrated(model: CDNPGForConditionalGeneration) -> CDNPGForConditionalGeneration:
    """The model with its z read from the top layer as it comes, as calibrate_granularity would store it."""
    model.generation_config.novelty_z_layer, model.generation_config.novelty_z_inverted = -1, False
    return model


def para(model, ids: torch.Tensor, mask: torch.Tensor, **settings):
    """`paraphrase()` of a batch of id rows, without a tokenizer (every token a word)."""
    return paraphrase(model, None, {"input_ids": ids, "attention_mask": mask}, **settings)


def content(ids: torch.Tensor) -> list[int]:
    return [t for t in ids.tolist() if t not in (PAD, BOS, EOS)]


def bigrams(tokens: list[int]) -> set[tuple[int, int]]:
    return set(itertools.pairwise(tokens))


# ---------------------------------------------------------------------------------------------------------------------
# The rule
# ---------------------------------------------------------------------------------------------------------------------


def test_bigram_weight_is_one_minus_the_largest_z_and_specials_and_padding_weigh_nothing():
    ids, mask = sources([5, 6, 7], [8])
    detail = torch.tensor([[0.9, 0.2, 0.7, 0.1, 0.3], [0.9, 0.4, 0.6, 0.0, 0.0]])
    ngrams, weights = source_ngrams(ids, mask, detail, SPECIALS)
    assert ngrams[0].tolist() == [[BOS, 5], [5, 6], [6, 7], [-1, -1]]  # (7, [SEP]) ends in a special token
    torch.testing.assert_close(weights[0], torch.tensor([1 - 0.2, 1 - 0.7, 1 - 0.7, 0.0]))  # [CLS]'s z not counted
    assert ngrams[1].tolist() == [[BOS, 8], [-1, -1], [-1, -1], [-1, -1]]  # padding matches nothing
    torch.testing.assert_close(weights[1], torch.tensor([1 - 0.4, 0.0, 0.0, 0.0]))


def test_a_bigram_that_ends_inside_a_word_is_never_penalised():
    tokenizer = train_wordpiece_tokenizer(["how do i learn python quickly ?"] * 3, vocab_size=60, min_frequency=1)
    encoded = tokenizer(["how do i learn pythonic ?"], return_tensors="pt")
    pieces = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    starts = word_starts(tokenizer, encoded["input_ids"])[0].tolist()
    assert starts == [not piece.startswith("##") for piece in pieces]
    assert not all(starts), "the test needs a word split into pieces"
    special = torch.tensor(tokenizer.all_special_ids)
    detail = torch.zeros(encoded["input_ids"].shape)
    _, weights = source_ngrams(encoded["input_ids"], encoded["attention_mask"], detail, special, starts=None)
    word_aware, word_weights = source_ngrams(
        encoded["input_ids"], encoded["attention_mask"], detail, special, word_starts(tokenizer, encoded["input_ids"])
    )
    for k, piece in enumerate(pieces[1:]):
        if piece.startswith("##"):
            assert weights[0, k] == 1 and word_weights[0, k] == 0 and word_aware[0, k].tolist() == [-1, -1]


def test_penalty_applies_per_input_to_every_beam_row_and_takes_the_largest_of_matching_ngrams():
    ngrams = torch.tensor([[[5, 6], [5, 7], [9, 7]], [[5, 6], [-1, -1], [-1, -1]]])
    penalties = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.0, 0.0]])
    processor = SourceNgramPenaltyLogitsProcessor(ngrams, penalties)
    rows = torch.tensor([[BOS, 5], [BOS, 9], [BOS, 5], [BOS, 8]])  # 2 inputs x 2 beams, input-major
    scores = processor(rows, torch.zeros(4, 10))
    expected = torch.zeros(4, 10)
    expected[0, 6], expected[0, 7] = -1.0, -2.0  # input 0 after 5: (5, 6) and (5, 7)
    expected[1, 7] = -3.0  # input 0 after 9: (9, 7)
    expected[2, 6] = -0.5  # input 1 after 5
    torch.testing.assert_close(scores, expected)
    # the same target from two n-grams: the larger penalty, once
    twice = SourceNgramPenaltyLogitsProcessor(torch.tensor([[[5, 6], [5, 6]]]), torch.tensor([[1.0, 4.0]]))
    assert twice(torch.tensor([[BOS, 5]]), torch.zeros(1, 10))[0, 6] == -4.0


class CopyBias(LogitsProcessor):
    """Pushes a model to copy one source: +20 on the token that follows the hypothesis' last token in `source`."""

    def __init__(self, source: list[int]):
        self.next = dict(itertools.pairwise([BOS, *source]))

    def __call__(self, input_ids, scores):
        for row, last in enumerate(input_ids[:, -1].tolist()):
            if last in self.next:
                scores[row, self.next[last]] += 20.0
        return scores


def test_the_penalty_alone_keeps_every_source_bigram_out_of_another_models_beam_search():
    """Standalone, as its docstring shows: transformers' own BART (pushed to copy), 4 beams, 2 returned sequences."""
    config = BartConfig(vocab_size=60, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
                        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=BOS,
                        forced_eos_token_id=None)  # fmt: skip
    torch.manual_seed(0)
    bart = BartForConditionalGeneration(config).eval()
    ids, mask = sources([5, 6, 7, 8])
    settings = dict(attention_mask=mask, num_beams=4, num_return_sequences=2, max_new_tokens=6, min_new_tokens=6)
    copied = bart.generate(ids, logits_processor=[CopyBias([5, 6, 7, 8])], **settings)
    assert all(content(row)[:4] == [5, 6, 7, 8] for row in copied)
    ngrams, weights = source_ngrams(ids, mask, torch.zeros(ids.shape), SPECIALS)
    penalty = SourceNgramPenaltyLogitsProcessor(ngrams, 1e4 * weights)
    penalised = bart.generate(ids, logits_processor=[CopyBias([5, 6, 7, 8]), penalty], **settings)
    source = bigrams([BOS, 5, 6, 7, 8])
    assert all(not bigrams([BOS, *content(row)]) & source for row in penalised)


def test_no_copy_rule_forbids_ending_only_an_exact_copy():
    ids, mask = sources([5, 6], [7])
    processor = NoCopyLogitsProcessor(ids, mask, SPECIALS, torch.tensor([EOS]))
    rows = torch.tensor([[BOS, 5, 6], [BOS, 5, 8], [BOS, 6, 5], [BOS, 7, PAD]])  # 2 beams of input 0, 2 of input 1
    scores = processor(rows, torch.zeros(4, 10))
    assert scores[:, EOS].tolist() == [-math.inf, 0, 0, -math.inf], "rows 0 and 3 are their source, whole"
    assert (scores[:, :EOS] == 0).all() and (scores[:, EOS + 1 :] == 0).all()
    assert processor(torch.tensor([[BOS, 5], [BOS, 5], [BOS, 7], [BOS, 7]]), torch.zeros(4, 10))[0, EOS] == 0


def test_detail_bonus_applies_per_input_until_the_hypothesis_holds_as_many_copies_as_the_source():
    ids = torch.tensor([[5, 7, 5, -1], [9, -1, -1, -1]])  # input 0 holds 5 twice; -1 is padding
    bonuses = torch.tensor([[3.0, 2.0, 1.0, 9.0], [0.5, 9.0, 9.0, 9.0]])
    processor = DetailBonusLogitsProcessor(ids, bonuses)
    rows = torch.tensor([[BOS, 8, 8], [BOS, 5, 8], [BOS, 5, 5], [BOS, 8, 8], [BOS, 9, 8], [BOS, 8, 8]])
    scores = processor(rows, torch.zeros(6, 12))  # 2 inputs x 3 beams, input-major
    expected = torch.zeros(6, 12)
    expected[0, 5], expected[0, 7] = 3.0, 2.0  # nothing held: the larger of 5's two bonuses
    expected[1, 5], expected[1, 7] = 1.0, 2.0  # one 5 held: the second copy's bonus is still owed
    expected[2, 7] = 2.0  # both 5s held
    expected[3, 9] = expected[5, 9] = 0.5  # input 1's own bonus; its padding gives nothing, to no token
    torch.testing.assert_close(scores, expected)  # row 4 holds input 1's 9: nothing


def test_the_scores_parts_are_the_rules_amounts_averaged_over_the_generated_tokens_by_hand():
    """source_overlap and details_kept of candidates written by hand: each generated token (the end included, what
    follows it not) counts the largest weight of the source bigram it completes and the detail bonus still owed."""
    model = Copier(detail={8})
    ids, mask = sources([5, 6, 8, 9, 8])
    source = weigh_source(model, None, ids, mask)
    candidates = torch.tensor([[BOS, 5, 6, 8, 8, 8, EOS, PAD], [BOS, 7, 5, 6, EOS, 5, 6, 8]])
    from modeling_cdnpg.generation_cdnpg import score_candidates

    _, _, overlap, kept = score_candidates(model, source, candidates, novelty=1.0, keep_details=1.0)
    # row 0: 5 after [CLS] (w 1), 6 after 5 (w 1), 8 after 6 (w 0), 8 8 and [SEP] complete no source bigram: 2 / 6;
    # 8 is a detail owed twice: the first two 8s count 1, the third nothing: 2 / 6
    # row 1: 7 nothing, 5 nothing (not after [CLS]), 6 after 5 (1), [SEP] ends it: 1 / 4, and no detail
    torch.testing.assert_close(overlap, torch.tensor([2 / 6, 1 / 4]))
    torch.testing.assert_close(kept, torch.tensor([2 / 6, 0.0]))


def test_the_weight_to_keep_is_z_of_content_tokens_and_uniform_without_granularity_heads():
    ids, mask = sources([5, 8, 9], [8])

    def weighed(model):
        return weigh_source(model, None, ids, mask, layer=-1, inverted=False)

    with_z = weighed(Copier(detail={8}))
    assert with_z.keep.tolist() == [[0, 0, 1, 0, 0], [0, 1, 0, 0, 0]], "specials and padding keep nothing"
    uniform = weighed(tiny_model(granularity_mask="none"))
    assert uniform.keep.tolist() == [[0, 1, 1, 1, 0], [0, 1, 0, 0, 0]]


# ---------------------------------------------------------------------------------------------------------------------
# paraphrase() and granularity_processors
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        {"num_beams": 4},
        {"num_beams": 1},
        {"num_beams": 4, "num_return_sequences": 3},
        {"num_beams": 1, "do_sample": True},
    ],
    ids=["beam", "greedy", "beams-returned", "sampling"],
)
def test_novelty_zero_leaves_the_output_byte_identical(settings):
    model = calibrated(tiny_model())
    ids, mask = sources([5, 6, 7, 8, 9], [10, 11])
    torch.manual_seed(0)
    outputs = [model.generate(ids, attention_mask=mask, max_new_tokens=8, **settings)]
    for extra in ({}, {"novelty": 0}, {"keep_details": 0}, {"novelty": 0, "keep_details": 0}):
        torch.manual_seed(0)
        outputs.append(para(model, ids, mask, max_new_tokens=8, **settings, **extra).sequences)
    torch.manual_seed(0)
    rules = granularity_processors(model, None, {"input_ids": ids, "attention_mask": mask})
    outputs.append(model.generate(ids, attention_mask=mask, max_new_tokens=8, logits_processor=rules, **settings))
    assert len(rules) == 0 and all(torch.equal(outputs[0], output) for output in outputs[1:])


def test_a_high_penalty_removes_template_bigrams_while_a_detail_is_still_copied():
    """Source 5 6 8 9 with 8 a detail (z = 1): at novelty 1 the copier must leave every template bigram (cost
    MAX_PENALTY > its second choice's cost) yet keep 8 after 6, since (6, 8) weighs 1 - max(0, 1) = 0. A uniform
    weight (no z) loses the detail there; plain decoding copies."""
    model = Copier(detail={8})
    ids, mask = sources([5, 6, 8, 9], [12, 13, 14])  # a batch: the second input pads the first's rows
    template = bigrams([BOS, 5, 6, 8, 9]) - {(6, 8), (8, 9)}
    plain = model.generate(ids, attention_mask=mask, num_beams=4, max_new_tokens=8)
    assert content(plain[0]) == [5, 6, 8, 9] and content(plain[1]) == [12, 13, 14]

    found = para(model, ids, mask, num_beams=4, max_new_tokens=8, novelty=1.0).sequences
    first = [BOS, *content(found[0])]
    assert not bigrams(first) & template, first
    assert (6, 8) in bigrams(first) and 8 in first, "the detail is copied where it follows the template"
    assert not bigrams([BOS, *content(found[1])]) & bigrams([BOS, 12, 13, 14]), "the other input, its own"
    # the same rules through transformers' own generate(): the same first candidate
    rules = granularity_processors(model, None, {"input_ids": ids, "attention_mask": mask}, novelty=1.0)
    assert torch.equal(
        model.generate(ids, attention_mask=mask, num_beams=4, max_new_tokens=8, logits_processor=rules)[
            0, : found.shape[1]
        ],
        found[0],
    )

    uniform = para(model, ids, mask, num_beams=4, max_new_tokens=8, novelty=1.0, novelty_z_layer=None).sequences
    assert (6, 8) not in bigrams([BOS, *content(uniform[0])]), "without z, (6, 8) is template like the rest"


class Discourage(LogitsProcessor):
    """Takes `cost` nats off one token at every step: a model that would rather not write it."""

    def __init__(self, token: int, cost: float):
        self.token, self.cost = token, cost

    def __call__(self, input_ids, scores):
        scores[:, self.token] -= self.cost
        return scores


def test_keep_details_brings_back_a_detail_the_model_would_drop_by_its_z_and_scores_it():
    """The copier is made to drop detail 8 (3 nats off it; its second choice costs 0.5). keep_details 1 adds
    MAX_BONUS x z(8) = 4 nats while 8 is owed: it is kept (4 - 3 > -0.5), and the other tokens are still copied.
    At keep_details 0.5 (2 nats) it is still dropped, and with z the wrong way round 8 weighs 0."""
    model = Copier(detail={8}, cost=0.5)
    ids, mask = sources([5, 6, 8, 9])
    settings = dict(num_beams=4, max_new_tokens=8, logits_processor=[Discourage(8, 3.0)])
    assert 8 not in content(model.generate(ids, attention_mask=mask, **settings)[0])
    kept = para(model, ids, mask, keep_details=1.0, **settings)
    assert content(kept.sequences[0]) == [5, 6, 8, 9]
    rules = granularity_processors(model, None, {"input_ids": ids, "attention_mask": mask}, keep_details=1.0)
    in_generate = model.generate(
        ids, attention_mask=mask, **{**settings, "logits_processor": [Discourage(8, 3.0), *rules]}
    )
    assert content(in_generate[0]) == [5, 6, 8, 9], "the rule alone, in transformers' generate()"
    assert 8 not in content(para(model, ids, mask, keep_details=0.5, **settings).sequences[0])
    assert 8 not in content(para(model, ids, mask, keep_details=1.0, novelty_z_inverted=True, **settings).sequences[0])
    # the score is what the search maximised: only 8 of its five tokens (5 6 8 9 [SEP]) was a detail owed
    torch.testing.assert_close(kept.details_kept[0], torch.tensor(1 / 5))
    torch.testing.assert_close(kept.sequences_scores[0], kept.log_likelihoods[0] + MAX_BONUS * kept.details_kept[0])


def test_the_source_itself_is_never_returned_unless_allowed_nor_with_words_appended_unless_nothing_else():
    model = Copier(detail={5, 6, 7})  # all detail: no penalty at all, only the copy rule
    ids, mask = sources([5, 6, 7])
    beams = para(model, ids, mask, num_beams=4, max_new_tokens=8, novelty=0.1).sequences
    assert content(beams[0])[:3] != [5, 6, 7], "neither the copy nor the copy with a word appended"
    greedy = para(model, ids, mask, num_beams=1, max_new_tokens=8, novelty=0.1).sequences
    assert content(greedy[0])[:3] == [5, 6, 7] and len(content(greedy[0])) > 3, "the one hypothesis: a last resort"
    allowed = para(model, ids, mask, num_beams=4, max_new_tokens=8, novelty=0.1, allow_copy=True).sequences
    assert content(allowed[0]) == [5, 6, 7]
    rules = granularity_processors(model, None, {"input_ids": ids, "attention_mask": mask}, novelty=0.1)
    ended = model.generate(ids, attention_mask=mask, num_beams=1, max_new_tokens=8, logits_processor=rules)
    assert content(ended[0])[:3] == [5, 6, 7] and len(content(ended[0])) > 3, "the copy rule, in generate()"


@pytest.mark.parametrize("keep_details", [0.0, 0.25])
def test_candidates_are_distinct_never_the_input_and_ranked_by_their_returned_score(keep_details):
    model = Copier(detail={8})
    ids, mask = sources([5, 6, 8, 9], [12, 13])
    out = para(
        model, ids, mask, num_beams=4, max_new_tokens=8, novelty=0.5, num_return_sequences=3,
        keep_details=keep_details,
    )  # fmt: skip
    assert out.sequences.shape[0] == 6
    for i, source in enumerate(([5, 6, 8, 9], [12, 13])):
        rows = slice(3 * i, 3 * i + 3)
        texts = [tuple(content(row)) for row in out.sequences[rows]]
        assert len(set(texts)) == 3 and tuple(source) not in texts and () not in texts
        scores = out.sequences_scores[rows]
        assert (scores[:-1] >= scores[1:]).all(), "best first"
        expected = out.log_likelihoods[rows] - 0.5 * MAX_PENALTY * out.source_overlaps[rows]
        torch.testing.assert_close(scores, expected + keep_details * MAX_BONUS * out.details_kept[rows])
        assert ((out.source_overlaps[rows] >= 0) & (out.source_overlaps[rows] <= 1)).all()
        assert ((out.details_kept[rows] >= 0) & (out.details_kept[rows] <= 1)).all()


def test_more_candidates_than_beams_come_from_as_many_searches_each_with_at_least_one_beam():
    """Each candidate group is a beam search of its own: 5 candidates with 2 beams is 5 one-beam searches, not a
    single search asked for more sequences than it has beams (which transformers refuses)."""
    model = Copier(detail={8})
    ids, mask = sources([5, 6, 8, 9])
    out = para(model, ids, mask, num_beams=2, max_new_tokens=8, novelty=1.0, num_return_sequences=5)
    assert out.sequences.shape[0] == 5
    filled = out.sequences_scores > -math.inf
    texts = [tuple(content(row)) for row, full in zip(out.sequences, filled) if full]
    assert len(texts) == len(set(texts)) >= 2 and (5, 6, 8, 9) not in texts
    assert (out.sequences_scores[:-1] >= out.sequences_scores[1:]).all(), "best first"


def test_log_likelihood_is_the_models_own_mean_token_log_probability():
    model = Copier(detail=set(), cost=1.5)
    ids, mask = sources([5, 6])
    out = para(model, ids, mask, num_beams=2, max_new_tokens=6, novelty=0.0)
    assert content(out.sequences[0]) == [5, 6], "novelty 0: the copy"
    # [CLS] 5 6 [SEP]: three tokens, each the copier's first choice, log p = log_softmax of (0, -1.5, -30, ...)
    first_choice = torch.tensor([0.0, -1.5] + [-30.0] * 58).log_softmax(0)[0]
    torch.testing.assert_close(out.log_likelihoods[0], first_choice)
    # 5 and 6 continue source bigrams of weight 1 ([CLS] 5, 5 6); ending ([SEP]) is never copying
    torch.testing.assert_close(out.source_overlaps[0], torch.tensor(2 / 3))


def test_candidates_of_a_random_model_are_distinct_and_padded_rows_say_so():
    model = calibrated(tiny_model())
    ids, mask = sources([5, 6, 7, 8, 9], [10, 11])
    out = para(model, ids, mask, max_new_tokens=6, novelty=0.5, num_return_sequences=4)
    for i in range(2):
        rows = out.sequences[4 * i : 4 * i + 4]
        filled = out.sequences_scores[4 * i : 4 * i + 4] > -math.inf
        texts = [tuple(content(row)) for row, full in zip(rows, filled) if full]
        assert len(texts) == len(set(texts)) >= 1
        assert all(content(row) == [] for row, full in zip(rows, filled) if not full)


def test_the_settings_decode_alike_as_one_dataclass_or_as_keywords_and_defaults_come_from_the_generation_config():
    """`paraphrase(model, tokenizer, inputs, ParaphraseSettings(...))` is the keyword call; not both at once. Settings
    not given are the generation config's (a default num_candidates raised to num_return_sequences), named as its own
    when wrong."""
    model = Copier(detail={8})
    ids, mask = sources([5, 6, 8, 9], [12, 13])
    inputs, decoding = {"input_ids": ids, "attention_mask": mask}, dict(num_beams=4, max_new_tokens=8)
    settings = ParaphraseSettings(novelty=0.5, keep_details=0.25, num_return_sequences=3)
    given = paraphrase(model, None, inputs, settings, **decoding)
    keywords = paraphrase(model, None, inputs, novelty=0.5, keep_details=0.25, num_return_sequences=3, **decoding)
    assert torch.equal(given.sequences, keywords.sequences)
    assert torch.equal(given.sequences_scores, keywords.sequences_scores)
    with pytest.raises(TypeError, match="as settings= or as keywords, not both: novelty"):
        paraphrase(model, None, inputs, settings, novelty=0.5)
    config = GenerationConfig(novelty=0.5, num_candidates=2, rank_by="score+rewording")
    defaults = ParaphraseSettings.from_generation_config(config, num_return_sequences=3, keep_details=None)
    assert (defaults.novelty, defaults.keep_details, defaults.candidates) == (0.5, 0.0, 3)
    assert defaults.weights == {"score": 1.0, "rewording": 1.0}
    assert ParaphraseSettings.from_generation_config(config, novelty=0.25).novelty == 0.25
    config.novelty = 2
    with pytest.raises(ValueError, match=r"^generation_config.novelty must be a number in \[0, 1\]"):
        ParaphraseSettings.from_generation_config(config)
    with pytest.raises(ValueError, match=r"^novelty must be a number in \[0, 1\]"):
        ParaphraseSettings(novelty=2)


def test_bad_novelty_is_refused_with_its_value():
    model = calibrated(tiny_model())
    ids, mask = sources([5, 6])
    inputs = {"input_ids": ids, "attention_mask": mask}
    for value in (-0.1, 1.5, "high", True):
        with pytest.raises(ValueError, match="novelty must be a number in \\[0, 1\\]"):
            para(model, ids, mask, novelty=value)
        with pytest.raises(ValueError, match="keep_details must be a number in \\[0, 1\\]"):
            para(model, ids, mask, keep_details=value)
        with pytest.raises(ValueError, match="novelty must be a number in \\[0, 1\\]"):
            granularity_processors(model, None, inputs, novelty=value)
    with pytest.raises(ValueError, match="granularity_processors"):
        para(model, ids, mask, novelty=0.5, output_scores=True, return_dict_in_generate=True)


def test_a_model_without_granularity_heads_warns_and_uses_a_uniform_weight():
    model = tiny_model(granularity_mask="none")
    ids, mask = sources([5, 6, 7])
    with pytest.warns(UserWarning, match="no granularity heads.*uniform weight"):
        para(model, ids, mask, max_new_tokens=4, novelty=0.5)
    with pytest.warns(UserWarning, match="no granularity heads.*uniform weight"):
        granularity_processors(model, None, {"input_ids": ids, "attention_mask": mask}, novelty=0.5)


def test_an_uncalibrated_checkpoint_says_so_and_the_novelty_default_comes_from_the_generation_config():
    model = tiny_model()
    ids, mask = sources([5, 6, 7])
    with pytest.warns(UserWarning, match="not calibrated"):
        expected = para(model, ids, mask, max_new_tokens=4, novelty=0.5).sequences
    model.generation_config.novelty = 0.5
    model.generation_config.novelty_z_layer, model.generation_config.novelty_z_inverted = -1, False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(para(model, ids, mask, max_new_tokens=4).sequences, expected)


def test_calibration_picks_the_layer_that_tells_rare_tokens_from_frequent_ones_and_its_orientation():
    tokenizer = train_wordpiece_tokenizer(["how do i learn python ?", "what is a rare word ?"] * 5, min_frequency=1)
    texts = ["how do i learn python ?"] * 8 + ["what is a rare word ?"]
    model = tiny_model(vocab_size=len(tokenizer))
    rare = {t for t in tokenizer(texts[-1])["input_ids"]} - set(tokenizer(texts[0])["input_ids"])

    class TwoLayers(CopierEncoder):
        def forward(self, input_ids=None, attention_mask=None, output_granularities=None, **kwargs):
            z = torch.isin(input_ids, torch.tensor(sorted(rare))).float()
            flat = torch.full_like(z, 0.5)
            layers = (flat, 0.4 + 0.2 * z, 1 - 0.9 * z) if self.layers == 3 else (flat, 0.4 + 0.2 * z)
            return CDNPGEncoderOutput(last_hidden_state=None, granularities=layers)

    model.get_encoder = lambda: TwoLayers(set(), layers=3)
    found = calibrate_granularity(model, tokenizer, texts, common_tokens=6)
    assert found["novelty_z_layer"] == 2 and found["novelty_z_inverted"], found  # the mirror image reads best
    assert found["separation"][0] == 0 and found["separation"][1] > 0 > found["separation"][2]
    assert (model.generation_config.novelty_z_layer, model.generation_config.novelty_z_inverted) == (2, True)
    model.get_encoder = lambda: TwoLayers(set(), layers=2)
    assert calibrate_granularity(model, tokenizer, texts, common_tokens=6)["novelty_z_inverted"] is False


def test_calibration_reads_texts_longer_than_the_model_takes():
    tokenizer = train_wordpiece_tokenizer(["how do i learn python ?"] * 3, vocab_size=60, min_frequency=1)
    model = tiny_model(vocab_size=len(tokenizer))  # 64 positions
    long = "how do i learn python ? " * 30  # 180 tokens
    found = calibrate_granularity(model, tokenizer, [long, "why ?"], common_tokens=0)
    # what the model takes of it, by hand: its first 62 tokens and the two special ones
    cut = tokenizer.decode(tokenizer(long, truncation=True, max_length=64)["input_ids"], skip_special_tokens=True)
    by_hand = calibrate_granularity(model, tokenizer, [cut, "why ?"], common_tokens=0)
    assert found["separation"] == pytest.approx(by_hand["separation"], abs=1e-4)
    assert all(value != 0 for value in found["separation"]), "every token rare here: its mean z, never 0"


# ---------------------------------------------------------------------------------------------------------------------
# The pipeline and the command line
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    corpus = template_corpus(num_train=300, num_valid=10, num_test=10, seed=0)["train"]
    return train_wordpiece_tokenizer([*corpus["source"], *corpus["target"]], vocab_size=300, min_frequency=1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer):
    model = tiny_model(**model_token_ids(tokenizer))
    with torch.no_grad():  # special tokens score 0: the random model's paraphrases are words, never only [UNK]/[SEP]
        model.get_input_embeddings().weight[tokenizer.all_special_ids] = 0
    corpus = template_corpus(num_train=300, num_valid=10, num_test=10, seed=0)["train"]
    calibrate_granularity(model, tokenizer, corpus["source"][:100], common_tokens=50)
    return save_checkpoint(model, tokenizer, tmp_path_factory.mktemp("novelty") / "tiny")


SENTENCE = "how can i learn machine learning ?"


def test_checkpoint_carries_the_generation_code_and_its_calibration(checkpoint):
    assert (checkpoint / "generation_cdnpg.py").is_file()
    code = (checkpoint / "generation_cdnpg.py").read_text()
    imports = [line.split()[1] for line in code.splitlines() if line.startswith(("import ", "from "))]
    assert {name.split(".")[0] for name in imports} <= {"copy", "math", "warnings", "collections", "dataclasses",
                                                        "torch", "transformers"}  # fmt: skip
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    assert isinstance(generation["novelty_z_layer"], int) and isinstance(generation["novelty_z_inverted"], bool)


def test_high_z_words_are_the_words_decoding_weighs_as_details_in_either_orientation(checkpoint):
    """The words (the figure's) whose detail, as decoding weighs it (`weigh_source`: z of the calibrated layer,
    oriented, then the largest over the word's pieces), passes the threshold: what keep_details rewards. Below the
    lowest every word, above the highest none, and at 0.5 exactly those."""
    from cdnpg.granularity import high_z_words, word_granularities, word_positions

    model = CDNPGForConditionalGeneration.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    layer = model.generation_config.novelty_z_layer
    encoded = tokenizer([SENTENCE], return_tensors="pt", return_token_type_ids=False)
    [groups] = word_positions(tokenizer, encoded["input_ids"], encoded["attention_mask"])
    words = [word.lower() for word in word_granularities(model, tokenizer, SENTENCE)[0].words]
    found = {}
    for inverted in (False, True):
        model.generation_config.novelty_z_inverted = inverted
        source = weigh_source(model, tokenizer, encoded["input_ids"], encoded["attention_mask"], layer, inverted)
        weight = [source.detail[0, group[0]].item() for group in groups]  # decoding's, per word
        assert high_z_words(model, tokenizer, [SENTENCE], threshold=min(weight))[0] == set(words)
        assert high_z_words(model, tokenizer, [SENTENCE], threshold=max(weight) + 1e-6)[0] == set()
        found[inverted] = high_z_words(model, tokenizer, [SENTENCE])[0]
        assert found[inverted] == {word for word, value in zip(words, weight) if value >= 0.5}, (weight, inverted)
    assert found[False] != found[True], "the orientation matters"


def test_pipeline_returns_ranked_candidates_with_their_scores(checkpoint):
    model = CDNPGForConditionalGeneration.from_pretrained(checkpoint)
    paraphraser = CDNPGText2TextPipeline(
        model=model, tokenizer=AutoTokenizer.from_pretrained(checkpoint), device="cpu"
    )
    candidates = paraphraser(SENTENCE, novelty=0.5, num_return_sequences=3, max_new_tokens=8)
    assert 1 <= len(candidates) <= 3
    assert all(
        set(c) == {"generated_text", "score", "log_likelihood", "source_overlap", "details_kept"} for c in candidates
    )
    scores = [c["score"] for c in candidates]
    assert scores == sorted(scores, reverse=True)
    assert len({c["generated_text"] for c in candidates}) == len(candidates)
    plain = paraphraser(SENTENCE, max_new_tokens=8)
    assert [set(c) for c in plain] == [{"generated_text"}]
    reverse = paraphraser(
        SENTENCE, novelty=0.5, num_return_sequences=3, max_new_tokens=8, rank_by="reverse_likelihood"
    )
    assert [c["score"] for c in reverse] == [c["reverse_log_likelihood"] for c in reverse]
    assert [c["score"] for c in reverse] == sorted((c["score"] for c in reverse), reverse=True)
    assert {c["generated_text"] for c in reverse} == {c["generated_text"] for c in candidates}


@pytest.mark.parametrize("num_beams", [2, 4])
def test_pipeline_gives_more_novelty_candidates_than_beams(checkpoint, num_beams):
    paraphraser = CDNPGText2TextPipeline(
        model=CDNPGForConditionalGeneration.from_pretrained(checkpoint),
        tokenizer=AutoTokenizer.from_pretrained(checkpoint),
        device="cpu",
    )
    candidates = paraphraser(SENTENCE, novelty=0.5, num_return_sequences=5, num_beams=num_beams, max_new_tokens=8)
    assert 2 <= len(candidates) <= 5
    assert len({c["generated_text"] for c in candidates}) == len(candidates)
    scores = [c["score"] for c in candidates]
    assert scores == sorted(scores, reverse=True)


def test_pipeline_warns_when_it_returns_fewer_candidates_than_asked(checkpoint):
    """Fewer candidates than asked are never returned silently. The copier has few distinct paraphrases in it: the
    pipeline says how many of how many, naming the input, through the warnings module."""
    from modeling_cdnpg.pipeline_cdnpg import FewerCandidatesWarning

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    paraphraser = CDNPGText2TextPipeline(model=Copier(vocab_size=len(tokenizer)), tokenizer=tokenizer, device="cpu")
    with pytest.warns(FewerCandidatesWarning) as caught:
        candidates = paraphraser([SENTENCE, "why ?"], novelty=0.9, num_return_sequences=12, num_beams=1,
                                 max_new_tokens=3)  # fmt: skip
    counts = [len(found) for found in candidates]
    assert all(count < 12 for count in counts)
    messages = [str(warning.message) for warning in caught]
    assert len(messages) == 2, messages
    assert any(message.startswith(f"{SENTENCE!r}: {counts[0]} of 12 candidates: ") for message in messages), messages
    named = repr(tokenizer.decode(tokenizer("why ?")["input_ids"], skip_special_tokens=True))
    assert any(message.startswith(f"{named}: {counts[1]} of 12 candidates: ") for message in messages), messages
    assert all("more num_beams may find more" in message for message in messages)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FewerCandidatesWarning)
        assert len(paraphraser(SENTENCE, novelty=0.9, num_return_sequences=1, max_new_tokens=3)) == 1


@pytest.mark.parametrize("text", ["", "   ", "\t\n", "北京欢迎你"])
def test_pipeline_gives_nothing_readable_no_paraphrase_and_warns(checkpoint, text, caplog):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    paraphraser = CDNPGText2TextPipeline(
        model=CDNPGForConditionalGeneration.from_pretrained(checkpoint), tokenizer=tokenizer, device="cpu"
    )
    assert unreadable(tokenizer, text)
    with caplog.at_level("WARNING"):
        assert paraphraser(text, max_new_tokens=4) == []
        together = paraphraser([SENTENCE, text, SENTENCE], max_new_tokens=4)
    assert together[1] == [] and len(together[0]) == len(together[2]) == 1
    assert "input 2" in caplog.text and "no paraphrase" in caplog.text
    assert unreadable(tokenizer, SENTENCE) is None


def test_pipeline_and_cli_detokenise_alike(checkpoint):
    """The command line paraphrases through the pipeline: "what ' s" never reaches the user."""
    from cdnpg.commands import paraphrase

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    paraphraser = CDNPGText2TextPipeline(model=Copier(vocab_size=len(tokenizer)), tokenizer=tokenizer, device="cpu")
    text = "what's the best way to learn ?"
    assert tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])[1:4] == ["what", "'", "s"]
    expected = [{"generated_text": "what's the best way to learn?"}]
    assert paraphraser(text, num_beams=2, max_new_tokens=12) == expected
    assert paraphrase(paraphraser, [text, ""], num_beams=2, max_new_tokens=12) == [expected, []]


@pytest.mark.parametrize("python", PYTHONS)
def test_fresh_process_paraphrase_processors_and_pipeline_with_novelty(python, checkpoint, tmp_path):
    """The remote code alone (no modeling_cdnpg package): paraphrase() and granularity_processors reached with
    transformers' get_class_from_dynamic_module, generate() with the rules, and the pipeline, as in this process."""
    model = CDNPGForConditionalGeneration.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    inputs = tokenizer([SENTENCE, "what is the best way to travel ?"], return_tensors="pt", padding=True)
    expected = paraphrase(model, tokenizer, inputs, max_new_tokens=8, novelty=0.5, num_return_sequences=2)
    kept = paraphrase(
        model, tokenizer, inputs, max_new_tokens=8, novelty=0.5, keep_details=0.5, num_return_sequences=2
    )
    rules = granularity_processors(model, tokenizer, inputs, novelty=0.5, keep_details=0.5)
    ruled = model.generate(**inputs, max_new_tokens=8, logits_processor=rules)
    plain = model.generate(**inputs, max_new_tokens=8)
    got = run_isolated(
        python,
        f"""
        import json, torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
        from transformers.dynamic_module_utils import get_class_from_dynamic_module
        path = {str(checkpoint)!r}
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        model = AutoModelForSeq2SeqLM.from_pretrained(path, trust_remote_code=True)
        paraphrase = get_class_from_dynamic_module("generation_cdnpg.paraphrase", path)
        processors = get_class_from_dynamic_module("generation_cdnpg.granularity_processors", path)
        inputs = tokenizer({[SENTENCE, "what is the best way to travel ?"]!r}, return_tensors="pt", padding=True)
        ids = paraphrase(model, tokenizer, inputs, max_new_tokens=8, novelty=0.5, num_return_sequences=2)
        kept = paraphrase(model, tokenizer, inputs, max_new_tokens=8, novelty=0.5, keep_details=0.5,
                          num_return_sequences=2)
        rules = processors(model, tokenizer, inputs, novelty=0.5, keep_details=0.5)
        ruled = model.generate(**inputs, max_new_tokens=8, logits_processor=rules).tolist()
        zero = paraphrase(model, tokenizer, inputs, max_new_tokens=8, novelty=0, keep_details=0).sequences.tolist()
        paraphraser = pipeline("text2text-generation", model=path, trust_remote_code=True)
        candidates = paraphraser({SENTENCE!r}, novelty=0.5, num_return_sequences=2, max_new_tokens=8)
        detailed = paraphraser({SENTENCE!r}, keep_details=0.5, max_new_tokens=8)
        try:  # no embedder given: the one line that says how to get one
            paraphraser({SENTENCE!r}, rank_by="score+similarity", max_new_tokens=8)
        except ValueError as error:
            refused = str(error)
        cosines = lambda sources, candidates: torch.full((len(candidates),), 0.5)  # any embedder will do
        similar = paraphraser({SENTENCE!r}, rank_by="score+similarity", similarity=cosines, max_new_tokens=8)
        print(json.dumps({{"ids": ids.sequences.tolist(), "kept": kept.sequences.tolist(), "ruled": ruled,
                          "zero": zero, "candidates": candidates, "detailed": detailed, "refused": refused,
                          "similar": similar, "module": type(model).__module__}}))
        """,
        cwd=tmp_path,
    )
    assert got["module"].startswith("transformers_modules")
    assert got["ids"] == expected.sequences.tolist() and got["kept"] == kept.sequences.tolist()
    assert got["ruled"] == ruled.tolist() and got["zero"] == plain.tolist()
    assert 1 <= len(got["candidates"]) <= 2 and all("score" in c for c in got["candidates"])
    assert len(got["detailed"]) == 1 and "details_kept" in got["detailed"][0]
    assert "needs a sentence embedder: pass similarity=SentenceSimilarity.from_pretrained(PATH)" in got["refused"]
    assert "from cdnpg.ranking import SentenceSimilarity" in got["refused"]
    assert [candidate["similarity"] for candidate in got["similar"]] == [0.5]


def test_cli_novelty_prints_distinct_candidates_with_their_scores_best_first(checkpoint):
    result = run_cli("paraphrase", "--model", str(checkpoint), "--novelty", "0.5", "-n", "3", "--max-new-tokens", "8",
                     SENTENCE, "")  # fmt: skip
    assert result.returncode == 0, result.stderr
    first, empty = result.stdout[:-1].split("\n")
    fields = first.split("\t")
    texts, scores = fields[0::2], [float(score) for score in fields[1::2]]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert 1 <= len(texts) <= 3 and len(set(texts)) == len(texts)
    assert tokenizer.decode(tokenizer(SENTENCE)["input_ids"], skip_special_tokens=True) not in texts
    assert scores == sorted(scores, reverse=True)
    assert empty == "" and "warning: input 2 is empty: no paraphrase" in result.stderr


def test_cli_novelty_gives_more_candidates_than_beams(checkpoint):
    result = run_cli("paraphrase", "--model", str(checkpoint), "--novelty", "0.5", "-n", "5", "--num-beams", "2",
                     "--max-new-tokens", "8", SENTENCE)  # fmt: skip
    assert result.returncode == 0, result.stderr
    texts = result.stdout.rstrip("\n").split("\t")[0::2]
    assert 2 <= len(texts) <= 5 and len(set(texts)) == len(texts)


def test_cli_prints_what_the_pipeline_returns(checkpoint):
    """Through the entry point: one decoding and detokenisation for the command and the pipeline."""
    result = run_cli("paraphrase", "--model", str(checkpoint), "-n", "2", "--max-new-tokens", "8", SENTENCE)
    assert result.returncode == 0, result.stderr
    paraphraser = CDNPGText2TextPipeline(
        model=CDNPGForConditionalGeneration.from_pretrained(checkpoint),
        tokenizer=AutoTokenizer.from_pretrained(checkpoint),
        device="cpu",
    )
    expected = paraphraser(SENTENCE, num_beams=8, num_return_sequences=2, max_new_tokens=8)  # the model's 8 beams
    assert result.stdout == "\t".join(" ".join(c["generated_text"].split()) for c in expected) + "\n"


def test_cli_novelty_out_of_range_is_a_usage_error(capsys):
    assert main(["paraphrase", "--model", "m", "text", "--novelty", "1.5"]) == 2
    assert "--novelty must be between 0 and 1" in capsys.readouterr().err
    assert main(["paraphrase", "--model", "m", "text", "--keep-details", "-0.5"]) == 2
    assert "--keep-details must be between 0 and 1" in capsys.readouterr().err


def test_cli_keep_details_prints_what_the_pipeline_returns_with_its_score(checkpoint):
    result = run_cli("paraphrase", "--model", str(checkpoint), "--keep-details", "0.5", "--novelty", "0.25",
                     "--max-new-tokens", "8", SENTENCE)  # fmt: skip
    assert result.returncode == 0, result.stderr
    paraphraser = CDNPGText2TextPipeline(
        model=CDNPGForConditionalGeneration.from_pretrained(checkpoint),
        tokenizer=AutoTokenizer.from_pretrained(checkpoint),
        device="cpu",
    )
    [expected] = paraphraser(SENTENCE, keep_details=0.5, novelty=0.25, max_new_tokens=8)
    text, score = result.stdout.rstrip("\n").split("\t")
    assert text == " ".join(expected["generated_text"].split())
    assert score in printed_scores(expected["score"])  # 3 decimals of the score computed in another process


# ---------------------------------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_benchmark_quick_scores_every_setting_against_beam_search_and_reports_them(checkpoint, tmp_path, capsys):
    """`benchmarks/novelty.py --quick` on the tiny checkpoint: every family of settings decoded and scored, the anchors,
    the candidates, and report.py's table of them. No quality is asserted (a random model says nothing), except what holds by
    construction: copying the source keeps every detail, beam search is its own time reference, novelty copies
    nothing whole."""
    files = write_template_corpus(tmp_path / "data", num_train=80, num_valid=24, num_test=2, seed=0)
    out = tmp_path / "novelty"
    completed = subprocess.run(
        [
            sys.executable, str(ROOT / "benchmarks" / "novelty.py"), str(checkpoint), "--quick",
            "--train_file", str(files["train"]), "--valid_file", str(files["valid"]),
            "--output_dir", str(out),
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "| beam search |" in completed.stdout and "| novelty 0.5 |" in completed.stdout
    from common import group_runs, read_runs

    runs = read_runs([out / "runs-report.jsonl"])
    assert {run["settings"]["pairs"] for run in runs} == {12} and {run["settings"]["split"] for run in runs} == {
        "report"
    }
    rows = group_runs(runs, key="setting", replicate="model")
    rows = {name: group[0] for name, group in rows.items()}
    families = {row["family"] for row in rows.values()}
    assert families == {
        "beam", "z", "uniform", "keep", "keep_uniform", "keep_alone", "no_repeat", "anchor"
    }  # fmt: skip
    for name, row in rows.items():
        if row["family"] != "anchor":
            assert all(math.isfinite(row["metrics"][key]) for key in ("bleu4", "ibleu", "self_bleu4", "copy_rate")), (
                name
            )
            assert row["time_s"] > 0
    assert rows["beam search"]["metrics"]["time_ratio"] == 1
    assert rows["novelty 0.5"]["metrics"]["copy_rate"] == 0
    assert rows["novelty 0.5, keep details 1.0"]["kwargs"] == {"novelty": 0.5, "keep_details": 1.0}
    assert rows["copy the source"]["metrics"]["rare_kept"] == 100
    from tests.test_quality_smoke import load_benchmark

    capsys.readouterr()
    load_benchmark("report").main([str(out / "runs-report.jsonl")])
    table = capsys.readouterr().out
    assert "| beam search |" in table and "| novelty 0.5 |" in table


def test_benchmark_settings_decodes_only_those_named_with_beam_search_and_refuses_an_unknown_one(checkpoint, tmp_path):
    from tests.test_quality_smoke import load_benchmark

    novelty = load_benchmark("novelty")
    files = write_template_corpus(tmp_path / "data", num_train=80, num_valid=8, num_test=2, seed=0)
    flags = [str(checkpoint), "--quick", "--train_file", str(files["train"]), "--valid_file", str(files["valid"])]
    runs = novelty.main([*flags, "--settings", "novelty 0.5", "--output_dir", str(tmp_path / "out")])
    decoded = [run["setting"] for run in runs if run["family"] not in ("anchor", "candidates")]
    assert decoded == ["beam search", "novelty 0.5"]  # beam search always: the timings are read against it
    with pytest.raises(
        SystemExit, match=re.escape("--settings novelty 0.3: not a setting of this model; one of: beam search")
    ):
        novelty.main([*flags, "--settings", "novelty 0.3", "--output_dir", str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()  # refused before anything is decoded


def test_benchmark_beam_search_is_the_models_own_on_a_checkpoint_that_ships_a_default_novelty(paraphrasers, tmp_path):
    """The recipe writes novelty 0.25 into the checkpoint's generation config, which the pipeline applies when called
    without decoding arguments: novelty.py leaves it out, so that "beam search" is beam search (it was novelty 0.25,
    the same figures as the novelty row) and the run records what the checkpoint ships."""
    from tests.test_quality_smoke import load_benchmark

    novelty = load_benchmark("novelty")
    checkpoint, shipped = paraphrasers["resonance"], tmp_path / "shipped"  # a trained one: novelty changes its output
    shutil.copytree(checkpoint, shipped)
    config = GenerationConfig.from_pretrained(checkpoint)
    config.novelty = 0.5  # as run.py --generation_novelty writes it; a config derived from the model's keeps no
    config._from_model_config = False  # key of its own when loaded (transformers), so run.py's is not derived
    config.save_pretrained(shipped)
    files = write_template_corpus(tmp_path / "data", num_train=80, num_valid=24, num_test=2, seed=0)
    flags = ["--quick", "--train_file", str(files["train"]), "--valid_file", str(files["valid"]), "--settings",
             "novelty 0.5"]  # fmt: skip
    runs = {}
    for name, folder in (("plain", checkpoint), ("shipped", shipped)):
        novelty.main([str(folder), *flags, "--output_dir", str(tmp_path / name)])
        runs[name] = json.loads((tmp_path / name / "samples-report.json").read_text())
    assert runs["shipped"]["beam search"] == runs["plain"]["beam search"]
    assert runs["plain"]["beam search"] != runs["plain"]["novelty 0.5"], "the two settings differ on these pairs"
    recorded = [json.loads(line) for line in (tmp_path / "shipped" / "runs-report.jsonl").read_text().splitlines()]
    assert {json.dumps(run["checkpoint_default"]) for run in recorded} == {json.dumps({"novelty": 0.5})}


@pytest.mark.parametrize("wanted", [0, -1, 1.5, True])
def test_a_number_of_candidates_below_one_is_refused_by_generate_and_the_pipeline(checkpoint, wanted):
    """`num_return_sequences=0` failed deep in beam search ("max(): Expected reduction dim to be specified")."""
    model = CDNPGForConditionalGeneration.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    inputs = tokenizer([SENTENCE], return_tensors="pt")
    with pytest.raises(ValueError, match=rf"num_return_sequences must be a positive integer .*got {wanted!r}"):
        model.generate(**inputs, num_return_sequences=wanted, max_new_tokens=4)
    paraphraser = CDNPGText2TextPipeline(model=model, tokenizer=tokenizer, device="cpu")
    with pytest.raises(ValueError, match="num_return_sequences must be a positive integer"):
        paraphraser(SENTENCE, num_return_sequences=wanted, max_new_tokens=4)


def test_the_cli_says_why_an_input_got_fewer_candidates_than_asked(checkpoint, caplog):
    """Novelty keeps only candidates that differ from each other and from the input, so there may be fewer than -n:
    the command says so for that input (a pipeline that returns two of five stands in for such a search)."""
    from cdnpg.commands import paraphrase

    full = CDNPGText2TextPipeline(
        model=CDNPGForConditionalGeneration.from_pretrained(checkpoint),
        tokenizer=AutoTokenizer.from_pretrained(checkpoint),
        device="cpu",
    )

    class TwoAtMost:
        model, tokenizer = full.model, full.tokenizer

        def __call__(self, *args, **kwargs):
            return [candidates[:2] for candidates in full(*args, **kwargs)]

    texts = [SENTENCE, "what is the best way to travel ?"]
    with caplog.at_level("WARNING", logger="cdnpg"):
        results = paraphrase(TwoAtMost(), texts, num_return_sequences=5, novelty=0.5, max_new_tokens=8, first_index=3)
        complete = paraphrase(full, texts, num_return_sequences=2, novelty=0.5, max_new_tokens=8)
    assert [len(candidates) for candidates in results] == [2, 2] and [len(c) for c in complete] == [2, 2]
    warned = [record.getMessage() for record in caplog.records]
    assert [message.split(":")[0] for message in warned] == ["input 3", "input 4"]
    assert all("2 of 5 candidates" in message and "--num-beams" in message for message in warned)


# ---------------------------------------------------------------------------------------------------------------------
# Ranking by reverse likelihood
# ---------------------------------------------------------------------------------------------------------------------


def test_rank_by_reverse_likelihood_orders_the_same_candidates_by_log_p_of_the_source_given_each():
    """rank_by="reverse_likelihood": the candidates of the default ranking, reordered by the mean log-probability
    the same model gives the source when the candidate is its input, computed here by hand from the model's loss."""
    model = calibrated(tiny_model())
    ids, mask = sources([5, 6, 7, 8, 9], [10, 11, 12])
    settings = dict(max_new_tokens=6, num_beams=4, novelty=0.5, num_return_sequences=3)
    by_score = para(model, ids, mask, **settings)
    by_reverse = para(model, ids, mask, rank_by="reverse_likelihood", **settings)
    both = para(model, ids, mask, rank_by="score+reverse_likelihood", **settings)
    assert by_score.reverse_log_likelihoods is None
    for i, source in enumerate(([5, 6, 7, 8, 9], [10, 11, 12])):
        rows = slice(3 * i, 3 * i + 3)
        filled = by_reverse.sequences_scores[rows] > -math.inf
        texts = [tuple(content(row)) for row in by_reverse.sequences[rows][filled]]
        assert sorted(texts) == sorted(tuple(content(row)) for row in by_score.sequences[rows][filled])
        reverse = by_reverse.reverse_log_likelihoods[rows][filled]
        assert torch.equal(by_reverse.sequences_scores[rows][filled], reverse)
        assert (reverse[:-1] >= reverse[1:]).all(), "best first by log p(source | candidate)"
        for row, value in zip(by_reverse.sequences[rows][filled].tolist(), reverse):
            candidate = row[: row.index(EOS, 1) + 1] if EOS in row[1:] else row  # the start, its tokens, the end
            with torch.no_grad():  # a random model may write special tokens inside: the row as it is
                loss = model(
                    input_ids=torch.tensor([candidate]), labels=torch.tensor([[*source, EOS]]), use_cache=False
                )
            torch.testing.assert_close(value, -loss.loss, rtol=0, atol=1e-5)
        # the sum: each candidate's decoding score plus its reverse log-likelihood
        score = {tuple(content(row)): s for row, s in zip(by_score.sequences[rows], by_score.sequences_scores[rows])}
        summed = dict(zip(texts, reverse.tolist()))
        for row, value in zip(both.sequences[rows], both.sequences_scores[rows]):
            if value > -math.inf:
                key = tuple(content(row))
                assert value.item() == pytest.approx(score[key].item() + summed[key], abs=1e-5)
    with pytest.raises(ValueError, match="rank_by: unknown part 'meaning'; the parts that can be weighed are 'score'"):
        para(model, ids, mask, rank_by="meaning", **settings)
