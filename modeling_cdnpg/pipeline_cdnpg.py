"""`pipeline("text2text-generation", model=..., trust_remote_code=True)` for C-DNPG checkpoints.

transformers 5.x removed the built-in text2text-generation pipeline; a checkpoint that declares this class under
`custom_pipelines` in its config keeps the task name working on 5.x and 4.57.x alike. The `cdnpg paraphrase` command
runs through it too, so that both decode and detokenise alike. Copied into every saved checkpoint (remote code), so
it imports only torch, transformers and its sibling generation_cdnpg.py (`paraphrase`).
"""

import math
import warnings

import torch
from transformers import Pipeline, PreTrainedTokenizerBase
from transformers.utils import logging

from .generation_cdnpg import paraphrase

logger = logging.get_logger(__name__)

NO_LIMIT = 10**6  # transformers' "no limit" model_max_length is 1e30; anything this large is no real limit
SCORE_KEYS = ("score", "log_likelihood", "source_overlap", "details_kept")
REVERSE_KEY = "reverse_log_likelihood"  # with a rank_by that weighs "reverse_likelihood"
SIMILARITY_KEY = "similarity"  # with a rank_by that weighs "similarity"
PARAPHRASE_KEYS = ("novelty", "keep_details", "allow_copy", "rank_by", "num_candidates", "similarity",
                   "num_beam_groups", "novelty_z_layer", "novelty_z_inverted")  # fmt: skip
# a generation config that sets one of these paraphrases through paraphrase()
CONFIGURED_KEYS = ("novelty", "keep_details", "rank_by", "num_candidates")
SHOWN_CHARACTERS = 40  # of an input named in a warning


class FewerCandidatesWarning(UserWarning):
    """An input got fewer candidates than `num_return_sequences`: paraphrase() keeps only distinct ones that are not
    the input, and the beam searches found no more."""


def unreadable(tokenizer: PreTrainedTokenizerBase, text: str) -> str | None:
    """Why `text` has nothing to paraphrase (empty, blank, or every token unknown to the tokenizer), or None.

    Such an input gets no paraphrase, never an invented one: from an empty input the model would write a sentence of
    its own, and from unknown tokens (Chinese with an English vocabulary) a confident paraphrase of [UNK]s.
    """
    if not text.strip():
        return "is empty"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        return "has no tokens the tokenizer keeps"
    if tokenizer.unk_token_id is not None and all(token == tokenizer.unk_token_id for token in ids):
        return f"has only tokens unknown to the tokenizer (all {tokenizer.unk_token}): its vocabulary cannot read it"
    return None


