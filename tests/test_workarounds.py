"""Each workaround of `cdnpg/training/workarounds.py` is there for a limitation of the libraries installed
(transformers 5.24, accelerate 1.15, torch 2.13). Each test below reproduces one with the plain library and asserts
that it is still there, then that the workaround removes it: when the first assertion fails, upstream has fixed the
limitation, and the workaround the test names can be deleted. The FSDP2 workarounds need a process group:
`tests/test_fsdp.py` checks them in its 2-process test (`upstream_fsdp2_limitations`).
"""

import json
import logging
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer, GenerationConfig, Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer

from cdnpg.training import workarounds
from cdnpg.training.arguments import CDNPGTrainingArguments
from cdnpg.training.trainer import CDNPGTrainer
from tests.conftest import tiny_model


def pairs(count: int = 8) -> Dataset:
    """Token-id pairs of one length (no padding needed) inside the tiny model's vocabulary."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 60, (count, 6), generator=generator)
    return Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.flip(1).tolist()})


def training_args(folder, **overrides) -> Seq2SeqTrainingArguments:
    settings = dict(
        output_dir=str(folder), per_device_train_batch_size=4, per_device_eval_batch_size=4, max_steps=2,
        save_strategy="steps", save_steps=2, eval_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
        predict_with_generate=True, generation_num_beams=2,
    )  # fmt: skip
    return Seq2SeqTrainingArguments(**{**settings, **overrides})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """A checkpoint of transformers' plain Seq2SeqTrainer, 2 steps of a tiny tied C-DNPG."""
    folder = tmp_path_factory.mktemp("plain")
    Seq2SeqTrainer(model=tiny_model().train(), args=training_args(folder), train_dataset=pairs()).train()
    return str(folder / "checkpoint-2")


@contextmanager
def trainer_warnings() -> list[str]:
    """The messages transformers' Trainer logs (its logger does not propagate to pytest's)."""
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("transformers.trainer")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def test_seq2seq_trainer_predicts_with_a_gather_that_keeps_accelerates_repeated_samples(tmp_path, monkeypatch):
    """`GatherForMetrics`: Seq2SeqTrainer.predict gathers with `accelerator.gather`, which keeps the samples accelerate
    repeats to fill the last batch of every process."""
    seen = []
    evaluation_loop = Trainer.evaluation_loop

    def spy(self, *args, **kwargs):
        seen.append(self.gather_function)
        return evaluation_loop(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "evaluation_loop", spy)
    plain = Seq2SeqTrainer(model=tiny_model(), args=training_args(tmp_path))
    plain.predict(pairs(4), max_new_tokens=2)
    assert seen.pop() == plain.accelerator.gather  # upstream still gathers so: keep the workaround

    ours = CDNPGTrainer(model=tiny_model(), args=training_args(tmp_path))
    ours.predict(pairs(4), max_new_tokens=2)
    assert seen.pop().func == ours.accelerator.gather_for_metrics


def test_seq2seq_prediction_steps_write_generation_defaults_into_the_model_config(tmp_path):
    """`generation_config_kept`: after a prediction step the model's generation config holds GenerationConfig's
    defaults (max_length 20 beside the checkpoint's max_new_tokens), which generate() warns about at the next batch."""
    batch = {key: torch.tensor(value) for key, value in pairs(2)[:].items()}
    for trainer_class, changed in ((Seq2SeqTrainer, True), (CDNPGTrainer, False)):
        model = tiny_model()
        model.generation_config = GenerationConfig(num_beams=2, max_new_tokens=4, decoder_start_token_id=1)
        trainer = trainer_class(model=model, args=training_args(tmp_path))
        trainer.prediction_step(model, batch, prediction_loss_only=False)
        assert (model.generation_config.max_length == 20) is changed, trainer_class.__name__


def test_the_trainer_asks_ddp_to_search_every_step_for_parameters_without_a_gradient(tmp_path):
    """`ddp_find_unused_parameters`: the Trainer passes find_unused_parameters=True to DDP for a model without
    activation checkpointing; a tied C-DNPG has no unused parameter, and torch warns at every step that it found none
    (tests/test_distributed.py shows the warning gone)."""
    plain = Seq2SeqTrainer(model=tiny_model(), args=training_args(tmp_path))
    assert plain.accelerator.ddp_handler.find_unused_parameters is True
    assert workarounds.ddp_find_unused_parameters(tiny_model()) is False
    assert workarounds.ddp_find_unused_parameters(tiny_model(tie_word_embeddings=False)) is True


