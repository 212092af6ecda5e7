"""The tiny trained paraphrasers of conftest.py are what the decoding tests rely on: the same weights in every process
whatever ran before (the thread count, the default dtype, the global RNG), and models that cannot prove cache parity
are refused, with the next seed tried: a model that repeats one token decodes alike with and without its past."""

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

import tests.conftest as fixtures
from cdnpg.data import load_tokenizer
from tests.conftest import ROOT, TOKENIZER, tiny_config, train_tiny_paraphraser, weights_digest

STEPS = 12  # enough for every parameter to move; the trained models themselves are checked by test_cache_parity.py


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TOKENIZER)


def repeating_model(tokenizer):
    """A model whose logits are all zero: greedy decoding writes one token (id 0) after the start token."""
    from cdnpg.data import model_token_ids
    from modeling_cdnpg import CDNPGForConditionalGeneration

    model = CDNPGForConditionalGeneration(tiny_config(**model_token_ids(tokenizer)))
    with torch.no_grad():
        model.lm_head.weight.zero_()
    model.generation_config.max_new_tokens = 8
    return model.eval()


def test_a_model_that_repeats_one_token_is_refused(tokenizer):
    reason = fixtures.why_not_prefix_dependent(repeating_model(tokenizer), tokenizer)
    assert reason is not None and "fewer than 5 distinct tokens" in reason


def test_a_refused_model_is_retrained_with_the_next_seed(tokenizer, paraphrasers, monkeypatch):
    good = AutoModelForSeq2SeqLM.from_pretrained(paraphrasers["resonance"]).eval()
    seeds = []

    def train(tokenizer, mask, seed, **overrides):
        seeds.append(seed)
        return good if seed == 1 else repeating_model(tokenizer)

    monkeypatch.setattr(fixtures, "train_tiny_paraphraser", train)
    assert fixtures.trained_paraphraser(tokenizer, "resonance") is good
    assert seeds == [0, 1]


def test_no_seed_giving_a_usable_model_fails_loudly_naming_each_seed(tokenizer, monkeypatch):
    monkeypatch.setattr(
        fixtures, "train_tiny_paraphraser", lambda tokenizer, mask, seed, **_: repeating_model(tokenizer)
    )
    with pytest.raises(RuntimeError, match="no seed trained a scope paraphraser") as error:
        fixtures.trained_paraphraser(tokenizer, "scope")
    for seed in fixtures.PARAPHRASER_SEEDS:
        assert f"seed {seed}: fewer than 5 distinct tokens" in str(error.value)


def test_the_training_gives_the_same_weights_whatever_global_state_earlier_tests_left(tokenizer):
    expected = weights_digest(train_tiny_paraphraser(tokenizer, "product", steps=STEPS))
    state = (torch.get_num_threads(), torch.get_default_dtype(), torch.random.get_rng_state())
    torch.set_num_threads(2)
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(1234)
    try:
        digest = weights_digest(train_tiny_paraphraser(tokenizer, "product", steps=STEPS))
        assert torch.get_num_threads() == 2 and torch.get_default_dtype() == torch.float64  # restored, not reset
        drawn = torch.rand(4)  # the global RNG continues where the seed left it: the training drew nothing from it
        torch.manual_seed(1234)
        assert torch.equal(drawn, torch.rand(4))
    finally:
        torch.set_num_threads(state[0])
        torch.set_default_dtype(state[1])
        torch.random.set_rng_state(state[2])
    assert digest == expected


def test_a_fresh_process_on_two_threads_trains_the_same_weights_with_the_shipped_tokenizer(tokenizer, tmp_path):
    """A new process, as CI's are, with two threads where this one has its own count: the shipped tokenizer's ids,
    and the training, depend on neither the process nor its threads."""
    code = f"""
import json
from cdnpg.data import load_tokenizer
from tests.conftest import TOKENIZER, train_tiny_paraphraser, weights_digest
tokenizer = load_tokenizer(TOKENIZER)
print(json.dumps([weights_digest(train_tiny_paraphraser(tokenizer, "resonance", steps={STEPS}, copy_mechanism=gate))
                  for gate in (None, "learned")]))
"""
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    expected = [
        weights_digest(train_tiny_paraphraser(tokenizer, "resonance", steps=STEPS, copy_mechanism=gate))
        for gate in (None, "learned")
    ]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected


@pytest.mark.serial
def test_a_serial_test_is_in_the_serial_group_that_one_worker_runs(request):
    """scripts/test.sh runs the suite with `-n 2 --dist loadgroup`: the tests marked `serial` share one group, which
    one worker runs test after test, so that no two of them start their processes at once."""
    if not getattr(request.config.option, "loadgroup", False):  # set by pytest-xdist in its workers
        pytest.skip("runs under pytest-xdist's --dist loadgroup, as scripts/test.sh runs the suite")
    assert request.node.nodeid.endswith("@serial"), request.node.nodeid
