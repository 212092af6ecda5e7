"""`CDNPGTrainer`, the project's `Seq2SeqTrainer`: the granularity heads' optimizer groups, the checkpoint's decoding
defaults, the C-DNPG model card, and the workarounds that DDP and FSDP need (tied embeddings shared as one module,
the root module unsharded for `generate()`, saves as a single process makes them); `make_trainer` builds the run's."""

import copy
import functools
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import datasets
import torch
from accelerate.utils import DistributedType
from transformers import (
    DataCollatorForSeq2Seq,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    TrainerCallback,
)

from cdnpg.data import make_tokenizer_config_portable
from cdnpg.hub import render_model_card
from cdnpg.training.arguments import CDNPGTrainingArguments
from modeling_cdnpg.generation_cdnpg import paraphrase

logger = logging.getLogger("cdnpg.training")
PARAPHRASE_DEFAULTS = ("novelty", "keep_details")  # generation config fields that make paraphrase() the decoding


def distributed_strategy(accelerator) -> str:
    """How accelerate set up this run's processes, as the log and the model card name it."""
    if accelerator.distributed_type == DistributedType.FSDP:
        return f"FSDP{accelerator.state.fsdp_plugin.fsdp_version}"
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        return "DeepSpeed"
    return "DDP" if accelerator.num_processes > 1 else "one process"


def requested_strategy() -> str | None:
    """What the accelerate config asked for, as `accelerate launch` tells the processes it starts."""
    for variable, strategy in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")):
        if os.environ.get(variable, "false").lower() == "true":
            return strategy
    return None


def report_strategy(trainer: Seq2SeqTrainer) -> None:
    """Say which strategy trains, and warn when the config asked for another: accelerate 1.15 sets FSDP up on GPUs
    only, and trains an FSDP config with --use_cpu true as plain DDP without a word."""
    accelerator = trainer.accelerator
    ran, asked = distributed_strategy(accelerator), requested_strategy()
    processes = accelerator.num_processes
    logger.info("Distributed strategy: %s (%d process%s)", ran, processes, "es" if processes > 1 else "")
    if asked and not ran.startswith(asked) and trainer.is_world_process_zero():
        logger.warning(
            "The accelerate config asks for %s, but these %d processes train as %s%s",
            asked,
            processes,
            ran,
            " (a full copy of the model in each, nothing sharded): accelerate sets up FSDP on GPUs only"
            if accelerator.device.type == "cpu"
            else "",
        )


def share_tied_embedding_modules(model: torch.nn.Module) -> None:
    """Make the tied encoder and decoder embeddings the `shared` module itself (as transformers 4.57 ties them; 5.x
    ties the weight of three modules). FSDP2, as accelerate wraps a model, puts the input embedding and the LM head in
    one unit, and refuses a tied weight that another module also holds ("shared with a parameter already managed by
    another FSDP group")."""
    base = getattr(model, "model", None)
    if getattr(model.config, "tie_word_embeddings", False) and hasattr(base, "shared"):
        base.encoder.embed_tokens = base.decoder.embed_tokens = base.shared
        base.register_state_dict_post_hook(drop_shared_module_keys)
        base.register_load_state_dict_post_hook(accept_shared_module_keys_missing)


SHARED_MODULE_KEYS = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")  # `shared` under two more names


def drop_shared_module_keys(module, state_dict, prefix, local_metadata) -> None:
    """The state dict names the shared embedding once (`shared.weight`), as `named_parameters` does. torch's FSDP
    checkpoint loading lists each parameter under the first module that holds it: a checkpoint that also held
    `encoder.embed_tokens.weight` failed to resume (KeyError in `set_model_state_dict`)."""
    for key in SHARED_MODULE_KEYS:
        state_dict.pop(prefix + key, None)


def accept_shared_module_keys_missing(module, incompatible_keys) -> None:
    """`load_state_dict` fills the shared embedding through `shared.weight`; its other names are not missing."""
    incompatible_keys.missing_keys[:] = [
        key for key in incompatible_keys.missing_keys if not key.endswith(SHARED_MODULE_KEYS)
    ]


@contextmanager
def saved_as_its_own_class(model: torch.nn.Module) -> Iterator[None]:
    """FSDP2 gives a sharded model a class of torch's making (`FSDPCDNPGForConditionalGeneration`, defined in
    torch/distributed/fsdp); `save_pretrained` copies the code of the model's class into the checkpoint and names it
    in config.json's `auto_map`, so FSDP runs saved torch's private FSDP files and an auto_map that could not load.
    While saving, the model has its own class back."""
    from torch.distributed.fsdp import FSDPModule

    fsdp_class = type(model)
    if not isinstance(model, FSDPModule):
        yield
        return
    model.__class__ = next(base for base in fsdp_class.__bases__ if not issubclass(base, FSDPModule))
    try:
        yield
    finally:
        model.__class__ = fsdp_class


