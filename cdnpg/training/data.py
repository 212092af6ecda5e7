"""A run's data: the (source, target) pairs from the source the flags name, the tokenizer (given, the checkpoint's, or
WordPiece trained on the training split), and the tokenized features."""

import logging
from pathlib import Path

import datasets
from transformers import PreTrainedTokenizerBase

from cdnpg.data import (
    MissingColumnError,
    PairDataReport,
    TooFewPairsError,
    both_directions,
    drop_near_copies,
    load_pair_files,
    load_tokenizer,
    prepare_quora,
    prepare_twitter_url,
    template_corpus,
    train_wordpiece_tokenizer,
)
from cdnpg.training.arguments import (
    QUORA_SIZES,
    TEMPLATE_SIZES,
    CDNPGTrainingArguments,
    DataArguments,
    ModelArguments,
    UsageError,
)

logger = logging.getLogger("cdnpg.training")


def load_pairs(args: DataArguments) -> tuple[datasets.DatasetDict, str]:
    """Raw (source, target) splits named train / validation / test, from the source the arguments name, and the
    model card's words for that source (`describe_data`)."""
    report = None
    if args.dataset == "template":
        train, valid, test = args.template_sizes or TEMPLATE_SIZES
        corpus = template_corpus(num_train=train, num_valid=valid, num_test=test, seed=args.data_seed_split)
    elif args.dataset == "files":
        files = {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}
        try:
            corpus, report = load_pair_files(
                {k: v for k, v in files.items() if v}, args.source_column, args.target_column
            )
        except MissingColumnError as error:
            raise UsageError(
                f"{error}: name the columns with --source_column and --target_column (now {args.source_column!r} "
                f"and {args.target_column!r})"
            ) from None
        logger.info("Read pair files: %s", report.to_dict())
    elif args.dataset == "quora_raw":
        train, valid, test = args.quora_sizes or QUORA_SIZES
        try:
            corpus, report = prepare_quora(
                args.quora_file, seed=args.data_seed_split, train_size=train, valid_size=valid, test_size=test
            )
        except TooFewPairsError as error:
            scaled = " ".join(str(size * error.available // error.requested) for size in (train, valid, test))
            raise UsageError(
                f"--quora_file {args.quora_file} holds {error.available} duplicate pairs, fewer than the "
                f"{error.requested} of --quora_sizes {train} {valid} {test}: give smaller --quora_sizes, e.g. "
                f"--quora_sizes {scaled}"
            ) from None
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
    check_not_empty(corpus, args)
    limits = {"train": args.max_train_samples, "validation": args.max_eval_samples, "test": args.max_predict_samples}
    for split, limit in limits.items():
        if limit is not None and split in corpus:
            corpus[split] = corpus[split].select(range(min(limit, len(corpus[split]))))
    if args.drop_near_copies is not None and "train" in corpus:
        kept = drop_near_copies(corpus["train"], args.drop_near_copies)
        if not len(kept):
            raise UsageError(f"--drop_near_copies {args.drop_near_copies} leaves no training pair: raise it")
        logger.info(
            "--drop_near_copies %s: kept %d of %d training pairs",
            args.drop_near_copies,
            len(kept),
            len(corpus["train"]),
        )
        corpus["train"] = kept
    if args.both_directions and "train" in corpus:
        corpus["train"] = both_directions(corpus["train"])
    return corpus, describe_data(args, report)


def check_not_empty(corpus: datasets.DatasetDict, args: DataArguments) -> None:
    """Every split holds a pair, checked before the tokenizer is trained: the Trainer would stop at an empty one with
    a traceback ("No columns in the dataset match the model's forward method signature")."""
    origin = {
        "files": {"train": "--train_file", "validation": "--validation_file", "test": "--test_file"},
        "quora_raw": dict.fromkeys(("train", "validation", "test"), "--quora_file"),
        "twitter_url_raw": {"train": "--twitter_train_file", "test": "--twitter_test_files"},
    }.get(args.dataset, {})
    for split, rows in corpus.items():
        if len(rows):
            continue
        flag = origin.get(split)
        value = getattr(args, flag.removeprefix("--")) if flag else None
        named = (
            f"{flag} {' '.join(value) if isinstance(value, list) else value}" if flag else f"--dataset {args.dataset}"
        )
        raise UsageError(f"{named}: no usable pair in the {split} split (an empty file, or no line with both columns)")


def hub_dataset(args: DataArguments) -> str | None:
    """The Hub dataset the run loaded (`--dataset_name`), the one the model card's `datasets:` metadata may name; None
    for local files, a local folder given to --dataset_name and the template corpus, which are no Hub datasets."""
    local = args.dataset == "hub" and Path(args.dataset_name).expanduser().exists()
    return args.dataset_name if args.dataset == "hub" and not local else None


def describe_data(args: DataArguments, report: PairDataReport | None = None) -> str:
    """The training data in the model card's words: the Hub dataset by its id; local files by their names (their
    folders say nothing to the card's readers) with the rows read from each and, where some were not pairs (Quora's
    non-duplicates, malformed lines), the pairs kept; or cdnpg's template corpus."""
    if args.dataset == "hub":
        hub = hub_dataset(args)
        return f"the Hub dataset {hub}" if hub else f"the local dataset {Path(args.dataset_name).name}"
    if args.dataset == "template":
        return "cdnpg's synthetic template corpus"
    files = []
    for file in report.files.values() if report else ():
        kept = f", {file.kept:,} pairs kept" if file.kept != file.records else ""
        files.append(f"{Path(file.path).name} ({file.records:,} rows{kept})")
    return f"the local file{'s' if len(files) > 1 else ''} {', '.join(files)}"


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


def prepare_data(
    model_args: ModelArguments, data_args: DataArguments, training_args: CDNPGTrainingArguments
) -> tuple[datasets.DatasetDict, str, PreTrainedTokenizerBase, datasets.DatasetDict]:
    """Pairs, the model card's words for them (`describe_data`), tokenizer and features; the main process first, the
    others reuse its cache and tokenizer.

    The tokenizer is `--tokenizer_name`'s, the fine-tuned checkpoint's, or WordPiece trained on the training split
    and kept in `output_dir/tokenizer`, so that a resumed run keeps its vocabulary.
    """
    with training_args.main_process_first(desc="data preparation"):
        corpus, description = load_pairs(data_args)
        logger.info("Splits: %s", {split: len(rows) for split, rows in corpus.items()})
        for stage, split in (("do_train", "train"), ("do_eval", "validation"), ("do_predict", "test")):
            if getattr(training_args, stage) and split not in corpus:  # a Hub dataset without it, say
                raise UsageError(f"--{stage}: the data has no {split} split (splits: {', '.join(corpus)})")
        tokenizer_dir = Path(training_args.output_dir) / "tokenizer"
        if model_args.tokenizer_name or model_args.model_name_or_path or model_args.init_from:
            tokenizer = load_tokenizer(
                model_args.tokenizer_name or model_args.model_name_or_path or model_args.init_from
            )
        elif training_args.process_index == 0 and not tokenizer_dir.is_dir():
            texts = [*corpus["train"]["source"], *corpus["train"]["target"]]
            tokenizer = train_wordpiece_tokenizer(texts, vocab_size=model_args.vocab_size)
            tokenizer.save_pretrained(tokenizer_dir)
        else:
            tokenizer = load_tokenizer(tokenizer_dir)
        features = tokenize(corpus, tokenizer, data_args)
    return corpus, description, tokenizer, features
