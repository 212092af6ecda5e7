"""Every workaround of a library limitation that training needs, each through a public hook, each naming the versions
it is for. `tests/test_workarounds.py` reproduces each limitation with the plain libraries: when one of those tests
fails, upstream no longer has the limitation and the workaround below it can be deleted.

Written for transformers 5.24, accelerate 1.15 and torch 2.13. `CDNPGTrainer` (trainer.py) calls them from
`Seq2SeqTrainer`'s public hooks: `__init__`, `create_optimizer`, `prediction_step`, `save_model`, and the
`gather_function` attribute that the Trainer reads.
"""

import copy
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import PreTrainedModel, Seq2SeqTrainer
from transformers.trainer import TRAINING_ARGS_NAME

# -- Evaluation and prediction ----------------------------------------------------------------------------------------


class GatherForMetrics:
    """`Trainer.gather_function` that is always `accelerator.gather_for_metrics`.

    Seq2SeqTrainer.evaluate and .predict (transformers 5.24) switch it to `accelerator.gather`, which keeps the
    samples accelerate repeats to give every process a full last batch: the predictions of several processes would
    hold the repeats too. `gather_for_metrics` drops them, so predictions and losses are those of a single process. A
    class attribute of the Trainer (a data descriptor): the Trainer's assignments are ignored.
    """

    def __get__(self, trainer: Seq2SeqTrainer | None, owner: type | None = None):
        if trainer is None:
            return self
        return functools.partial(
            trainer.accelerator.gather_for_metrics, use_gather_object=trainer.args.eval_use_gather_object
        )

    def __set__(self, trainer: Seq2SeqTrainer, value) -> None:
        pass


@contextmanager
def generation_config_kept(model: PreTrainedModel) -> Iterator[None]:
    """The model's generation config as it was before a prediction step.

    Seq2SeqTrainer.prediction_step (transformers 5.24) writes GenerationConfig's defaults into the model's config after
    each batch (`max_length` 20 among them); beside the checkpoint's `max_new_tokens`, generate() would warn at every
    later batch that both are set, and the saved generation_config.json would carry settings nobody chose."""
    kept = copy.deepcopy(model.generation_config)
    try:
        yield
    finally:
        model.generation_config = kept


def ddp_find_unused_parameters(model: torch.nn.Module) -> bool | None:
    """`TrainingArguments.ddp_find_unused_parameters` for this model: search each step's graph for parameters without
    a gradient only where there are some (the `shared` embedding of an untied model, which no forward reads).

    The Trainer (transformers 5.24) asks DDP to search in every step of any model without activation checkpointing,
    and torch warns at every step where it finds none. None (the Trainer's choice) for a model that is not C-DNPG."""
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", None)
    return None if tied is None else not tied


def optimizer_model(trainer: Seq2SeqTrainer, passed: tuple[torch.nn.Module, ...]) -> torch.nn.Module:
    """The model whose parameters `Trainer.create_optimizer(*passed)` groups: transformers 5.x passes it (under FSDP
    the wrapped one, whose parameters the optimizer must hold), 4.57 passes none and optimizes `trainer.model`."""
    return passed[0] if passed else trainer.model


# -- Resuming: tied weights are stored once ---------------------------------------------------------------------------


def tied_copies_are_not_missing(model: torch.nn.Module) -> None:
    """Register a `load_state_dict` post hook (torch's public hook) on the model: a weight that another loaded name
    holds too (the tied embedding under `lm_head.weight`, `encoder.embed_tokens.weight`, ...) is not missing.

    The Trainer (transformers 5.24) resumes a checkpoint with `load_state_dict(strict=False)` and warns about every
    missing key; `save_pretrained` stores a tied weight once, so each resume would warn that the embedding's other
    names are missing, though nothing is."""

    def hook(module: torch.nn.Module, incompatible_keys) -> None:
        parameters = dict(module.named_parameters(remove_duplicate=False))
        missing = set(incompatible_keys.missing_keys)
        loaded = {id(parameter) for name, parameter in parameters.items() if name not in missing}
        incompatible_keys.missing_keys[:] = [
            name for name in incompatible_keys.missing_keys if id(parameters.get(name)) not in loaded
        ]

    model.register_load_state_dict_post_hook(hook)