def test_resuming_a_tied_model_warns_that_its_tied_names_are_missing(tmp_path, checkpoint):
    """`tied_copies_are_not_missing`: the Trainer resumes with `load_state_dict(strict=False)` and warns about every
    name of the tied embedding that `save_pretrained` stored once."""
    for trainer_class, warned in ((Seq2SeqTrainer, True), (CDNPGTrainer, False)):
        args = training_args(tmp_path / trainer_class.__name__, save_strategy="no")
        trainer = trainer_class(model=tiny_model().train(), args=args, train_dataset=pairs())
        with trainer_warnings() as messages:
            trainer.train(resume_from_checkpoint=checkpoint)  # at step 2 of 2: loads, trains nothing
        missing = [message for message in messages if "missing keys" in message]
        assert bool(missing) is warned, (trainer_class.__name__, missing)
        if warned:
            assert "lm_head.weight" in missing[0]


def test_trainer_save_model_saves_no_model_under_fsdp_sharded_state_dict(tmp_path):
    """`save_fsdp_model_whole`: Trainer.save_model under FSDP with SHARDED_STATE_DICT writes nothing, so the run's
    output folder would hold no model. The Trainer's own method, on a stand-in for a Trainer set up that way."""
    plugin = SimpleNamespace(state_dict_type="StateDictType.SHARDED_STATE_DICT")
    fsdp_trainer = SimpleNamespace(
        args=SimpleNamespace(output_dir=str(tmp_path), push_to_hub=False), is_fsdp_enabled=True,
        accelerator=SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)),
        _save=lambda *args, **kwargs: pytest.fail("the Trainer saved the model"),
    )  # fmt: skip
    Trainer.save_model(fsdp_trainer, str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_transformers_saves_a_tokenizer_class_that_4_57_cannot_load(tmp_path, tokenizer_dir):
    """`CDNPGTrainer.save_model` makes every saved tokenizer_config.json portable (`make_tokenizer_config_portable`):
    transformers 5.x names the generic fast tokenizer "TokenizersBackend", a class 4.57 does not have."""
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"


def test_the_granularity_learning_rate_keeps_every_other_setting_of_the_trainer_optimizer(tmp_path):
    """`CDNPGTrainer.create_optimizer` passes on what the Trainer gives it (a model under FSDP in 5.x, nothing in
    4.57): without granularity_learning_rate it is the Trainer's optimizer."""
    common = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", eval_strategy="no",
                  load_best_model_at_end=False, save_strategy="no")  # fmt: skip
    plain = CDNPGTrainer(model=tiny_model(), args=CDNPGTrainingArguments(**common))
    model = tiny_model()
    given = plain.create_optimizer(model)
    assert {id(p) for group in given.param_groups for p in group["params"]} == {id(p) for p in model.parameters()}


def test_transformers_passes_create_optimizer_the_model_to_optimize_and_its_granularity_heads_get_their_rate(tmp_path):
    import inspect

    assert "model" in inspect.signature(Trainer.create_optimizer).parameters  # transformers 5.x; 4.57 passes none
    common = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", eval_strategy="no",
                  load_best_model_at_end=False, save_strategy="no", granularity_learning_rate=0.5)  # fmt: skip
    own, passed = tiny_model(), tiny_model(seed=1)
    trainer = CDNPGTrainer(model=own, args=CDNPGTrainingArguments(**common))
    assert (
        workarounds.optimizer_model(trainer, ()) is own and workarounds.optimizer_model(trainer, (passed,)) is passed
    )
    heads = {id(p) for name, p in passed.named_parameters() if ".granularity_head." in name}
    grouped = [group for group in trainer.create_optimizer(passed).param_groups if group["lr"] == 0.5]
    assert heads and {id(p) for group in grouped for p in group["params"]} == heads  # the passed model's heads
