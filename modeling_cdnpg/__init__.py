"""C-DNPG models. Importing this package registers them with `AutoModel` and `AutoModelForSeq2SeqLM`, so that a saved
checkpoint loads through the Auto classes without `trust_remote_code` where this package is installed."""

from transformers import AutoModel, AutoModelForSeq2SeqLM

from configuration_cdnpg import CDNPGConfig

from .modeling_cdnpg import (
    CDNPGDecoder,
    CDNPGEncoder,
    CDNPGForConditionalGeneration,
    CDNPGModel,
    CDNPGPreTrainedModel,
    GranularityHead,
    granularity_mask,
    resonance_mask,
    scope_mask,
)

AutoModel.register(CDNPGConfig, CDNPGModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(CDNPGConfig, CDNPGForConditionalGeneration, exist_ok=True)

__all__ = [
    "CDNPGConfig",
    "CDNPGDecoder",
    "CDNPGEncoder",
    "CDNPGForConditionalGeneration",
    "CDNPGModel",
    "CDNPGPreTrainedModel",
    "GranularityHead",
    "granularity_mask",
    "resonance_mask",
    "scope_mask",
]
