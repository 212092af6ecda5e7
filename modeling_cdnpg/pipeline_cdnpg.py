"""`pipeline("text2text-generation", model=..., trust_remote_code=True)` for C-DNPG checkpoints (`custom_pipelines`:
transformers 5.x has none built in). Remote code: imports only torch and transformers (4.57 and 5.x)."""

import warnings

import torch
from transformers import Pipeline, PreTrainedTokenizerBase
from transformers.utils import logging

from .generation_cdnpg import SETTINGS, Z_SETTINGS, enough_beams, paraphrase, paraphrasing_defaults

logger = logging.get_logger(__name__)

NO_LIMIT = 10**6  # transformers' "no limit" model_max_length is 1e30; anything this large is no real limit
PARTS = {"score": "sequences_scores", "log_likelihood": "log_likelihoods", "source_overlap": "source_overlaps",
         "details_kept": "details_kept", "reverse_log_likelihood": "reverse_log_likelihoods",
         "similarity": "similarities"}  # a candidate's keys: the fields of paraphrase()'s output they come from # fmt: skip
SHOWN_CHARACTERS = 40  # of an input named in a warning
PARAPHRASING = tuple(key for key in (*SETTINGS, *Z_SETTINGS) if key != "num_return_sequences")  # not generate()'s


class FewerCandidatesWarning(UserWarning):
    """An input got fewer candidates than `num_return_sequences`: the searches found no more distinct new ones."""


def unreadable(tokenizer: PreTrainedTokenizerBase, text: str) -> str | None:
    """Why `text` has nothing to paraphrase (empty, blank, or every token unknown to the tokenizer), or None: from it
    the model would write a sentence of its own, or a confident paraphrase of [UNK]s, so it gets none."""
    if not text.strip():
        return "is empty"
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    if not ids:
        return "has no tokens the tokenizer keeps"
    if tokenizer.unk_token_id is not None and all(token == tokenizer.unk_token_id for token in ids):
        return f"has only tokens unknown to the tokenizer (all {tokenizer.unk_token}): its vocabulary cannot read it"
    return None


def unread_text(tokenizer: PreTrainedTokenizerBase, text: str) -> str:
    """The characters of `text` (spaces aside) that a fast tokenizer reads as unknown or drops ("" for a slow one)."""
    found = tokenizer(text, add_special_tokens=False, return_offsets_mapping=tokenizer.is_fast, verbose=False)
    spans = zip(found["input_ids"], found.get("offset_mapping") or [(0, len(text))] * len(found["input_ids"]))
    read = {i for token, (start, end) in spans if token != tokenizer.unk_token_id for i in range(start, end)}
    return "".join(character for i, character in enumerate(text) if i not in read and not character.isspace())


def input_limit(model, tokenizer: PreTrainedTokenizerBase) -> tuple[int, str]:
    """The most input tokens (with specials) the model takes, and why: max_position_embeddings or model_max_length."""
    positions = getattr(model.config, "max_position_embeddings", None) or NO_LIMIT
    tokenizer_max = getattr(tokenizer, "model_max_length", None) or NO_LIMIT
    if tokenizer_max < positions:
        return int(tokenizer_max), f"the tokenizer's model_max_length={tokenizer_max}"
    reason = f"the model's max_position_embeddings={positions}" if positions < NO_LIMIT else "no limit declared"
    return positions, reason


def truncated(tokens: int, limit: int, reason: str) -> str | None:
    """The warning for an input of `tokens` tokens (specials included) over `limit` (`input_limit`), or None."""
    cut = f"has {tokens} tokens, more than the model takes: truncated to its first {limit} tokens ({reason})"
    return cut if tokens > limit else None


