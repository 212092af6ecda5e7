#!/usr/bin/env python
"""Speed of the demo page (`cdnpg demo`): a click through the app against the pipeline called directly, and the time
to the first page.

    python benchmarks/demo.py runs/template --out demo.json   # docs/demo.md's figures
    python benchmarks/demo.py runs/template --quick            # a few requests: the smoke run

Click to paraphrases: 12-word Quora-like questions, each paraphrased in interleaved rounds by (a) the checkpoint's
`pipeline("text2text-generation", ...)` in this process, (b) the running app through `gradio_client` (what the
"Use via API" page shows), (c) the app through its HTTP API (POST /gradio_api/call/paraphrase, then its event
stream: what curl or a browser's fetch does), the order rotated each round. Every way gets the same settings; a
ratio is the median over rounds of (app time / pipeline time) for the round's questions. The app decodes in its own
process (`cdnpg demo`, queue of one), which gets the same number of torch threads as this one (`--threads`).

Time to the first page: from starting `cdnpg demo --model CHECKPOINT` to the first HTTP 200 of its page (the model is
loaded before the page serves), the median of `--starts` starts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

QUESTIONS = [  # Quora-like, 12 words each (the "?" is a word)
    "how can i improve my english speaking skills in a short time ?",
    "what is the best way to learn machine learning from scratch ?",
    "why do people prefer to live in small towns than cities ?",
    "how long does it take to get from london to paris ?",
    "what are the best places to visit in new zealand in winter ?",
    "how do i prepare for a job interview at a big company ?",
    "which programming language should i learn first as a complete beginner ?",
    "what is the difference between a virus and a bacterial infection ?",
]


def cpu_name() -> str | None:
    """/proc/cpuinfo's model name (Linux), else None."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


@contextmanager
def demo_server(checkpoint: str, threads: int):
    """`cdnpg demo` in its own process (`cdnpg.demo.served`): yields (address, seconds from the start to the first
    HTTP 200 of the page)."""
    from cdnpg.demo import demo_command, free_port, served

    port = free_port()
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "GRADIO_ANALYTICS_ENABLED": "False"}
    with served(demo_command(checkpoint, port), port, timeout=300, env=environment) as (url, seconds):
        yield url, seconds


def http_call(url: str, data: list) -> list:
    """The app's paraphrase event through its HTTP API: POST the inputs, read the event stream to `complete`."""
    request = urllib.request.Request(f"{url}gradio_api/call/paraphrase", json.dumps({"data": data}).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as answer:
        event = json.loads(answer.read())["event_id"]
    with urllib.request.urlopen(f"{url}gradio_api/call/paraphrase/{event}", timeout=120) as stream:
        kind = None
        for raw in stream:
            line = raw.decode().strip()
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and kind in ("complete", "error"):
                if kind == "error":
                    raise RuntimeError(f"the app answered an error: {line}")
                return json.loads(line.split(":", 1)[1])
    raise RuntimeError("the event stream ended without an answer")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a C-DNPG checkpoint folder (e.g. runs/template)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    parser.add_argument("--starts", type=int, default=3, help="starts of cdnpg demo timed (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads here and in the app (default 1)")
    parser.add_argument("--novelty", type=float, default=0.5)
    parser.add_argument("--keep-details", type=float, default=0.5)
    parser.add_argument("--paraphrases", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 questions, 2 rounds, 1 start: the smoke run")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    questions = QUESTIONS[:2] if args.quick else QUESTIONS
    rounds, starts = (2, 1) if args.quick else (args.rounds, args.starts)

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch
    from gradio_client import Client
    from transformers import pipeline

    torch.set_num_threads(args.threads)
    settings = {"novelty": args.novelty, "keep_details": args.keep_details, "num_return_sequences": args.paraphrases,
                "rank_by": "score"}  # fmt: skip
    inputs = [args.novelty, args.keep_details, args.paraphrases, "score"]
    paraphraser = pipeline("text2text-generation", model=args.checkpoint, trust_remote_code=True)

    first_pages = []
    for _ in range(starts - 1):
        with demo_server(args.checkpoint, args.threads) as (_, seconds):
            first_pages.append(seconds)
    with demo_server(args.checkpoint, args.threads) as (url, seconds):
        first_pages.append(seconds)
        client = Client(url, verbose=False)
        ways = {
            "pipeline": lambda text: paraphraser(text, **settings),
            "app (gradio_client)": lambda text: client.predict(text, *inputs, api_name="/paraphrase")[2],
            "app (HTTP API)": lambda text: http_call(url, [text, *inputs])[2],
        }
        expected = [paraphraser(text, **settings) for text in questions]
        for name, way in ways.items():  # warm-up: first calls, and the same answer every way
            if [way(text) for text in questions] != expected:
                raise RuntimeError(f"{name} answers other paraphrases than the pipeline")
        times: dict[str, list[float]] = {name: [] for name in ways}
        for number in range(rounds):
            order = list(ways)[number % len(ways) :] + list(ways)[: number % len(ways)]
            for name in order:
                began = time.perf_counter()
                for text in questions:
                    ways[name](text)
                times[name].append((time.perf_counter() - began) / len(questions))

    def ratio(name: str) -> float:
        return statistics.median(app / direct for app, direct in zip(times[name], times["pipeline"]))

    results = {
        "checkpoint": args.checkpoint,
        "questions": len(questions),
        "rounds": rounds,
        "settings": settings,
        "threads": args.threads,
        "seconds_per_request": {name: statistics.median(values) for name, values in times.items()},
        "ratio_to_pipeline": {name: ratio(name) for name in ways if name != "pipeline"},
        "first_page_seconds": statistics.median(first_pages),
        "first_page_runs": first_pages,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "cpu": cpu_name(),
    }
    print("| way | ms per request (median) | / pipeline |\n|---|---:|---:|")
    for name, seconds in results["seconds_per_request"].items():
        shown = f"{results['ratio_to_pipeline'][name]:.2f}×" if name != "pipeline" else "1"
        print(f"| {name} | {seconds * 1000:.0f} | {shown} |")
    print(f"time to the first page: {results['first_page_seconds']:.1f} s (median of {len(first_pages)})")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
