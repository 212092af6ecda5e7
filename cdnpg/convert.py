"""Warm start: GA-attention on pretrained checkpoints, the paper's future work ("apply GA-attention to pre-trained
language models").

- `from_bart`: a `BartForConditionalGeneration` becomes a C-DNPG with the same architecture (post-LN encoder-decoder,
  learned positions with BART's offset of 2, embedding LayerNorms, optional sqrt(d) embedding scale). Every weight
  keeps its name and values; the granularity heads W_G are the only new parameters.
- `from_bert`: a BERT-family encoder (`BertModel`, e.g. sentence-transformers' all-MiniLM-L6-v2) initialises both the
  encoder and the decoder (bert2bert, Rothe et al. 2020): self-attention, feed-forward, embeddings and LayerNorms are
  copied into both stacks; the decoder's cross-attention is new, initialised as BERT initialises its own layers
  (Normal(0, initializer_range) weights, zero biases, unit LayerNorm), as in Rothe et al. BERT's segment-0 embedding,
  which BERT adds to every token, is folded into the position table; the pooler is dropped (a paraphraser does not
  use it); the LM head is tied to the word embeddings.
- `convert`: either of them from a folder or a Hub id, with its tokenizer.

The granularity heads start at z ≈ 0.5 for every token (W_G ~ Normal(0, 1e-6), zero bias). With z = 0.5 the
resonance mask (eq. 6) is 0.5 for every key, which in log_bias mode adds the same constant to a whole row of logits
and leaves the softmax unchanged: a converted `resonance` model computes the pretrained model's outputs (cross-
attention's resonance mask too). z is not exactly 0.5 because eq. 6 is flat there: at z_i = z_j = 0.5 the gradient
autograd takes for z_j is 0 (C = (1 + |z_j - 1/2|) / 2 at z_i = 1/2, a kink), so heads started at exactly 0.5 would
never learn; 1e-6 moves the logits by ~1e-6 and gives W_G its usual gradient.
Masks that cannot start as the pretrained model: `scope` (and `product`, `mean`) is local by construction (at z = 0.5
a token sees only (N - eps)^0.5 + eps neighbours), and the `multiply` mode scales every attention row by M.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import BartForConditionalGeneration, BertModel, PreTrainedTokenizerBase

    from modeling_cdnpg import CDNPGForConditionalGeneration

GRANULARITY_INIT_STD = 1e-6  # W_G at warm start: z = 0.5 up to ~1e-5, off the saddle of eq. 6 (module docstring)
SOURCE_TYPES = ("bart", "bert")  # model_type of the checkpoints `convert` takes
# CDNPGConfig field -> BartConfig field with the same meaning (also used to size a BART like a C-DNPG)
BART_FIELDS = {
    **{
        name: name
        for name in (
            "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
            "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings",
            "activation_function", "dropout", "attention_dropout", "scale_embedding", "pad_token_id", "bos_token_id",
            "eos_token_id", "decoder_start_token_id", "tie_word_embeddings",
        )
    },
    "initializer_range": "init_std",
}  # fmt: skip


def from_bart(bart: BartForConditionalGeneration, **overrides) -> CDNPGForConditionalGeneration:
    """C-DNPG with BART's architecture and weights; `overrides` set config fields such as the GA options
    (granularity_mask, granularity_mask_mode, ...) or the dropout."""
    from modeling_cdnpg import CDNPGConfig, CDNPGForConditionalGeneration

    source = bart.config
    if not torch.equal(bart.final_logits_bias, torch.zeros_like(bart.final_logits_bias)):
        raise ValueError("this BART checkpoint has a non-zero final_logits_bias, which C-DNPG's LM head does not have")
    fields = {ours: getattr(source, theirs) for ours, theirs in BART_FIELDS.items()}
    fields.update(
        position_offset=bart.model.encoder.embed_positions.offset,
        layernorm_embedding=True,
        activation_dropout=source.activation_dropout,  # BART's own, not `dropout` (training only: eval is exact)
    )
    config = CDNPGConfig(**{**fields, **overrides})
    state = {name: tensor for name, tensor in bart.state_dict().items() if name != "final_logits_bias"}
    return _load_pretrained(CDNPGForConditionalGeneration(config), state)


def from_bert(bert: BertModel, cls_token_id: int, sep_token_id: int, **overrides) -> CDNPGForConditionalGeneration:
    """bert2bert: encoder and decoder from the same BERT-family encoder; [CLS] starts decoding, [SEP] ends it.
    `overrides` set config fields, as for `from_bart`."""
    from modeling_cdnpg import CDNPGConfig, CDNPGForConditionalGeneration

    source = bert.config
    if getattr(source, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type {source.position_embedding_type!r}: C-DNPG has absolute positions")
    fields = dict(
        vocab_size=source.vocab_size,
        d_model=source.hidden_size,
        encoder_layers=source.num_hidden_layers,
        decoder_layers=source.num_hidden_layers,
        encoder_attention_heads=source.num_attention_heads,
        decoder_attention_heads=source.num_attention_heads,
        encoder_ffn_dim=source.intermediate_size,
        decoder_ffn_dim=source.intermediate_size,
        activation_function=source.hidden_act,
        dropout=source.hidden_dropout_prob,
        attention_dropout=source.attention_probs_dropout_prob,
        activation_dropout=0.0,  # BERT has no dropout after the feed-forward activation
        lm_head_transform=True,  # BERT's prediction head, as bert2bert has it: see docs/warm_start.md
        max_position_embeddings=source.max_position_embeddings,
        layernorm_embedding=True,
        layer_norm_eps=source.layer_norm_eps,
        initializer_range=source.initializer_range,
        pad_token_id=source.pad_token_id,
        bos_token_id=cls_token_id,
        eos_token_id=sep_token_id,
        decoder_start_token_id=cls_token_id,
    )
    config = CDNPGConfig(**{**fields, **overrides})
    weights = bert.state_dict()
    embeddings = {
        "embed_positions.weight": weights["embeddings.position_embeddings.weight"]
        + weights["embeddings.token_type_embeddings.weight"][0],  # segment 0, added to every token by BERT
        "layernorm_embedding.weight": weights["embeddings.LayerNorm.weight"],
        "layernorm_embedding.bias": weights["embeddings.LayerNorm.bias"],
    }
    layer_names = {  # BERT layer -> C-DNPG layer, the same in the encoder and the decoder
        "attention.self.query": "self_attn.q_proj",
        "attention.self.key": "self_attn.k_proj",
        "attention.self.value": "self_attn.v_proj",
        "attention.output.dense": "self_attn.out_proj",
        "attention.output.LayerNorm": "self_attn_layer_norm",
        "intermediate.dense": "fc1",
        "output.dense": "fc2",
        "output.LayerNorm": "final_layer_norm",
    }
    # every embedding from BERT's, also where `tie_word_embeddings=False` gives each its own copy
    word_embeddings = ("model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens", "lm_head")
    state = {f"{name}.weight": weights["embeddings.word_embeddings.weight"] for name in word_embeddings}
    for stack in ("encoder", "decoder"):
        state.update({f"model.{stack}.{name}": tensor for name, tensor in embeddings.items()})
        for index in range(source.num_hidden_layers):
            for bert_name, name in layer_names.items():
                for kind in ("weight", "bias"):
                    bert_key = f"encoder.layer.{index}.{bert_name}.{kind}"
                    state[f"model.{stack}.layers.{index}.{name}.{kind}"] = weights[bert_key]
    return _load_pretrained(CDNPGForConditionalGeneration(config), state)


def _load_pretrained(model: CDNPGForConditionalGeneration, state: dict[str, torch.Tensor]):
    """Load `state` strictly except for what is new: the granularity heads (started near z = 0.5), the copy mechanism
    (when asked for) and, for a BERT
    source, the decoder's cross-attention and the prediction head (`lm_head_transform` and the vocabulary bias), left
    as the model initialised them, as transformers' bert2bert initialises them."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    new_parts = ("granularity_head", "encoder_attn", "lm_head_transform.", "lm_head.bias", "copy_mechanism.")
    new = [name for name in missing if name not in tied and not any(part in name for part in new_parts)]
    if unexpected or new:
        raise ValueError(f"weights do not map 1:1: unexpected {sorted(unexpected)}, missing {sorted(new)}")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "granularity_head.proj.weight" in name:
                parameter.normal_(0.0, GRANULARITY_INIT_STD)
            elif "granularity_head.proj.bias" in name:
                parameter.zero_()
    model.tie_weights()
    return model.eval()


