"""Train and evaluate a C-DNPG paraphraser with the transformers `Seq2SeqTrainer`.

    # the embedded template corpus, a few minutes on a laptop CPU
    python training/run.py training/configs/template_cpu.yaml
    # the paper's recipe on your own files (JSONL / CSV / TSV with source and target columns)
    python training/run.py training/configs/paper.yaml --train_file train.jsonl --validation_file valid.jsonl \
        --test_file test.jsonl --output_dir runs/quora
    # several GPUs (DDP); on CPU add --use_cpu (the gloo backend)
    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 training/run.py ...

Arguments come from the command line, or a JSON / YAML file given first (later flags override it). Every
`Seq2SeqTrainingArguments` option works; defaults follow the paper's recipe (Section 4.2): AdamW, lr 5e-5, linear
schedule with 5,000 warm-up steps, batch 32, sentences truncated to 20 tokens, beam 8, model selection by validation
loss. The output directory ends up a Hub-ready checkpoint (weights, remote code, tokenizer, model card) with
`predictions.jsonl` (source, reference, prediction on the test split), `metrics.json` and the trainer state.
"""

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import evaluate
import transformers
import yaml
from transformers import (
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    GenerationConfig,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    set_seed,
)

from cdnpg.data import (
    load_pair_files,
    load_tokenizer,
    make_tokenizer_config_portable,
    prepare_quora,
    prepare_twitter_url,
    template_corpus,
    train_wordpiece_tokenizer,
)
from cdnpg.hub import render_model_card, save_checkpoint
from configuration_cdnpg import GRANULARITY_MASK_MODES, GRANULARITY_MASKS, CDNPGConfig
from modeling_cdnpg import CDNPGForConditionalGeneration

logger = logging.getLogger("cdnpg.run")
METRICS_MODULE = Path(__file__).resolve().parent / "paraphrase_metrics"
DATASETS = ("template", "files", "quora_raw", "twitter_url_raw", "hub")


