"""generate() is transformers' own, and one word rule serves decoding, the granularity figure and `high_z_words`.

The model's `generate()` is compared with BART's of the same tiny size, option by option: what one returns, the other
returns in the same form. The word rule runs on WordPiece and on a byte-level BPE tokenizer (BART's kind, trained here
offline on a few sentences), where "?" follows a word without a space.
"""

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers.processors import TemplateProcessing
from transformers import (
    BartForConditionalGeneration,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
)
from transformers.generation.streamers import BaseStreamer

from cdnpg.data import train_wordpiece_tokenizer
from cdnpg.granularity import high_z_words, word_granularities, word_positions
from cdnpg.training.baselines import bart_like
from modeling_cdnpg.generation_cdnpg import (
    granularity_processors,
    paraphrase,
    source_ngrams,
    word_starts,
)
from tests.conftest import BOS, EOS, PAD, tiny_config, tiny_model

SENTENCES = ["how do i learn python?", "what is the best way to learn python?", "why do people learn new words?"]


def tiny_bart() -> BartForConditionalGeneration:
    """BART of tiny_config's size and special tokens (the quality benchmark's baseline), eager: sdpa returns no
    attentions."""
    torch.manual_seed(0)
    bart = bart_like(tiny_config())
    bart.set_attn_implementation("eager")
    return bart.eval()


class Collect(BaseStreamer):
    """A streamer that keeps every id it is handed."""

    def __init__(self):
        self.ids, self.ended = [], False

    def put(self, value):
        self.ids += value.flatten().tolist()

    def end(self):
        self.ended = True


class Force(LogitsProcessor):
    """Forces one token at every step."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores):
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.token] = 0.0
        return forced


INPUTS = {"input_ids": torch.tensor([[BOS, 5, 6, 7, EOS], [BOS, 8, 9, EOS, PAD]])}
INPUTS["attention_mask"] = (INPUTS["input_ids"] != PAD).long()
CALLS = {
    "greedy, scores and logits": dict(num_beams=1, output_scores=True, output_logits=True),
    "beams, scores": dict(num_beams=3, num_return_sequences=2, output_scores=True),
    "sampling, scores": dict(do_sample=True, num_beams=1, output_scores=True),
    "attentions and hidden states": dict(num_beams=1, output_attentions=True, output_hidden_states=True),
}


def shape(output) -> dict:
    """What a generate() output holds, by field: a tensor's shape, a tuple's length and first element's shape."""
    found = {}
    for name, value in output.items():
        if torch.is_tensor(value):
            found[name] = tuple(value.shape)
        elif isinstance(value, tuple) and value and torch.is_tensor(value[0]):
            found[name] = (len(value), tuple(value[0].shape))
        elif isinstance(value, tuple) and value and isinstance(value[0], tuple):  # per step, per layer
            found[name] = (len(value), len(value[0]))
        elif isinstance(value, tuple):
            found[name] = (len(value),)
    return found


@pytest.mark.parametrize("call", CALLS, ids=list(CALLS))
def test_generate_returns_what_barts_returns(call):
    """Same output class and fields with the same shapes (attentions and hidden states: same number of steps), and
    sequences equal to the scores' argmax where decoding is greedy."""
    model, bart = tiny_model().eval(), tiny_bart()
    settings = dict(max_new_tokens=5, min_new_tokens=5, return_dict_in_generate=True, **CALLS[call])
    outputs = []
    for each in (model, bart):
        torch.manual_seed(0)
        outputs.append(each.generate(**INPUTS, **settings))
    ours, theirs = outputs
    assert type(ours) is type(theirs)
    ours_shape, theirs_shape = shape(ours), shape(theirs)
    assert set(ours_shape) >= set(theirs_shape) - {"past_key_values"}, (ours_shape, theirs_shape)
    for name in ("sequences", "scores", "logits", "sequences_scores", "beam_indices"):
        assert ours_shape.get(name) == theirs_shape.get(name), name
    for name in ("encoder_attentions", "encoder_hidden_states", "decoder_attentions", "decoder_hidden_states"):
        if name in theirs_shape:
            assert ours_shape[name][0] == theirs_shape[name][0], name
    if call.startswith("greedy"):
        picked = torch.stack(ours.scores, 1).argmax(-1)
        assert torch.equal(picked, ours.sequences[:, 1:])


