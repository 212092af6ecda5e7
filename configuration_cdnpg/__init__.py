"""C-DNPG configuration: `CDNPGConfig` (registered with `AutoConfig` as model type "cdnpg").

Import workaround, the only one: the configuration's source file is `modeling_cdnpg/configuration_cdnpg.py`, beside
the modeling file, because transformers copies a model's code into a checkpoint by following the modeling file's
relative imports inside that file's own folder (`custom_object_save`). This package is the configuration's public
home and re-exports it.
"""

from modeling_cdnpg.configuration_cdnpg import COPY_MECHANISMS, GRANULARITY_MASK_MODES, GRANULARITY_MASKS, CDNPGConfig

__all__ = ["COPY_MECHANISMS", "GRANULARITY_MASKS", "GRANULARITY_MASK_MODES", "CDNPGConfig"]