def convert(source: str | os.PathLike, **overrides) -> tuple[CDNPGForConditionalGeneration, PreTrainedTokenizerBase]:
    """The C-DNPG version of a BART or BERT-family checkpoint (a folder or a Hub id), and its tokenizer; `overrides`
    set config fields (the GA options, dropout)."""
    from transformers import AutoConfig, AutoTokenizer, BartForConditionalGeneration, BertModel

    from cdnpg.hub import resolve_model_source

    name = resolve_model_source(source)
    config = AutoConfig.from_pretrained(name)
    if config.model_type not in SOURCE_TYPES:
        raise ValueError(
            f"{source}: a {config.model_type!r} checkpoint; cdnpg converts {' and '.join(SOURCE_TYPES)} checkpoints"
        )
    tokenizer = AutoTokenizer.from_pretrained(name)
    if not 0.9 * config.vocab_size <= len(tokenizer) <= config.vocab_size:  # transformers builds an empty one
        raise ValueError(  # for a folder without tokenizer files
            f"{source}: its tokenizer has {len(tokenizer)} tokens for a vocabulary of {config.vocab_size}; save the "
            "checkpoint's own tokenizer files (tokenizer.json, vocab.txt, ...) in the folder"
        )
    if config.model_type == "bart":
        return from_bart(BartForConditionalGeneration.from_pretrained(name), **overrides), tokenizer
    bert = BertModel.from_pretrained(name, add_pooling_layer=False)
    return from_bert(bert, tokenizer.cls_token_id, tokenizer.sep_token_id, **overrides), tokenizer


__all__ = ["GRANULARITY_INIT_STD", "convert", "from_bart", "from_bert"]
