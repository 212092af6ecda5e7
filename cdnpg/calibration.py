"""Which encoder layer's z the paraphrasing rules read, and which way round: `calibrate_granularity`, run once on a
trained model (run.py does it on the training sources) and stored in its generation config, which the checkpoint's
remote code reads (`generation_cdnpg.z_settings`).
"""

from __future__ import annotations

from collections import Counter

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from cdnpg.inference import input_limit
from modeling_cdnpg.generation_cdnpg import content_tokens

BATCH_SIZE = 64  # texts encoded at once


@torch.no_grad()
def calibrate_granularity(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    common_tokens: int = 1000,
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
    rows = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
    counts = Counter(token for row in rows for token in row)
    common = [token for token, _ in counts.most_common(common_tokens)]  # ties: in the order first met
    common_ids = torch.tensor(common, device=model.device)
    special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)), device=model.device)
    sums, totals = 0.0, torch.zeros(2, device=model.device)
    limit, _ = input_limit(model, tokenizer)
    for start in range(0, len(texts), BATCH_SIZE):
        batch = tokenizer(
            list(texts[start : start + BATCH_SIZE]),
            padding=True,
            truncation=True,
            max_length=limit,
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
    inverted = bool(separation[layer] < 0)
    model.generation_config.novelty_z_layer, model.generation_config.novelty_z_inverted = layer, inverted
    # a generation config marked as derived from the model config loses its own fields when loaded again
    model.generation_config._from_model_config = False
    return {
        "novelty_z_layer": layer,
        "novelty_z_inverted": inverted,
        "separation": [round(float(value), 4) for value in separation],
    }


__all__ = ["calibrate_granularity"]
