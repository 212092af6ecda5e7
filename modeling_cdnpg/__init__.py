"""C-DNPG models. Importing this package registers them with transformers:

- `AutoConfig`, `AutoModel`, `AutoModelForSeq2SeqLM` know model type "cdnpg", so a saved checkpoint loads through
  the Auto classes without `trust_remote_code` where this package is installed;
- `register_for_auto_class` makes `save_pretrained` / `push_to_hub` copy the model code into the checkpoint and
  write its `auto_map`, so that it loads anywhere with `trust_remote_code=True`;
- the text2text-generation pipeline is registered with transformers' pipeline registry;
- `paraphrase` (ranked, diverse candidates, its settings a `ParaphraseSettings`) and `granularity_processors` (the
  z rules for `generate()`) are granularity-aware paraphrasing (`generation_cdnpg.py`).
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY

from .configuration_cdnpg import GRANULARITY_MASK_MODES, GRANULARITY_MASKS, CDNPGConfig
from .generation_cdnpg import ParaphraseSettings, granularity_processors, paraphrase
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
from .pipeline_cdnpg import CDNPGText2TextPipeline

AutoConfig.register(CDNPGConfig.model_type, CDNPGConfig, exist_ok=True)
AutoModel.register(CDNPGConfig, CDNPGModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(CDNPGConfig, CDNPGForConditionalGeneration, exist_ok=True)
CDNPGConfig.register_for_auto_class()
CDNPGModel.register_for_auto_class("AutoModel")
CDNPGForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
PIPELINE_REGISTRY.register_pipeline(
    "text2text-generation", pipeline_class=CDNPGText2TextPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
)

__all__ = [
    "GRANULARITY_MASKS",
    "GRANULARITY_MASK_MODES",
    "CDNPGConfig",
    "CDNPGDecoder",
    "CDNPGEncoder",
    "CDNPGForConditionalGeneration",
    "CDNPGModel",
    "CDNPGPreTrainedModel",
    "CDNPGText2TextPipeline",
    "GranularityHead",
    "ParaphraseSettings",
    "granularity_mask",
    "granularity_processors",
    "paraphrase",
    "resonance_mask",
    "scope_mask",
]