@dataclass
class ModelArguments:
    """The C-DNPG architecture (paper defaults) or an existing checkpoint to fine-tune."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Fine-tune this checkpoint instead of training a new model."}
    )
    granularity_mask: str = field(
        default="resonance", metadata={"help": f"Eq. 9 mask: one of {GRANULARITY_MASKS} ('none' = Transformer)."}
    )
    granularity_mask_mode: str = field(
        default="log_bias", metadata={"help": f"How the mask adjusts attention: one of {GRANULARITY_MASK_MODES}."}
    )
    cross_attention_granularity: bool = field(
        default=True, metadata={"help": "Resonance mask in cross-attention, as in the released code."}
    )
    scope_epsilon: float = field(default=2.0, metadata={"help": "The window epsilon of the scope mask (eq. 8)."})
    d_model: int = field(default=450, metadata={"help": "Hidden size (paper: 450)."})
    layers: int = field(default=3, metadata={"help": "Encoder and decoder layers each (paper: 3)."})
    attention_heads: int = field(default=9, metadata={"help": "Attention heads (paper: 9)."})
    ffn_dim: int = field(default=1024, metadata={"help": "Feed-forward inner size (released code: 1024)."})
    dropout: float = field(default=0.1, metadata={"help": "Dropout on residual branches and attention."})
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "A tokenizer folder or cached name (e.g. bert-base-uncased files); default: train one."},
    )
    vocab_size: int = field(default=8000, metadata={"help": "Size of the WordPiece vocabulary trained by default."})


@dataclass
class DataArguments:
    """Where the paraphrase pairs come from and how they are cut."""

    dataset: str = field(default="template", metadata={"help": f"One of {DATASETS}."})
    train_file: str | None = field(default=None, metadata={"help": "dataset=files: JSONL/CSV/TSV training pairs."})
    validation_file: str | None = field(default=None, metadata={"help": "dataset=files: validation pairs."})
    test_file: str | None = field(default=None, metadata={"help": "dataset=files: test pairs."})
    source_column: str = field(default="source", metadata={"help": "Column holding the input sentence."})
    target_column: str = field(default="target", metadata={"help": "Column holding the paraphrase."})
    quora_file: str | None = field(default=None, metadata={"help": "dataset=quora_raw: the Kaggle CSV/TSV."})
    twitter_train_file: str | None = field(default=None, metadata={"help": "dataset=twitter_url_raw: auto pairs."})
    twitter_test_files: list[str] = field(
        default_factory=list, metadata={"help": "dataset=twitter_url_raw: the human-labelled files."}
    )
    dataset_name: str | None = field(default=None, metadata={"help": "dataset=hub: a datasets.load_dataset name."})
    template_sizes: list[int] = field(
        default_factory=lambda: [6000, 500, 500], metadata={"help": "dataset=template: train, valid, test sizes."}
    )
    data_seed_split: int = field(default=0, metadata={"help": "Seed of corpus generation and shuffled splits."})
    max_source_length: int = field(default=20, metadata={"help": "Truncate sources to this many tokens (paper: 20)."})
    max_target_length: int = field(default=20, metadata={"help": "Truncate targets to this many tokens (paper: 20)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only this many training pairs."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only this many validation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep only this many test pairs."})
    early_stopping_patience: int | None = field(
        default=None, metadata={"help": "Stop after this many evaluations without a better validation loss."}
    )

    def __post_init__(self):
        if self.dataset not in DATASETS:
            raise ValueError(f"--dataset must be one of {DATASETS}, got {self.dataset!r}")
        needs = {
            "files": ("train_file",),
            "quora_raw": ("quora_file",),
            "twitter_url_raw": ("twitter_train_file", "twitter_test_files"),
            "hub": ("dataset_name",),
        }.get(self.dataset, ())
        for name in needs:
            if not getattr(self, name):
                raise ValueError(f"--dataset {self.dataset} needs --{name}")
        if len(self.template_sizes) != 3:
            raise ValueError(f"--template_sizes takes three numbers (train valid test), got {self.template_sizes}")


@dataclass
class CDNPGTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` with the paper's recipe as defaults."""

    output_dir: str = field(default="runs/cdnpg", metadata={"help": "Checkpoint, predictions and metrics go here."})
    learning_rate: float = field(default=5e-5, metadata={"help": "AdamW learning rate (paper: 5e-5)."})
    lr_scheduler_type: str = field(default="linear", metadata={"help": "Paper: linear decay after warm-up."})
    warmup_steps: float = field(default=5000, metadata={"help": "Linear warm-up steps (paper: 5,000)."})
    per_device_train_batch_size: int = field(default=32, metadata={"help": "Paper: 32."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Batch size of evaluation/generation."})
    eval_strategy: str = field(default="epoch", metadata={"help": "When to compute the validation loss."})
    save_strategy: str = field(default="epoch", metadata={"help": "Must match eval_strategy for model selection."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Keep the best and the last checkpoints."})
    load_best_model_at_end: bool = field(default=True, metadata={"help": "Paper: selection by validation loss."})
    metric_for_best_model: str | None = field(default="loss", metadata={"help": "Select by validation loss."})
    predict_with_generate: bool = field(default=True, metadata={"help": "Generate on the test split."})
    generation_num_beams: int | None = field(default=8, metadata={"help": "Beam size (paper: 8)."})
    logging_steps: float = field(default=50, metadata={"help": "Log the training loss this often."})
    use_cache: bool = field(
        default=True,
        metadata={"help": "Kept in the saved config: generation uses the cache; the loss never does."},
    )


class PortableTokenizerCallback(TrainerCallback):
    """Trainer checkpoints save the tokenizer with transformers 5.x's class name; rewrite it to one 4.57 reads."""

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            make_tokenizer_config_portable(Path(args.output_dir) / f"checkpoint-{state.global_step}")


class CDNPGTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` whose `push_to_hub` model card is the project's C-DNPG card."""

    def create_model_card(self, *args, **kwargs):
        if self.is_world_process_zero():
            card = render_model_card(self.model, self.args.hub_model_id or Path(self.args.output_dir).name)
            (Path(self.args.output_dir) / "README.md").write_text(card, encoding="utf-8")


def load_pairs(args: DataArguments) -> datasets.DatasetDict:
    """Raw (source, target) splits named train / validation / test, from the source the arguments name."""
    if args.dataset == "template":
        train, valid, test = args.template_sizes
        corpus = template_corpus(num_train=train, num_valid=valid, num_test=test, seed=args.data_seed_split)
    elif args.dataset == "files":
        files = {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}
        corpus, report = load_pair_files({k: v for k, v in files.items() if v}, args.source_column, args.target_column)
        logger.info("Read pair files: %s", report.to_dict())
    elif args.dataset == "quora_raw":
        corpus, report = prepare_quora(args.quora_file, seed=args.data_seed_split)
        logger.info("Prepared Quora: %s", report.to_dict())
    elif args.dataset == "twitter_url_raw":
        corpus, report = prepare_twitter_url(
            args.twitter_train_file, args.twitter_test_files, seed=args.data_seed_split
        )
        logger.info("Prepared Twitter URL: %s", report.to_dict())
    else:
        corpus = datasets.load_dataset(args.dataset_name)
        corpus = corpus.rename_columns({args.source_column: "source", args.target_column: "target"})
    corpus = datasets.DatasetDict({("validation" if k == "valid" else k): v for k, v in corpus.items()})
    limits = {"train": args.max_train_samples, "validation": args.max_eval_samples, "test": args.max_predict_samples}
    for split, limit in limits.items():
        if limit is not None and split in corpus:
            corpus[split] = corpus[split].select(range(min(limit, len(corpus[split]))))
    return corpus


def build_model(args: ModelArguments, tokenizer) -> CDNPGForConditionalGeneration:
    if args.model_name_or_path:
        return CDNPGForConditionalGeneration.from_pretrained(args.model_name_or_path)
    return CDNPGForConditionalGeneration(build_config(args, tokenizer))


def build_config(args: ModelArguments, tokenizer) -> CDNPGConfig:
    """A new model's config: the architecture flags, and special ids from the tokenizer ([CLS] starts decoding)."""
    return CDNPGConfig(
        vocab_size=len(tokenizer),
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.attention_heads,
        decoder_attention_heads=args.attention_heads,
        encoder_ffn_dim=args.ffn_dim,
        decoder_ffn_dim=args.ffn_dim,
        dropout=args.dropout,
        attention_dropout=args.dropout,
        granularity_mask=args.granularity_mask,
        granularity_mask_mode=args.granularity_mask_mode,
        cross_attention_granularity=args.cross_attention_granularity,
        scope_epsilon=args.scope_epsilon,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        decoder_start_token_id=tokenizer.cls_token_id,
    )


def decoding_config(model: CDNPGForConditionalGeneration, num_beams: int, max_new_tokens: int) -> GenerationConfig:
    """The checkpoint's decoding defaults: the paper's beam search over at most `max_target_length` new tokens."""
    config = GenerationConfig.from_model_config(model.config)
    config.num_beams, config.max_new_tokens, config.use_cache = num_beams, max_new_tokens, True
    return config


def tokenize(corpus: datasets.DatasetDict, tokenizer, args: DataArguments) -> datasets.DatasetDict:
    """Sources as `[CLS] tokens [SEP]`; labels as `tokens [SEP]`, since the decoder starts from [CLS] itself."""

    def encode(batch):
        features = tokenizer(batch["source"], max_length=args.max_source_length, truncation=True)
        targets = tokenizer(batch["target"], max_length=args.max_target_length + 1, truncation=True)
        return {
            "input_ids": features["input_ids"],
            "attention_mask": features["attention_mask"],
            "labels": [ids[1:] for ids in targets["input_ids"]],
        }

    return corpus.map(encode, batched=True, remove_columns=corpus["train"].column_names, desc="Tokenizing")


def parse_args(argv: list[str] | None = None):
    parser = HfArgumentParser((ModelArguments, DataArguments, CDNPGTrainingArguments))
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].endswith((".json", ".yaml", ".yml")):
        path = Path(argv.pop(0))
        if not path.is_file():
            raise FileNotFoundError(f"argument file {path} does not exist")
        values = yaml.safe_load(path.read_text()) if path.suffix != ".json" else json.loads(path.read_text())
        from_file = []  # as flags placed first, so that flags given after the file override it
        for key, value in (values or {}).items():
            from_file += [f"--{key}", *map(str, value if isinstance(value, list) else [value])]
        argv = from_file + argv
    return parser.parse_args_into_dataclasses(args=argv)


def main(argv: list[str] | None = None, callbacks: list[TrainerCallback] | None = None) -> dict[str, float]:
    model_args, data_args, training_args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    transformers.utils.logging.set_verbosity(training_args.get_process_log_level())
    logger.setLevel(training_args.get_process_log_level())
    output_dir = Path(training_args.output_dir)
    metric = None
    if training_args.do_predict:  # fail now, not after training, if METEOR's WordNet is missing
        metric = evaluate.load(str(METRICS_MODULE))
        metric.compute(predictions=["a test"], references=["a test"], sources=["a test"])
    set_seed(training_args.seed)

    # ---- data and tokenizer (the main process first, the others reuse its cache and tokenizer) ----
    with training_args.main_process_first(desc="data preparation"):
        corpus = load_pairs(data_args)
        logger.info("Splits: %s", {split: len(rows) for split, rows in corpus.items()})
        tokenizer_dir = output_dir / "tokenizer"
        if model_args.tokenizer_name or model_args.model_name_or_path:
            tokenizer = load_tokenizer(model_args.tokenizer_name or model_args.model_name_or_path)
        elif training_args.process_index == 0 and not tokenizer_dir.is_dir():  # a resumed run keeps its vocabulary
            texts = [*corpus["train"]["source"], *corpus["train"]["target"]]
            tokenizer = train_wordpiece_tokenizer(texts, vocab_size=model_args.vocab_size)
            tokenizer.save_pretrained(tokenizer_dir)
        else:
            tokenizer = load_tokenizer(tokenizer_dir)
        features = tokenize(corpus, tokenizer, data_args)

    model = build_model(model_args, tokenizer)
    model.generation_config = decoding_config(model, training_args.generation_num_beams, data_args.max_target_length)
    logger.info("C-DNPG (%s): %s parameters", model.config.granularity_mask, f"{model.num_parameters():,}")

    callbacks = [PortableTokenizerCallback(), *(callbacks or [])]
    if data_args.early_stopping_patience:
        callbacks.append(EarlyStoppingCallback(data_args.early_stopping_patience))
    trainer = CDNPGTrainer(
        model=model,
        args=training_args,
        train_dataset=features["train"] if training_args.do_train else None,
        eval_dataset=features.get("validation")
        if training_args.do_eval or training_args.eval_strategy != "no"
        else None,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        callbacks=callbacks,
    )

    metrics: dict[str, float] = {}
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        metrics.update(result.metrics)
        trainer.save_state()
    if "validation" in features and (training_args.do_eval or training_args.do_train):
        metrics.update(trainer.evaluate(features["validation"], metric_key_prefix="eval"))
    if training_args.do_predict and "test" in features:
        prediction = trainer.predict(features["test"], metric_key_prefix="test")
        metrics.update(prediction.metrics)
        if trainer.is_world_process_zero():
            ids = prediction.predictions
            ids[ids < 0] = tokenizer.pad_token_id
            predictions = tokenizer.batch_decode(ids, skip_special_tokens=True)
            test = corpus["test"]
            scores = metric.compute(predictions=predictions, references=test["target"], sources=test["source"])
            metrics.update({f"test_{k}": float(v) for k, v in scores.items()})
            with (output_dir / "predictions.jsonl").open("w", encoding="utf-8") as out:
                for source, reference, predicted in zip(test["source"], test["target"], predictions, strict=True):
                    row = {"source": source, "reference": reference, "prediction": predicted}
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")

    if trainer.is_world_process_zero():
        card_metrics = {k.removeprefix("test_"): v for k, v in metrics.items() if k.startswith("test_")}
        summary = (
            f"{data_args.dataset} corpus, {len(corpus['train']):,} training pairs; AdamW lr "
            f"{training_args.learning_rate}, {training_args.lr_scheduler_type} schedule, "
            f"{training_args.warmup_steps} warm-up steps, batch {training_args.per_device_train_batch_size} per device "
            f"x {training_args.world_size} devices, {trainer.state.global_step} steps; best validation loss "
            f"{trainer.state.best_metric}."
        )
        # Seq2SeqTrainer leaves every generation default in the config (max_length too): save only what was chosen
        trainer.model.generation_config = decoding_config(
            trainer.model, training_args.generation_num_beams, data_args.max_target_length
        )
        save_checkpoint(
            trainer.model,
            tokenizer,
            output_dir,
            model_id=training_args.hub_model_id,
            metrics=card_metrics,
            dataset=data_args.dataset_name or data_args.dataset,
            training_summary=summary,
            max_length=data_args.max_source_length,
        )
        (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        logger.info("Metrics: %s", json.dumps(metrics, indent=2))
    if training_args.push_to_hub:
        trainer.push_to_hub(commit_message="C-DNPG checkpoint")
    return metrics


if __name__ == "__main__":
    main()