class CDNPGText2TextPipeline(Pipeline):
    """Paraphrases a string or a list of strings: per input, a list of candidates `{"generated_text": ...}`.

    Generation keyword arguments (num_beams, num_return_sequences, max_new_tokens, do_sample, ...) are passed through
    to `model.generate()`; unset ones come from the checkpoint's generation_config (beam 8, 20 new tokens). With
    `novelty` or `keep_details` (0 to 1; or when the generation_config sets one) decoding goes through
    `generation_cdnpg.paraphrase()`: the candidates are granularity-aware, diverse, best first, and each also has its
    `score` and the score's parts `log_likelihood`, `source_overlap` and `details_kept`. `rank_by`,
    `num_candidates` and `similarity` are `paraphrase`'s (also taken when the generation_config sets `rank_by` or
    `num_candidates`): `score` is then what ranks them, and a ranking that weighs them adds `reverse_log_likelihood`
    and `similarity`. There may be fewer than `num_return_sequences` when the model finds fewer distinct ones; a
    `FewerCandidatesWarning` says so.

    An input with nothing to paraphrase (empty, blank, or only tokens the tokenizer does not know) gets an empty list
    and a warning. Inputs longer than the model takes are truncated to what it takes.
    """

    _pipeline_calls_generate = True  # 5.x: lets the pipeline own a generation config; ignored by 4.57

    def __call__(self, inputs, **kwargs):
        """`Pipeline.__call__`, with inputs that have nothing to paraphrase answered by an empty list (`unreadable`)."""
        texts = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
            return super().__call__(inputs, **kwargs)  # a generator or a dataset: streamed as is
        problems = [unreadable(self.tokenizer, text) for text in texts]
        for number, problem in enumerate(problems, start=1):
            if problem:
                logger.warning("input %d %s: no paraphrase", number, problem)
        readable = [text for text, problem in zip(texts, problems) if not problem]
        paraphrases = iter(super().__call__(readable, **kwargs) if readable else [])
        results = [[] if problem else next(paraphrases) for problem in problems]
        return results[0] if isinstance(inputs, str) else results

    def _sanitize_parameters(
        self, truncation: bool | None = None, clean_up_tokenization_spaces=None, **generate_kwargs
    ):
        preprocess_params = {} if truncation is None else {"truncation": truncation}
        postprocess_params = {}
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess_params, generate_kwargs, postprocess_params

    def input_limit(self) -> int:
        """The most input tokens the model takes: its position table, or the tokenizer's smaller limit."""
        limits = [getattr(self.model.config, "max_position_embeddings", None) or NO_LIMIT]
        limits.append(getattr(self.tokenizer, "model_max_length", None) or NO_LIMIT)
        return min(limits)

    def preprocess(self, text: str, truncation: bool = True) -> dict[str, torch.Tensor]:
        if not isinstance(text, str):
            raise TypeError(f"text2text-generation takes a string or a list of strings, got {type(text).__name__}")
        inputs = self.tokenizer(text, return_tensors="pt", truncation=truncation, max_length=self.input_limit())
        return {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}

    def _forward(self, model_inputs: dict[str, torch.Tensor], **generate_kwargs) -> dict[str, torch.Tensor]:
        batch_size = model_inputs["input_ids"].shape[0]
        settings = {key: generate_kwargs.pop(key) for key in PARAPHRASE_KEYS if key in generate_kwargs}
        settings = {key: value for key, value in settings.items() if value is not None}  # None: not given
        config = generate_kwargs.get("generation_config") or self.model.generation_config
        by_default = any(getattr(config, key, None) is not None for key in CONFIGURED_KEYS)
        if not by_default and not settings:
            output_ids = self.model.generate(**model_inputs, **generate_kwargs)
            return {"output_ids": output_ids.reshape(batch_size, output_ids.shape[0] // batch_size, -1)}
        outputs = paraphrase(self.model, self.tokenizer, model_inputs, **settings, **generate_kwargs)
        parts = [outputs.sequences_scores, outputs.log_likelihoods, outputs.source_overlaps, outputs.details_kept]
        optional = [outputs.reverse_log_likelihoods, outputs.similarities]  # REVERSE_KEY, SIMILARITY_KEY
        present = torch.tensor([part is not None for part in optional]).expand(batch_size, -1)
        parts += [torch.full_like(parts[0], math.nan) if part is None else part for part in optional]
        return {
            "output_ids": outputs.sequences.reshape(batch_size, -1, outputs.sequences.shape[-1]),
            "scores": torch.stack(parts, -1).reshape(batch_size, -1, len(parts)),
            "present": present,  # which of the optional parts the ranking computed (a tensor: batched as the rest)
            "input_ids": model_inputs["input_ids"],  # named in the warning of fewer candidates than asked
        }

    def postprocess(self, model_outputs: dict[str, torch.Tensor], clean_up_tokenization_spaces: bool = True):
        scores = model_outputs["scores"][0].tolist() if "scores" in model_outputs else None
        keys = list(SCORE_KEYS)
        if scores is not None:
            present = model_outputs["present"][0].tolist()
            keys += [key if here else None for key, here in zip((REVERSE_KEY, SIMILARITY_KEY), present)]
        results = []
        for rank, ids in enumerate(model_outputs["output_ids"][0]):
            if scores is not None and scores[rank][0] == -math.inf:  # no candidate for this slot
                continue
            text = self.tokenizer.decode(
                ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
            )
            parts = {key: value for key, value in zip(keys, scores[rank]) if key} if scores else {}
            results.append({"generated_text": text, **parts})
        wanted = model_outputs["output_ids"].shape[1]
        if len(results) < wanted:
            source = self.tokenizer.decode(model_outputs["input_ids"][0], skip_special_tokens=True)
            shown = source if len(source) <= SHOWN_CHARACTERS else source[: SHOWN_CHARACTERS - 1] + "…"
            warnings.warn(
                f"{shown!r}: {len(results)} of {wanted} candidates: the beam searches found no more that differ "
                "from each other and from the input (more num_beams may find more)",
                FewerCandidatesWarning,
                stacklevel=2,
            )
        return results


__all__ = ["CDNPGText2TextPipeline", "FewerCandidatesWarning", "unreadable"]
