"""`CDNPGTrainer`, the project's `Seq2SeqTrainer`: the granularity heads' optimizer groups, the test split decoded as
the checkpoint decodes by default, tokenizers that transformers 4.57 reads, and the C-DNPG model card. The workarounds
of library limitations it needs (DDP, FSDP2, prediction) live in `workarounds.py`; this file only calls them."""

import os
from collections.abc import Sequence
from pathlib import Path

import datasets
import torch
from transformers import (
    DataCollatorForSeq2Seq,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    TrainerCallback,
)
from transformers.modelcard import TrainingSummary

from cdnpg.data import make_tokenizer_config_portable
from cdnpg.hub import PACKAGED_MODELS, checkpoint_name, render_model_card
from cdnpg.training import workarounds
from cdnpg.training.arguments import CDNPGTrainingArguments
from modeling_cdnpg.generation_cdnpg import Z_SETTINGS, paraphrase, paraphrasing_defaults


def decoding_config(
    model: PreTrainedModel,
    num_beams: int,
    max_new_tokens: int,
    novelty: float | None = None,
    keep_details: float | None = None,
) -> GenerationConfig:
    """The checkpoint's decoding defaults: the paper's beam search over at most `max_target_length` new tokens, and
    its paraphrasing defaults (`paraphrasing_defaults`), which the pipeline, `cdnpg paraphrase` and the test split's
    prediction apply when called without them: `novelty` and `keep_details` as given (None: not set here), over those
    of the checkpoint the model was loaded from, which stay, as does the z its rules read (`Z_SETTINGS`)."""
    config = GenerationConfig.from_model_config(model.config)
    config.num_beams, config.max_new_tokens, config.use_cache = num_beams, max_new_tokens, True
    loaded = model.generation_config
    kept = {name: getattr(loaded, name) for name in Z_SETTINGS if getattr(loaded, name, None) is not None}
    given = {
        name: value for name, value in (("novelty", novelty), ("keep_details", keep_details)) if value is not None
    }
    for name, value in {**kept, **paraphrasing_defaults(loaded), **given}.items():
        setattr(config, name, value)
    return config


def run_decoding_config(model: PreTrainedModel, args: CDNPGTrainingArguments, max_new_tokens: int) -> GenerationConfig:
    """`decoding_config` from a run's flags."""
    return decoding_config(
        model, args.generation_num_beams, max_new_tokens, args.generation_novelty, args.generation_keep_details
    )


class CDNPGTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` whose optimizer may give the granularity heads their own learning rate, whose test split is
    decoded as the checkpoint decodes by default, whose saves hold tokenizers transformers 4.57 reads too, and whose
    model card (README.md, also the one `push_to_hub` uploads) is the project's C-DNPG card (a baseline's is
    transformers' own)."""

    card: dict | None = None  # `render_model_card`'s keyword arguments, set by `write_model_card`
    gather_function = workarounds.GatherForMetrics()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        workarounds.tied_copies_are_not_missing(self.model)
        if self.is_fsdp_enabled:
            workarounds.share_tied_embedding_modules(self.model)

    def create_optimizer(self, *model: torch.nn.Module) -> torch.optim.Optimizer:
        """The Trainer's optimizer (of `workarounds.optimizer_model`). With `granularity_learning_rate`, the
        granularity heads' parameters move to groups of their own at that rate (their weight decay kept), so the
        schedule scales them as it scales the rest."""
        optimizer = super().create_optimizer(*model)
        rate = getattr(self.args, "granularity_learning_rate", None)
        if rate is None:
            return optimizer
        named = workarounds.optimizer_model(self, model).named_parameters()
        heads = {id(p) for name, p in named if ".granularity_head." in name}
        for group in list(optimizer.param_groups):
            moved = [p for p in group["params"] if id(p) in heads]
            if moved:
                group["params"] = [p for p in group["params"] if id(p) not in heads]
                optimizer.add_param_group(
                    {**{k: v for k, v in group.items() if k != "params"}, "params": moved, "lr": rate}
                )
        return optimizer

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's save (checkpoints too), with tokenizers that transformers 4.57 reads; under FSDP the whole
        model, as a single process saves it (`workarounds.save_fsdp_model_whole`)."""
        output_dir = output_dir or self.args.output_dir
        if self.is_fsdp_enabled:
            workarounds.save_fsdp_model_whole(self, output_dir)
        else:
            super().save_model(output_dir, _internal_call=_internal_call)
        if self.args.should_save and self.processing_class is not None:
            make_tokenizer_config_portable(output_dir)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """Seq2SeqTrainer's step; for a model with paraphrasing defaults (`paraphrasing_defaults`), the sequences come
        from `paraphrase()`, as the pipeline and `cdnpg paraphrase` decode such a checkpoint, so that the test split is
        scored as users will decode it (generate() ignores the rules)."""
        paraphrasing = (
            self.args.predict_with_generate
            and not prediction_loss_only
            and bool(paraphrasing_defaults(self.model.generation_config))
        )
        with workarounds.generation_config_kept(self.model), workarounds.fsdp_root_unsharded(self.model):
            loss, sequences, labels = super().prediction_step(
                model, inputs, prediction_loss_only or paraphrasing, ignore_keys=ignore_keys, **gen_kwargs
            )
            if not paraphrasing:
                return loss, sequences, labels
            settings = {"num_beams": self.args.generation_num_beams, "max_length": self.args.generation_max_length}
            settings = {key: value for key, value in {**settings, **gen_kwargs}.items() if value is not None}
            source = {name: inputs[name].to(self.args.device) for name in ("input_ids", "attention_mask")}
            sequences = paraphrase(self.model, self.processing_class, source, **settings).sequences
            return loss, sequences, inputs["labels"].to(self.args.device)

    def write_model_card(self, **card) -> None:
        self.card = card
        self.create_model_card()

    def create_model_card(self, *args, **kwargs) -> None:
        if self.model.config.model_type != "cdnpg":  # a baseline (run.py --architecture): transformers' own card
            self.create_baseline_card()
        elif self.is_world_process_zero():
            # the name the card's code loads: the Hub repository when pushing, else the folder as the run named it
            pushed = self.args.push_to_hub and (self.args.hub_model_id or Path(self.args.output_dir).name)
            model_id = pushed or self.args.output_dir
            path = Path(self.args.output_dir) / "README.md"
            card = render_model_card(self.model, model_id, **(self.card or {}))
            path.with_suffix(".md.tmp").write_text(card, encoding="utf-8")
            os.replace(path.with_suffix(".md.tmp"), path)

    def create_baseline_card(self) -> None:
        """transformers' Trainer card of a baseline, saying what it was trained from: bert2bert's checkpoint, linked
        when it is on the Hub (`hub_checkpoint`), named when it is a folder here; BART from scratch. The Trainer would
        take the model's `_name_or_path`, empty for a model built from a config: a link to nothing. A Hub dataset,
        the card's one, is named in `datasets:`."""
        if not self.is_world_process_zero():
            return
        card, name = self.card or {}, Path(self.args.output_dir).name
        hub = [card["dataset"]] if card.get("dataset") else []
        summary = TrainingSummary.from_trainer(
            self,
            model_name=name,
            finetuned_from="",
            dataset=hub,
            dataset_tags=hub,
            dataset_args=[],
            dataset_metadata=[],
        )  # finetuned_from "": no Hub look-up for its licence
        encoder = getattr(self.model.config, "encoder", None)  # bert2bert's: the checkpoint it was built from
        summary.finetuned_from = hub_checkpoint(encoder._name_or_path) if encoder is not None else None
        text = summary.to_model_card()
        if encoder is not None and summary.finetuned_from is None:  # transformers words a Hub id or "from scratch"
            local = (
                f"This model is bert2bert built from the local checkpoint `{checkpoint_name(encoder._name_or_path)}`"
            )
            text = text.replace("This model was trained from scratch", f"{local}, trained")
        if card.get("training_summary"):  # the run's data, splits and recipe, as the C-DNPG card states them
            data = "## Training and evaluation data\n\n"
            text = text.replace(f"{data}More information needed", f"{data}{card['training_summary']}")
        path = Path(self.args.output_dir) / "README.md"
        path.with_suffix(".md.tmp").write_text(text, encoding="utf-8")
        os.replace(path.with_suffix(".md.tmp"), path)


def hub_checkpoint(name_or_path: str) -> str | None:
    """The Hub id of a checkpoint: as given when it is no folder here, a packaged one's (`checkpoint_name`); None
    for a folder of this machine, which no Hub link reaches."""
    if not Path(name_or_path).exists():
        return name_or_path or None
    name = checkpoint_name(name_or_path)
    return name if name in PACKAGED_MODELS else None


def make_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    features: datasets.DatasetDict,
    args: CDNPGTrainingArguments,
    max_new_tokens: int,
    callbacks: Sequence[TrainerCallback] = (),
) -> CDNPGTrainer:
    """The Trainer of a run; the model decodes as the paper does (also in the checkpoints saved during training)."""
    model.generation_config = run_decoding_config(model, args, max_new_tokens)
    if args.ddp_find_unused_parameters is None:
        args.ddp_find_unused_parameters = workarounds.ddp_find_unused_parameters(model)
    return CDNPGTrainer(
        model=model,
        args=args,
        train_dataset=features["train"] if args.do_train else None,
        eval_dataset=features.get("validation") if args.do_eval or args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        callbacks=list(callbacks),
    )
