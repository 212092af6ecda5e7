"""Helpers around the C-DNPG model: corpora and tokenizer (`cdnpg.data`), Hub export (`cdnpg.hub`), the `cdnpg`
command line (`cdnpg.cli`, `cdnpg.commands`, `cdnpg.inference`), z per word and its figures (`cdnpg.granularity`,
`cdnpg.figures`), which z novelty reads (`cdnpg.calibration`), the sentence embedder of a ranking by meaning
(`cdnpg.ranking`) and the training pipeline (`cdnpg.training`). Import `modeling_cdnpg` to register the model with
the transformers Auto classes; this package does not, so that `cdnpg --help` answers without loading torch."""
