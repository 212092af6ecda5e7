"""Helpers around the C-DNPG model: corpora and tokenizer (`cdnpg.data`), Hub export (`cdnpg.hub`) and the `cdnpg`
command line (`cdnpg.cli`). Importing it registers the model with the transformers Auto classes."""

import modeling_cdnpg  # noqa: F401  (registers CDNPGConfig and the models with the Auto classes)
