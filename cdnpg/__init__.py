"""Helpers around the C-DNPG model: corpora and tokenizer (`cdnpg.data`), Hub export (`cdnpg.hub`) and the `cdnpg`
command line (`cdnpg.cli`, `cdnpg.granularity`). Import `modeling_cdnpg` to register the model with the transformers
Auto classes; this package does not, so that `cdnpg --help` answers without loading torch."""