class CDNPGText2TextPipeline(Pipeline):
    """Paraphrases a string or a list of strings: per input, a list of candidates `{"generated_text": ...}`.
    Generation keyword arguments go to `model.generate()`, beams raised to num_return_sequences (`enough_beams`); a
    setting of `ParaphraseSettings` (given, or in the generation_config) paraphrases through `paraphrase()`: each
    candidate with its `score` and parts (`PARTS`), fewer than asked with a `FewerCandidatesWarning`. An input with
    nothing to paraphrase (`unreadable`) gets an empty list, one longer than the model takes is truncated, each with a
    warning naming it by `input_numbers` (default 1, 2, ...)."""

    _pipeline_calls_generate = True  # 5.x: lets the pipeline own a generation config; ignored by 4.57

    def __call__(self, inputs, input_numbers=None, **kwargs):
        """inputs: a string or a list of strings (a generator or a dataset is streamed as transformers streams it).
        input_numbers: how warnings name each input (default 1, 2, ...).
        kwargs: see `_sanitize_parameters`."""
        texts = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
            return super().__call__(inputs, **kwargs)  # a generator or a dataset: streamed as is
        limit, reason = input_limit(self.model, self.tokenizer)
        problems = [unreadable(self.tokenizer, text) for text in texts]
        for number, text, problem in zip(input_numbers or range(1, len(texts) + 1), texts, problems):
            if problem:
                logger.warning("input %d %s: no paraphrase", number, problem)
            elif note := truncated(len(self.tokenizer(text, verbose=False)["input_ids"]), limit, reason):
                warnings.warn(f"input {number} {note}", UserWarning, stacklevel=2)
            if not problem and (lost := unread_text(self.tokenizer, text)):  # e.g. a script it has no words of
                said = f"cannot read {len(lost)} of its {len(''.join(text.split()))} characters: {lost[:SHOWN_CHARACTERS]!r}"
                warnings.warn(f"input {number}: the model {said} (unknown to its tokenizer)", stacklevel=2)
        readable = [text for text, problem in zip(texts, problems) if not problem]
        paraphrases = iter(super().__call__(readable, **kwargs) if readable else [])
        results = [[] if problem else next(paraphrases) for problem in problems]
        return results[0] if isinstance(inputs, str) else results

    def _sanitize_parameters(self, truncation: bool | None = None, clean_up_tokenization_spaces=None, **generate):
        """truncation: cut an input longer than the model takes (default `True`, with a warning naming it).
        clean_up_tokenization_spaces: the tokenizer's clean-up of spaces when decoding (default `True`).
        generate: `generate()`'s keyword arguments, and the settings of `ParaphraseSettings` (`PARAPHRASING`)."""
        preprocess = {} if truncation is None else {"truncation": truncation}
        spaces = clean_up_tokenization_spaces
        return preprocess, generate, {} if spaces is None else {"clean_up_tokenization_spaces": spaces}

    def preprocess(self, text: str, truncation: bool = True) -> dict[str, torch.Tensor]:
        if not isinstance(text, str):
            raise TypeError(f"text2text-generation takes a string or a list of strings, got {type(text).__name__}")
        limit, _ = input_limit(self.model, self.tokenizer)
        inputs = self.tokenizer(text, return_tensors="pt", truncation=truncation, max_length=limit, verbose=False)
        return {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}

    def _forward(self, model_inputs: dict[str, torch.Tensor], **generate_kwargs) -> dict[str, torch.Tensor]:
        def per_input(rows: torch.Tensor) -> torch.Tensor:  # (b * n, ...) -> (b, n, ...): batched as the inputs
            return rows.reshape(model_inputs["input_ids"].shape[0], -1, *rows.shape[1:])

        settings = {key: value for key in PARAPHRASING if (value := generate_kwargs.pop(key, None)) is not None}
        config = generate_kwargs.get("generation_config") or self.model.generation_config
        if not settings and not paraphrasing_defaults(config):  # the model's own decoding
            wanted = generate_kwargs.get("num_return_sequences", config.num_return_sequences)
            generate_kwargs = enough_beams(config, generate_kwargs, wanted or 1, "num_return_sequences")
            return {"output_ids": per_input(self.model.generate(**model_inputs, **generate_kwargs))}
        outputs = paraphrase(self.model, self.tokenizer, model_inputs, **settings, **generate_kwargs)
        parts = {key: per_input(part) for key, name in PARTS.items() if (part := getattr(outputs, name)) is not None}
        return {"output_ids": per_input(outputs.sequences), "input_ids": model_inputs["input_ids"], **parts}

    def postprocess(self, model_outputs: dict[str, torch.Tensor], clean_up_tokenization_spaces: bool = True):
        parts = {key: model_outputs[key][0].tolist() for key in PARTS if key in model_outputs}
        results, spaces = [], clean_up_tokenization_spaces
        for rank, ids in enumerate(model_outputs["output_ids"][0]):
            if parts and parts["score"][rank] == float("-inf"):  # no candidate for this slot
                continue
            text = self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=spaces)
            results.append({"generated_text": text, **{key: values[rank] for key, values in parts.items()}})
        wanted = model_outputs["output_ids"].shape[1]
        if len(results) < wanted:
            source = self.tokenizer.decode(model_outputs["input_ids"][0], skip_special_tokens=True)
            shown = source if len(source) <= SHOWN_CHARACTERS else source[: SHOWN_CHARACTERS - 1] + "…"
            said = f"{shown!r}: {len(results)} of {wanted} candidates: no more distinct (more num_beams may find more)"
            warnings.warn(said, FewerCandidatesWarning, stacklevel=2)
        return results


__all__ = ["CDNPGText2TextPipeline", "FewerCandidatesWarning", "input_limit", "truncated", "unread_text", "unreadable"]
