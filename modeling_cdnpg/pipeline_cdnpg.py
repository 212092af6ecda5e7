"""`pipeline("text2text-generation", model=..., trust_remote_code=True)` for C-DNPG checkpoints.

transformers 5.x removed the built-in text2text-generation pipeline; a checkpoint that declares this class under
`custom_pipelines` in its config keeps the task name working on 5.x and 4.57.x alike. The `cdnpg paraphrase` command
runs through it too, so that both decode and detokenise alike. Copied into every saved checkpoint (remote code), so
it imports only torch and transformers.
"""

import math

import torch
from transformers import Pipeline, PreTrainedTokenizerBase
from transformers.utils import logging

logger = logging.get_logger(__name__)

NO_LIMIT = 10**6  # transformers' "no limit" model_max_length is 1e30; anything this large is no real limit
SCORE_KEYS = ("score", "log_likelihood", "source_overlap", "details_kept")


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
    `novelty` (0 to 1, see `generation_cdnpg.py`) the candidates are granularity-aware, diverse, best first, and each
    also has its `score` and the score's parts `log_likelihood`, `source_overlap` and `details_kept`; there may be
    fewer than `num_return_sequences` when the model finds fewer distinct ones. `keep_details` (0 to 1) pulls the
    source's details (high z) into the candidates, with or without `novelty`.

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
        if generate_kwargs.get("novelty") is None and generate_kwargs.get("keep_details") is None:
            output_ids = self.model.generate(**model_inputs, **generate_kwargs)
            return {"output_ids": output_ids.reshape(batch_size, output_ids.shape[0] // batch_size, -1)}
        # the tokenizer tells generate() where words start: a word is never split to avoid the source's wording
        generate_kwargs = {"tokenizer": self.tokenizer, **generate_kwargs, "return_dict_in_generate": True}
        outputs = self.model.generate(**model_inputs, **generate_kwargs)
        parts = (outputs.sequences_scores, outputs.log_likelihoods, outputs.source_overlaps, outputs.details_kept)
        scores = torch.stack(parts, -1)
        return {
            "output_ids": outputs.sequences.reshape(batch_size, -1, outputs.sequences.shape[-1]),
            "scores": scores.reshape(batch_size, -1, len(SCORE_KEYS)),
        }

    def postprocess(self, model_outputs: dict[str, torch.Tensor], clean_up_tokenization_spaces: bool = True):
        scores = model_outputs["scores"][0].tolist() if "scores" in model_outputs else None
        results = []
        for rank, ids in enumerate(model_outputs["output_ids"][0]):
            if scores is not None and scores[rank][0] == -math.inf:  # no candidate for this slot
                continue
            text = self.tokenizer.decode(
                ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
            )
            results.append({"generated_text": text, **(dict(zip(SCORE_KEYS, scores[rank])) if scores else {})})
        return results


__all__ = ["CDNPGText2TextPipeline", "unreadable"]