# -- FSDP2 (accelerate 1.15, torch 2.13) ------------------------------------------------------------------------------

SHARED_MODULE_KEYS = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")  # `shared` under two more names


def share_tied_embedding_modules(model: torch.nn.Module) -> None:
    """Make the tied encoder and decoder embeddings the `shared` module itself (as transformers 4.57 ties them; 5.x
    ties the weight of three modules), and name it once in the state dict.

    accelerate 1.15 wraps the input embedding and the LM head of a tied model in one FSDP2 unit, and torch 2.13
    refuses a weight that another unit also holds ("shared with a parameter already managed by another FSDP group"):
    the encoder's and decoder's own `embed_tokens` modules hold it in the root unit. torch's FSDP checkpoints list each
    parameter under the first module that holds it: a checkpoint that also held `encoder.embed_tokens.weight` would
    not resume (KeyError in `set_model_state_dict`), so the state dict leaves out the two extra names."""
    base = getattr(model, "model", None)
    if not (getattr(model.config, "tie_word_embeddings", False) and hasattr(base, "shared")):
        return
    base.encoder.embed_tokens = base.decoder.embed_tokens = base.shared

    def drop_shared_module_keys(module, state_dict, prefix, local_metadata) -> None:
        for key in SHARED_MODULE_KEYS:
            state_dict.pop(prefix + key, None)

    base.register_state_dict_post_hook(drop_shared_module_keys)


@contextmanager
def fsdp_root_unsharded(model: torch.nn.Module) -> Iterator[None]:
    """The root FSDP2 unit's own parameters (positions, embedding LayerNorms) gathered for the body.

    FSDP2 (torch 2.13) gathers them in the hooks of the root module's forward; `generate()` (transformers 5.24) and
    the calibration of z call the encoder directly, past those hooks, and would meet shards. Each layer and the tied
    embedding are FSDP units of their own, gathered by their own hooks. Nothing happens without FSDP."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


def own_class(model: torch.nn.Module) -> type:
    """The model's class before FSDP2 sharded it.

    `fully_shard` (torch 2.13) gives the model a class of torch's making (`FSDPCDNPGForConditionalGeneration`, defined
    in torch/distributed/fsdp); `save_pretrained` (transformers 5.24) copies the code of the model's class into the
    checkpoint and names it in config.json's `auto_map`: an FSDP run would save torch's private files and an auto_map
    that cannot load."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        return type(model)
    return next(base for base in type(model).__bases__ if not issubclass(base, FSDPModule))


def tied_names_aliased(state_dict: dict[str, torch.Tensor], model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The tied names of a state dict gathered from FSDP2 shards pointing at their source tensor again.

    torch 2.13 gathers each name of a tied weight into a tensor of its own; `save_pretrained` (transformers 5.24)
    recognizes tied weights by their storage, and would store every copy. Aliased, the checkpoint stores the
    embedding once, as a single process stores it."""
    tied = model.get_expanded_tied_weights_keys(all_submodels=True)  # {tied name: source name}
    return {name: state_dict.get(tied.get(name), tensor) for name, tensor in state_dict.items()}


def save_fsdp_model_whole(trainer: Seq2SeqTrainer, output_dir: str) -> None:
    """Save an FSDP2 model as a single process saves it: the whole model in `model.safetensors`, each weight once, the
    model's own code, the tokenizer and the training arguments. Every process takes part in the gather.

    Trainer.save_model (transformers 5.24) saves no model at all under SHARDED_STATE_DICT (the checkpoints keep FSDP's
    shards, which load only under FSDP), and under FULL_STATE_DICT saves what `own_class` and `tied_names_aliased`
    correct. The checkpoints for resuming keep FSDP's own files beside these, as the Trainer writes them."""
    model = trainer.model
    state_dict = trainer.accelerator.get_state_dict(model)  # a collective: every process calls it
    if not trainer.args.should_save:
        return
    fsdp_class = type(model)
    model.__class__ = own_class(model)
    try:
        model.save_pretrained(output_dir, state_dict=tied_names_aliased(state_dict, model), is_main_process=True)
    finally:
        model.__class__ = fsdp_class
    if trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(output_dir)
    torch.save(trainer.args, Path(output_dir) / TRAINING_ARGS_NAME)
