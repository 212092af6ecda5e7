"""Shared fixtures: a tiny random C-DNPG (2+2 layers, d 32) keeps every model test to seconds on a CPU."""

from pathlib import Path

import pytest
import torch

from cdnpg.data import save_tokenizer, template_corpus, train_wordpiece_tokenizer
from modeling_cdnpg import CDNPGConfig, CDNPGForConditionalGeneration

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MASKS = ("resonance", "scope", "product", "mean", "none")
PAD, BOS, EOS = 0, 1, 2


def tiny_config(**overrides) -> CDNPGConfig:
    fields = dict(
        vocab_size=60,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
    )
    fields.update(overrides)
    return CDNPGConfig(**fields)


def tiny_model(seed: int = 0, **overrides) -> CDNPGForConditionalGeneration:
    torch.manual_seed(seed)
    model = CDNPGForConditionalGeneration(tiny_config(**overrides))
    with torch.no_grad():  # W_G spread wider than its init, so that z really varies between tokens
        for name, param in model.named_parameters():
            if "granularity_head" in name:
                param.normal_(0, 0.5)
    return model.eval()


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is absent")
    return SHARED


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    """One tokenizer for runs that are compared: `tokenizers` breaks frequency ties differently in each process."""
    corpus = template_corpus(num_train=256, num_valid=16, num_test=16, seed=0)["train"]
    tokenizer = train_wordpiece_tokenizer([*corpus["source"], *corpus["target"]], vocab_size=400)
    return str(save_tokenizer(tokenizer, tmp_path_factory.mktemp("tokenizer")))
