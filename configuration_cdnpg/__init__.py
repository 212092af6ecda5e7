"""C-DNPG configuration. Importing this package registers `CDNPGConfig` with `AutoConfig` (model type "cdnpg")."""

from transformers import AutoConfig

from .configuration_cdnpg import GRANULARITY_MASK_MODES, GRANULARITY_MASKS, CDNPGConfig

AutoConfig.register(CDNPGConfig.model_type, CDNPGConfig, exist_ok=True)

__all__ = ["GRANULARITY_MASKS", "GRANULARITY_MASK_MODES", "CDNPGConfig"]
