"""The suite's guard (conftest.py) catches what transformers deprecates when our code causes it, logged or warned,
and names the line; the same calls under the current names pass it. transformers 5.24 deprecated `past_key_values`
(the argument, through `deprecate_kwarg`'s FutureWarning; the output field, through a logged `warning_once`)."""

import pytest
import torch

from modeling_cdnpg.modeling_cdnpg import CACHE_NAME
from tests.conftest import DeprecationGuard, tiny_model
from tests.test_modeling import batch

pytestmark = pytest.mark.skipif(CACHE_NAME != "cache", reason="transformers < 5.24 deprecates no cache name")


def forward_with_cache():
    model = tiny_model()
    input_ids, attention_mask = batch()
    with torch.no_grad():
        return model, model(input_ids, attention_mask, decoder_input_ids=input_ids[:, :3], use_cache=True)


@pytest.mark.transformers_deprecation
def test_a_logged_deprecation_caused_by_our_code_is_caught_with_its_line():
    _, output = forward_with_cache()
    with DeprecationGuard() as guard:
        output.past_key_values  # noqa: B018 - the deprecated field name, read on purpose
    assert len(guard.found) == 1
    assert "deprecated" in guard.found[0] and f"{__file__}:" in guard.found[0]


@pytest.mark.transformers_deprecation
def test_a_warned_deprecation_caused_by_our_code_is_caught():
    model, output = forward_with_cache()
    input_ids, attention_mask = batch()
    with DeprecationGuard() as guard, torch.no_grad():
        model(input_ids, attention_mask, decoder_input_ids=input_ids[:, 3:4], past_key_values=output.cache)
    assert any("past_key_values" in found and f"{__file__}:" in found for found in guard.found), guard.found


def test_the_current_names_pass_the_guard():
    model, output = forward_with_cache()
    input_ids, attention_mask = batch()
    with DeprecationGuard() as guard, torch.no_grad():
        model(input_ids, attention_mask, decoder_input_ids=input_ids[:, 3:4], cache=output.cache)
        model.generate(input_ids, attention_mask=attention_mask, num_beams=2, max_new_tokens=4)
    assert guard.found == []