def tied_names_aliased(state_dict: dict[str, torch.Tensor], model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """A state dict gathered from FSDP shards holds a separate copy of each tied weight; transformers recognizes tied
    weights by their storage, and saved every copy. The tied names point at their source again, so that the
    checkpoint stores the embedding once, as a single process saves it."""
    tied = model.get_expanded_tied_weights_keys(all_submodels=True)  # {tied name: source name}
    return {name: state_dict.get(tied.get(name), tensor) for name, tensor in state_dict.items()}


@contextmanager
def fsdp_root_unsharded(model: torch.nn.Module) -> Iterator[None]:
    """Under FSDP2 the root module's own parameters (positions, embedding LayerNorms) are gathered by the hooks of its
    forward; `generate()` and the calibration call the encoder directly, past those hooks, and would meet shards.
    Each layer and the tied embedding are FSDP units of their own, gathered by their own hooks."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


def decoding_config(
    model: PreTrainedModel,
    num_beams: int,
    max_new_tokens: int,
    novelty: float | None = None,
    keep_details: float | None = None,
) -> GenerationConfig:
    """The checkpoint's decoding defaults: the paper's beam search over at most `max_target_length` new tokens, and
    the paraphrasing rules (`novelty`, `keep_details`) that the pipeline and `cdnpg paraphrase` apply when called
    without decoding arguments (`--generation_novelty`, `--generation_keep_details`; left out when None)."""
    config = GenerationConfig.from_model_config(model.config)
    config.num_beams, config.max_new_tokens, config.use_cache = num_beams, max_new_tokens, True
    for name, value in (("novelty", novelty), ("keep_details", keep_details)):
        if value is not None:
            setattr(config, name, value)
    return config


def run_decoding_config(model: PreTrainedModel, args: CDNPGTrainingArguments, max_new_tokens: int) -> GenerationConfig:
    """`decoding_config` from a run's flags."""
    return decoding_config(
        model, args.generation_num_beams, max_new_tokens, args.generation_novelty, args.generation_keep_details
    )


def paraphrases_by_default(model: PreTrainedModel) -> bool:
    """The model's generation config names a paraphrasing rule (`novelty` or `keep_details`): the pipeline decodes
    it through `paraphrase()`, and so does the test split's prediction."""
    return any(getattr(model.generation_config, name, None) is not None for name in PARAPHRASE_DEFAULTS)


class CDNPGTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` that saves tokenizers transformers 4.57 reads too, and whose model card (README.md, also the
    one `push_to_hub` uploads) is the project's C-DNPG card."""

    card: dict | None = None  # `render_model_card`'s keyword arguments, set by `write_model_card`

    def __init__(self, *args, **kwargs) -> None:
        model, training_args = kwargs.get("model"), kwargs.get("args")
        tied = getattr(getattr(model, "config", None), "tie_word_embeddings", None)  # None: not C-DNPG (bert2bert)
        if training_args is not None and training_args.ddp_find_unused_parameters is None and tied is not None:
            # DDP searches each step's graph for parameters without a gradient only where there are some (torch warns
            # at every step otherwise): the `shared` embedding of an untied model, which no forward reads
            training_args.ddp_find_unused_parameters = not tied
        super().__init__(*args, **kwargs)
        if self.is_fsdp_enabled:
            share_tied_embedding_modules(self.model)

    @property
    def gather_function(self):
        """`gather_for_metrics`, always. Seq2SeqTrainer's evaluate/predict switch to `gather`, which keeps the samples
        accelerate repeats to give every process a full last batch: 20 test pairs on 2 processes came back as 128
        predictions. `gather_for_metrics` drops them, so predictions and losses are those of a single process."""
        return functools.partial(
            self.accelerator.gather_for_metrics, use_gather_object=self.args.eval_use_gather_object
        )

    @gather_function.setter
    def gather_function(self, value) -> None:  # Trainer and Seq2SeqTrainer assign it; the property decides
        pass

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        """The Trainer's optimizer; with `granularity_learning_rate`, the granularity heads' parameters move to groups
        of their own at that rate (their weight decay kept), so the schedule scales them as it scales the rest."""
        # transformers 4.57's create_optimizer takes no argument
        optimizer = super().create_optimizer(model) if model is not None else super().create_optimizer()
        rate = getattr(self.args, "granularity_learning_rate", None)
        if rate is None:
            return optimizer
        heads = {id(p) for name, p in (model or self.model).named_parameters() if ".granularity_head." in name}
        for group in list(optimizer.param_groups):
            moved = [p for p in group["params"] if id(p) in heads]
            if moved:
                group["params"] = [p for p in group["params"] if id(p) not in heads]
                optimizer.add_param_group(
                    {**{k: v for k, v in group.items() if k != "params"}, "params": moved, "lr": rate}
                )
        return optimizer

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """The Trainer's save; under FSDP as a single process saves: the model's own code and each weight once."""
        if state_dict is not None and self.is_fsdp_enabled:
            state_dict = tied_names_aliased(state_dict, self.accelerator.unwrap_model(self.model))
        with saved_as_its_own_class(self.model):
            super()._save(output_dir, state_dict=state_dict)

    @property
    def fsdp_saves_shards(self) -> bool:
        """FSDP with SHARDED_STATE_DICT: the Trainer's checkpoints hold FSDP's shards only, no model to load."""
        plugin = getattr(self.accelerator.state, "fsdp_plugin", None)
        return self.is_fsdp_enabled and "SHARDED_STATE_DICT" in str(plugin.state_dict_type)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's save, with tokenizers that transformers 4.57 reads. With FSDP's SHARDED_STATE_DICT the
        Trainer saves no model at all (checkpoints keep the shards): the run's own model is gathered and saved whole,
        so that the output folder loads in one process."""
        if self.fsdp_saves_shards and not _internal_call:
            self._save(output_dir, state_dict=self.accelerator.get_state_dict(self.model))
        else:
            super().save_model(output_dir, _internal_call=_internal_call)
        model_saved = not (self.fsdp_saves_shards and _internal_call)
        if self.args.should_save and self.processing_class is not None and model_saved:  # checkpoints come here too
            make_tokenizer_config_portable(output_dir or self.args.output_dir)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """Seq2SeqTrainer's step, with the model's generation config as it was: transformers 5.24 writes
        GenerationConfig's defaults into it after each batch (`max_length` 20 among them), and beside the checkpoint's
        `max_new_tokens` generate() then warned at every later batch that both were set."""
        config = self.model.generation_config
        kept = copy.deepcopy(config)
        try:
            with fsdp_root_unsharded(self.model):
                if self.args.predict_with_generate and not prediction_loss_only and paraphrases_by_default(self.model):
                    return self.paraphrase_step(model, inputs, ignore_keys, **gen_kwargs)
                return super().prediction_step(
                    model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs
                )
        finally:
            self.model.generation_config = kept

    def paraphrase_step(self, model, inputs, ignore_keys=None, **gen_kwargs):
        """Seq2SeqTrainer's generating step for a model whose generation config names a paraphrasing rule: the
        sequences come from `paraphrase()`, as the pipeline and `cdnpg paraphrase` decode such a checkpoint, so that
        the test split is scored as users will decode it (Seq2SeqTrainer would call generate(), which ignores the
        rules). The loss is the Trainer's, with the labels."""
        loss, _, _ = super().prediction_step(model, inputs, prediction_loss_only=True, ignore_keys=ignore_keys)
        inputs = self._prepare_inputs(inputs)
        given = gen_kwargs or getattr(self, "_gen_kwargs", {})  # Seq2SeqTrainer.predict()'s, as its step reads them
        settings = {key: value for key, value in given.items() if value is not None and key != "synced_gpus"}
        source = {"input_ids": inputs["input_ids"], "attention_mask": inputs.get("attention_mask")}
        sequences = paraphrase(self.model, self.processing_class, source, **settings).sequences
        return loss, sequences, inputs.get("labels")

    def _issue_warnings_after_load(self, load_result) -> None:
        """The Trainer's report of a resumed checkpoint, without the tied copies of the embedding (the encoder's and
        decoder's `embed_tokens` and `lm_head` are one tensor, stored once): only weights that are really missing."""
        parameters = dict(self.model.named_parameters(remove_duplicate=False))
        loaded = [parameters[name] for name in parameters if name not in load_result.missing_keys]
        missing = [
            name
            for name in load_result.missing_keys
            if not any(parameters.get(name) is parameter for parameter in loaded)
        ]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def write_model_card(self, **card) -> None:
        self.card = card
        self.create_model_card()

    def create_model_card(self, *args, **kwargs) -> None:
        if self.is_world_process_zero():
            # the name the card's code loads: the Hub repository when pushing, else the folder as the run named it
            pushed = self.args.push_to_hub and (self.args.hub_model_id or Path(self.args.output_dir).name)
            model_id = pushed or self.args.output_dir
            path = Path(self.args.output_dir) / "README.md"
            card = render_model_card(self.model, model_id, **(self.card or {}))
            path.with_suffix(".md.tmp").write_text(card, encoding="utf-8")
            os.replace(path.with_suffix(".md.tmp"), path)


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
    return CDNPGTrainer(
        model=model,
        args=args,
        train_dataset=features["train"] if args.do_train else None,
        eval_dataset=features.get("validation") if args.do_eval or args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        callbacks=list(callbacks),
    )
