"""A complete, Hub-ready checkpoint folder: weights, remote code, tokenizer and a model card, written atomically.

`model.save_pretrained` already writes the weights, the remote code with its `auto_map` and `custom_pipelines`, and
the generation config. `save_checkpoint` adds the tokenizer (in a form transformers 4.57 reads too) and README.md,
the model card rendered from the project's `model_card.md` with Hub metadata and, when given, evaluation results.
"""

import os
import shutil
import string
import tempfile
from collections.abc import Mapping
from pathlib import Path

import yaml
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from cdnpg.data import save_tokenizer

MODEL_CARD_TEMPLATE = Path(__file__).resolve().parents[1] / "model_card.md"
CARD_METRICS = {  # metrics.json key -> (model-index type, display name)
    "ibleu": ("ibleu", "iBLEU (true, α = 0.8)"),
    "ibleu_paper": ("ibleu_paper", "iBLEU as in the paper's Table 2"),
    "bleu2": ("bleu", "BLEU-2"),
    "bleu4": ("bleu", "BLEU-4"),
    "rougeL": ("rouge", "ROUGE-L"),
    "meteor": ("meteor", "METEOR"),
    "sacrebleu": ("sacrebleu", "sacreBLEU"),
    "self_bleu4": ("self_bleu", "self-BLEU-4 (lower copies less)"),
}


def card_metadata(
    model_name: str, metrics: Mapping[str, float] | None = None, dataset: str | None = None
) -> dict[str, object]:
    """The Hub's YAML header: license, library, pipeline tag, tags, datasets, metrics and a model-index."""
    metadata: dict[str, object] = {
        "license": "apache-2.0",
        "library_name": "transformers",
        "pipeline_tag": "text2text-generation",
        "language": ["en"],
        "tags": ["paraphrase-generation", "c-dnpg", "granularity-aware-attention", "custom_code"],
        "metrics": ["bleu", "rouge", "meteor", "sacrebleu"],
    }
    if dataset:
        metadata["datasets"] = [dataset]
    results = [
        {"type": CARD_METRICS[key][0], "name": CARD_METRICS[key][1], "value": round(float(metrics[key]), 2)}
        for key in CARD_METRICS
        if metrics and key in metrics
    ]
    if results:
        metadata["model-index"] = [
            {
                "name": model_name,
                "results": [
                    {
                        "task": {"type": "text2text-generation", "name": "Paraphrase generation"},
                        "dataset": {"type": dataset or "custom", "name": dataset or "custom"},
                        "metrics": results,
                    }
                ],
            }
        ]
    return metadata


def render_model_card(
    model: PreTrainedModel,
    model_id: str,
    metrics: Mapping[str, float] | None = None,
    dataset: str | None = None,
    training_summary: str | None = None,
    max_length: int = 20,
) -> str:
    """The model card: `model_card.md` with its placeholders filled from the config and the evaluation results."""
    if not MODEL_CARD_TEMPLATE.is_file():
        raise FileNotFoundError(f"model card template not found at {MODEL_CARD_TEMPLATE}")
    config = model.config
    rows = [
        ("granularity_mask (eq. 9)", config.granularity_mask),
        ("granularity_mask_mode", config.granularity_mask_mode),
        ("cross_attention_granularity", config.cross_attention_granularity),
        ("scope_epsilon (eq. 8)", config.scope_epsilon),
        ("layers (encoder + decoder)", f"{config.encoder_layers} + {config.decoder_layers}"),
        ("d_model / heads / FFN", f"{config.d_model} / {config.encoder_attention_heads} / {config.encoder_ffn_dim}"),
        ("vocabulary", config.vocab_size),
        ("parameters", f"{model.num_parameters():,}"),
    ]
    config_table = "| setting | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
    if metrics:
        shown = [(CARD_METRICS[key][1], metrics[key]) for key in CARD_METRICS if key in metrics]
        results_table = "| metric | value |\n|---|---|\n" + "\n".join(f"| {n} | {v:.2f} |" for n, v in shown)
    else:
        results_table = "No evaluation results were recorded with this checkpoint."
    model_name = model_id.rstrip("/").split("/")[-1]
    metadata = yaml.safe_dump(card_metadata(model_name, metrics, dataset), sort_keys=False, allow_unicode=True)
    return string.Template(MODEL_CARD_TEMPLATE.read_text(encoding="utf-8")).safe_substitute(
        metadata=metadata.strip(),
        model_name=model_name,
        model_id=model_id,
        granularity_mask=config.granularity_mask,
        config_table=config_table,
        results_table=results_table,
        training_summary=training_summary or "Not recorded.",
        max_length=max_length,
    )


def save_checkpoint(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: str | os.PathLike,
    model_id: str | None = None,
    metrics: Mapping[str, float] | None = None,
    dataset: str | None = None,
    training_summary: str | None = None,
    max_length: int = 20,
) -> Path:
    """Write model, tokenizer and model card to `output_dir`, staged in a temporary sibling folder and moved in at
    the end, so that a failure leaves an earlier checkpoint in `output_dir` as it was."""
    target = Path(output_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.saving-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        save_tokenizer(tokenizer, staging)
        card = render_model_card(model, model_id or target.name, metrics, dataset, training_summary, max_length)
        (staging / "README.md").write_text(card, encoding="utf-8")
        target.mkdir(exist_ok=True)
        for path in staging.iterdir():
            os.replace(path, target / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def push_checkpoint(
    folder: str | os.PathLike, repo_id: str, private: bool | None = None, token: str | None = None
) -> str:
    """Upload a folder written by `save_checkpoint` as one commit; returns the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    commit = api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message="Upload C-DNPG checkpoint")
    return str(commit)


__all__ = ["card_metadata", "push_checkpoint", "render_model_card", "save_checkpoint"]