def test_logits_processors_streamers_and_the_static_cache_work_as_for_bart():
    for model in (tiny_model().eval(), tiny_bart()):
        forced = model.generate(**INPUTS, max_new_tokens=3, logits_processor=LogitsProcessorList([Force(11)]))
        assert forced[:, 1:].eq(11).all()
        streamer = Collect()
        single = {name: value[:1] for name, value in INPUTS.items()}  # streamers take one input
        streamed = model.generate(**single, max_new_tokens=4, num_beams=1, streamer=streamer)
        assert streamer.ended and streamer.ids == streamed[0].tolist()
        dynamic = model.generate(**INPUTS, max_new_tokens=4, num_beams=1)
        static = model.generate(**INPUTS, max_new_tokens=4, num_beams=1, cache_implementation="static")
        assert torch.equal(dynamic, static)


@pytest.mark.parametrize("name", ["novelty", "keep_details", "allow_copy", "novelty_z_layer"])
def test_generate_refuses_paraphrasing_arguments_and_names_where_they_went(name):
    model = tiny_model().eval()
    model.generation_config.novelty_z_layer = 1  # calibrated: transformers would take novelty_z_layer silently
    with pytest.raises(TypeError, match=rf"generate\(\) takes no {name}: .*paraphrase\(.*granularity_processors"):
        model.generate(**INPUTS, max_new_tokens=2, **{name: 0.5})


def test_the_rules_as_processors_change_the_scores_transformers_reports_by_the_rules_amounts():
    """granularity_processors in generate(): output_scores shows the penalty on the source's bigrams, to the nat."""
    model = tiny_model().eval()
    model.generation_config.novelty_z_layer, model.generation_config.novelty_z_inverted = -1, False
    settings = dict(max_new_tokens=3, num_beams=1, output_scores=True, return_dict_in_generate=True)
    plain = model.generate(**INPUTS, **settings)
    rules = granularity_processors(model, None, INPUTS, novelty=0.5)
    ruled = model.generate(**INPUTS, logits_processor=rules, **settings)
    source = rules[0]  # the penalty; the copy rule only touches the end token
    first = ruled.scores[0] - plain.scores[0]  # step 1: after the start token, the bigram ([CLS], first word)
    expected = -source.per_input["penalties"][:, 0]  # ([CLS] 5) and ([CLS] 8)
    torch.testing.assert_close(first[0, 5], expected[0])
    torch.testing.assert_close(first[1, 8], expected[1])
    assert expected.lt(0).all() and first[0].ne(0).sum() == 1 and first[1].ne(0).sum() == 1


# ---------------------------------------------------------------------------------------------------------------------
# One word rule
# ---------------------------------------------------------------------------------------------------------------------


def byte_level_bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (BART's and GPT-2's kind) trained on a few sentences, <s> ... </s> around inputs."""
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    trainer = trainers.BpeTrainer(vocab_size=300, min_frequency=1, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    trained.train_from_iterator(SENTENCES * 3, trainer)
    bos, eos = trained.token_to_id("<s>"), trained.token_to_id("</s>")
    trained.post_processor = TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", bos), ("</s>", eos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=trained, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


TEXT = "how do i learn pythonic words?"  # "pythonic" is pieces in both vocabularies; "?" follows without a space


@pytest.fixture(scope="module", params=["byte-level BPE", "WordPiece"])
def tokenizer(request):
    if request.param == "WordPiece":
        # "ionic": the pieces "##i", "##c" that spell "pythonic" after "python"
        return train_wordpiece_tokenizer([*SENTENCES, "ionic"] * 3, vocab_size=80, min_frequency=1)
    return byte_level_bpe()


def test_words_are_the_same_for_both_tokenizers_and_question_marks_stand_alone(tokenizer):
    encoded = tokenizer([TEXT], return_tensors="pt")
    pieces = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    [groups] = word_positions(tokenizer, encoded["input_ids"], encoded["attention_mask"])
    words = [tokenizer.convert_tokens_to_string([pieces[p] for p in group]).strip() for group in groups]
    assert words == ["how", "do", "i", "learn", "pythonic", "words", "?"], pieces
    assert any(len(group) > 1 for group in groups), f"the test needs a word in pieces: {pieces}"
    # decoding: a bigram ending inside a word is never penalised, the one ending in "?" is
    starts = word_starts(tokenizer, encoded["input_ids"])
    special = torch.tensor(tokenizer.all_special_ids)
    ngrams, weights = source_ngrams(
        encoded["input_ids"], encoded["attention_mask"], torch.zeros(encoded["input_ids"].shape), special, starts
    )
    inside = {p for group in groups for p in group[1:]}
    question = groups[-1][0]
    for k in range(ngrams.shape[1]):
        ends_at = k + 1
        assert (weights[0, k] == 0) == (ends_at in inside or ends_at not in {p for g in groups for p in g}), k
    assert weights[0, question - 1] == 1, "(words, ?) is a bigram of two words, penalised"


def test_decoding_the_figure_and_high_z_words_share_the_words(tokenizer):
    """The figure's words and high_z_words' are word_positions' words; each word's z is its pieces' largest."""
    model = tiny_model(**{"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
                          "bos_token_id": tokenizer.bos_token_id or tokenizer.cls_token_id,
                          "eos_token_id": tokenizer.eos_token_id or tokenizer.sep_token_id,
                          "decoder_start_token_id": tokenizer.bos_token_id or tokenizer.cls_token_id}).eval()  # fmt: skip
    model.generation_config.novelty_z_layer, model.generation_config.novelty_z_inverted = 1, False
    rows = word_granularities(model, tokenizer, TEXT)
    assert rows[0].words == ["how", "do", "i", "learn", "pythonic", "words", "?"]
    encoded = tokenizer([TEXT], return_tensors="pt")
    [groups] = word_positions(tokenizer, encoded["input_ids"], encoded["attention_mask"])
    with torch.no_grad():
        z = model.get_encoder()(**encoded, output_granularities=True).granularities[1][0]
    per_word = [z[group].max().item() for group in groups]
    assert rows[1].z == pytest.approx(per_word, abs=1e-6)
    lowest = min(per_word)
    assert high_z_words(model, tokenizer, [TEXT], threshold=lowest)[0] == set(rows[1].words)
    above = sorted(per_word)[len(per_word) // 2]
    expected = {word for word, value in zip(rows[1].words, per_word) if value >= above}
    batched = high_z_words(model, tokenizer, [SENTENCES[0], TEXT, SENTENCES[1]], threshold=above, batch_size=2)
    assert batched[1] == expected, "batched with shorter and longer inputs: the same words"


def test_paraphrase_reads_words_with_a_byte_level_bpe_tokenizer():
    tokenizer = byte_level_bpe()
    model = tiny_model(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.bos_token_id).eval()  # fmt: skip
    model.generation_config.novelty_z_layer, model.generation_config.novelty_z_inverted = -1, False
    inputs = tokenizer([TEXT, SENTENCES[0]], return_tensors="pt", padding=True)
    out = paraphrase(model, tokenizer, inputs, novelty=0.5, num_return_sequences=2, max_new_tokens=6, num_beams=2)
    assert out.sequences.shape[0] == 4 and (out.sequences_scores[0::2] >= out.sequences_scores[1::2]).all()
