#!/usr/bin/env python
"""Speed and memory of C-DNPG, measured as ratios side by side in one process.

    python benchmarks/speed.py --seq-lens 20 64 256 --out results.json --plot speed.png
    python benchmarks/speed.py --quick --out /tmp/quick.json          # tiny model, < 1 minute (smoke test)
    python benchmarks/speed.py --device cuda --dtype bf16 --out gpu.json

What is compared, at every sequence length L (source and target both L tokens, random ids), is listed once, by
`comparisons`; the bounds are in `TARGETS`:

- training step (forward + backward + AdamW step + zero_grad) of every granularity mask / the plain Transformer
  ("none"), with a target (the paper reports 1.5 h / 1.2 h = 1.25 for its implementation);
- "none" / transformers' `BartForConditionalGeneration` of the same size, with a target;
- beam search (num_beams 8, min_new_tokens = max_new_tokens, so every run decodes the same number of steps) with
  `use_cache=False` / with the cache, i.e. the cache's speed-up, with a target;
- the SDPA path / the eager path (an identical copy built with `attn_implementation="eager"`), training step;
- beam search with a static cache and the decoding step compiled (`cache_implementation="static"`, torch.compile
  with fullgraph=True) / the same with the dynamic cache, eager; and / BART doing the same (`--static-variants`);
- the inference forward pass with flex attention, which computes the granularity mask inside its kernel / the same
  with SDPA and a (b, 1, i, j) mask, time and peak memory (`--flex-variants`, the "forward" part);
- a training step of a warm-started model (all-MiniLM-L6-v2's dimensions: 6 + 6 layers, d 384, 12 heads, GELU,
  embedding LayerNorm) / BART of the same size, with a target (`--warm-variants`);
- peak memory of each (see `peak_memory`).

Every model a comparison names is built, also where `--variants` leaves it out (the SDPA / eager and cache
comparisons use "product" by default). If a measurement fails, `--out` keeps what was measured before it, with the
error.

Timing protocol: all models of a comparison live in the same process; each round runs one call of every model, in
an order rotated by one every round (A B C, B C A, C A B, ...), after `--warmup` untimed calls of each. A ratio is
the median over rounds of the per-round ratio (the two timings it divides are seconds apart, so slow phases of a
shared machine hit both); the quartiles of the per-round ratios, the ratio of the medians and the ratio of the
minima are stored to judge the noise. On CPU the clock is the process's CPU time with one torch thread (`--clock`,
`--threads`): on a shared machine it leaves out the time spent waiting for a core, which wall-clock ratios do not;
wall-clock timings are recorded as well, and throughputs (tokens/s) are wall-clock. On CUDA the clock is the wall
clock around synchronised calls.

Memory, `peak_memory`: the peak of the bytes of tensors allocated during one call above what was allocated before
it. On CUDA: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`. On CPU: the torch profiler with
`profile_memory=True` reports every allocation and free of the CPU allocator with the running total of the
allocations it has seen since profiling started; the peak of that running total over one call is the same quantity
(activations kept for backward, gradients, temporaries, logits; parameters and the AdamW state, which already exist
after the warm-up step, are not counted). It is measured on one extra untimed call, since the profiler slows the
call it watches.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from torch.profiler import ProfilerActivity, profile
from transformers import CompileConfig, GenerationConfig

from cdnpg.training import bart_like
from cdnpg.training.arguments import architecture_fields
from modeling_cdnpg import GRANULARITY_MASKS, CDNPGConfig, CDNPGForConditionalGeneration, GranularityHead
from modeling_cdnpg.modeling_cdnpg import CDNPGAttention

GA_VARIANTS = tuple(mask for mask in GRANULARITY_MASKS if mask != "none")
PARTS = ("train", "generate", "forward")  # what is timed, in this order at each length
BART = "bart"
# The paper's model is CDNPGConfig's defaults (with bert-base-uncased's vocabulary and special ids); --quick shrinks it.
PAPER_MODEL: dict[str, int] = {}
QUICK_MODEL = {
    "vocab_size": 512,
    **architecture_fields(d_model=32, layers=2, attention_heads=4, ffn_dim=64),
    "max_position_embeddings": 64,
}

TARGETS = {  # target name -> (comparison, bound, what is bounded)
    "train_ga_vs_none": ("<=", 1.10, "GA / none"),
    "train_none_vs_bart": ("<=", 1.05, "none / BART"),
    "gen_cache_speedup": (">=", 3.0, "no cache / cache"),
    "train_warm_vs_bart": ("<=", 1.15, "warm start / BART"),
}
# A warm-started model (cdnpg convert of all-MiniLM-L6-v2): its dimensions, for the "minilm:" runners
MINILM_MODEL = {
    **architecture_fields(d_model=384, layers=6, attention_heads=12, ffn_dim=1536),
    "activation_function": "gelu",
    "layernorm_embedding": True,
    "layer_norm_eps": 1e-12,
}
WARM = "minilm:"  # runner prefix: the model with MINILM_MODEL's dimensions


@dataclass(frozen=True)
class Comparison:
    """One measured ratio: runner `numerator` / runner `denominator`, both timed in the same `part` rounds.

    Runner names say which model runs how: "product" (SDPA) or "product@eager" in training and the forward pass,
    "product+cache", "product-cache" (use_cache=False) or "product+static" (static cache, compiled decoding step) in
    beam search; "bart" is transformers' BART of the same size, and "minilm:..." a model of MINILM_MODEL's size.
    """

    key: str
    part: str
    numerator: str
    denominator: str
    target: str | None = None


def comparisons(args) -> list[Comparison]:
    """Every ratio a run with these options measures at each length: the one list of measured keys. The models
    timed are exactly those these comparisons name, so none can be missing."""
    plan = []
    if "train" in args.parts:
        plan += [Comparison(f"train/{v}_vs_none", "train", v, "none", "train_ga_vs_none") for v in args.variants]
        plan.append(Comparison("train/none_vs_bart", "train", "none", BART, "train_none_vs_bart"))
        plan += [Comparison(f"train/{v}_sdpa_vs_eager", "train", v, f"{v}@eager") for v in args.eager_variants]
    if "generate" in args.parts:
        for v in args.gen_variants:
            plan.append(
                Comparison(f"gen/{v}_nocache_vs_cache", "generate", f"{v}-cache", f"{v}+cache", "gen_cache_speedup")
            )
            if v != "none":
                plan.append(Comparison(f"gen/{v}_vs_none_cached", "generate", f"{v}+cache", "none+cache"))
        plan.append(Comparison("gen/none_vs_bart_cached", "generate", "none+cache", f"{BART}+cache"))
        for v in args.static_variants:
            plan.append(Comparison(f"gen/{v}_static_compiled_vs_dynamic", "generate", f"{v}+static", f"{v}+cache"))
            plan.append(Comparison(f"gen/{v}_static_compiled_vs_bart", "generate", f"{v}+static", f"{BART}+static"))
    if "forward" in args.parts:
        plan += [
            Comparison(f"forward/{v}_flex_vs_sdpa", "forward", f"{v}@flex_attention", v) for v in args.flex_variants
        ]
    if "train" in args.parts:
        plan += [
            Comparison(f"train/warm_{v}_vs_bart", "train", f"{WARM}{v}", f"{WARM}{BART}", "train_warm_vs_bart")
            for v in args.warm_variants
        ]
    return plan


def runner_model(runner: str) -> tuple[str, str]:
    """The (model, attention implementation) a runner times: "product@eager" -> ("product", "eager")."""
    model, _, attn = runner.removesuffix("+cache").removesuffix("-cache").removesuffix("+static").partition("@")
    return model, attn or "sdpa"


def runner_cache(runner: str) -> str:
    """How a beam-search runner caches: "dynamic" (+cache), "none" (-cache) or "static" (+static, compiled)."""
    for suffix, cache in (("+cache", "dynamic"), ("-cache", "none"), ("+static", "static")):
        if runner.endswith(suffix):
            return cache
    raise ValueError(f"beam-search runner {runner!r} names no cache")


# ------------------------------------------------------------------------------------------------------------------
# Models and workloads
# ------------------------------------------------------------------------------------------------------------------


def build_model(model_kw: dict, name: str, attn: str, seed: int) -> torch.nn.Module:
    """C-DNPG with granularity mask `name` and attention implementation `attn`, or, for "bart", transformers' BART of
    the same size (`cdnpg.training.bart_like`: the same dimensions, dropouts, positions and tied embeddings); a
    "minilm:" name has MINILM_MODEL's dimensions instead of `model_kw`'s. Flex attention has no attention dropout:
    its models (and those they are compared with, in the eval-mode forward part) are built without."""
    torch.manual_seed(seed)
    if name.startswith(WARM):
        name, model_kw = name.removeprefix(WARM), {**model_kw, **MINILM_MODEL}
    if attn == "flex_attention":
        model_kw = {**model_kw, "attention_dropout": 0.0}
    if name == BART:
        return bart_like(CDNPGConfig(**model_kw))
    return CDNPGForConditionalGeneration(CDNPGConfig(granularity_mask=name, attn_implementation=attn, **model_kw))


class Bench:
    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int):
        self.device = device
        self.dtype = dtype
        self.seed = seed

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def tokens(self, config, batch: int, length: int, offset: int) -> torch.Tensor:
        """Random ids above the special ones ([PAD], [CLS], [SEP] of bert-base-uncased by default)."""
        first = max(config.pad_token_id, config.bos_token_id, config.eos_token_id) + 1
        generator = torch.Generator().manual_seed(self.seed + offset)
        return torch.randint(first, config.vocab_size, (batch, length), generator=generator).to(self.device)

    def train_step(self, model, batch: int, length: int) -> Callable[[], None]:
        """Forward + backward + AdamW step + zero_grad on a fixed random batch (labels as long as the source)."""
        model.to(self.device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        input_ids = self.tokens(model.config, batch, length, 0)
        labels = self.tokens(model.config, batch, length, 1)
        attention_mask = torch.ones_like(input_ids)

        def step() -> None:
            with self.autocast():
                loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step

    def generate(self, model, batch: int, length: int, new_tokens: int, beams: int, cache: str):
        """Beam search over a fixed random batch; min_new_tokens = max_new_tokens fixes the number of steps. `cache`:
        "dynamic", "none" (use_cache=False) or "static" (a static cache, the decoding step compiled, fullgraph)."""
        model.to(self.device).eval()
        input_ids = self.tokens(model.config, batch, length, 2)
        attention_mask = torch.ones_like(input_ids)
        static = {}
        if cache == "static":
            compile_config = CompileConfig(fullgraph=True)
            compile_config._compile_all_devices = True  # transformers compiles by itself only on accelerators
            static = dict(cache_implementation="static", compile_config=compile_config)
        config = GenerationConfig(
            num_beams=beams,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            early_stopping=False,
            use_cache=cache != "none",
            pad_token_id=model.config.pad_token_id,
            bos_token_id=model.config.bos_token_id,
            eos_token_id=model.config.eos_token_id,
            decoder_start_token_id=model.config.decoder_start_token_id,
            **static,
        )

        def run() -> None:
            with torch.inference_mode(), self.autocast():
                out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
            if out.shape != (batch, new_tokens + 1):
                raise RuntimeError(f"generation returned {tuple(out.shape)}, expected {(batch, new_tokens + 1)}")

        return run

    def forward(self, model, batch: int, length: int) -> Callable[[], None]:
        """The inference forward pass (eval mode, no gradients) of the encoder-decoder without its LM head over a
        fixed random batch, teacher-forced: source and target both `length` tokens. Without the head, whose
        (b, t, vocabulary) logits would dominate the peak, the memory measured is the attention's."""
        model.to(self.device).eval()
        input_ids = self.tokens(model.config, batch, length, 3)
        decoder_input_ids = self.tokens(model.config, batch, length, 4)
        attention_mask = torch.ones_like(input_ids)

        def run() -> None:
            with torch.inference_mode(), self.autocast():
                model.model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)

        return run

    def peak_memory(self, fn: Callable[[], None]) -> int:
        """Peak bytes of tensors allocated during fn() above those allocated before it (see the module docstring)."""
        gc.collect()
        if self.device.type == "cuda":
            self.sync()
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
            fn()
            self.sync()
            return torch.cuda.max_memory_allocated(self.device) - before
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        return cpu_peak_from_profile(prof)

    def interleaved(self, runners: dict[str, Callable[[], None]], repeats: int, warmup: int, memory: bool):
        """Warm-up, one memory pass each, then `repeats` rounds of one timed call of every runner, rotated.

        Returns ({"wall": {name: [s, ...]}, "cpu": {name: [s, ...]}}, {name: peak bytes}). "cpu" is the process's
        CPU time (user + system, all threads): on a shared machine it leaves out the time spent waiting for a core.
        """
        for fn in runners.values():
            for _ in range(warmup):
                fn()
        peaks = {name: self.peak_memory(fn) for name, fn in runners.items()} if memory else {}
        names = list(runners)
        clocks: dict[str, dict[str, list[float]]] = {"wall": {n: [] for n in names}, "cpu": {n: [] for n in names}}
        for round_ in range(repeats):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                torch.manual_seed(self.seed + round_)
                self.sync()
                wall, cpu = time.perf_counter(), time.process_time()
                runners[name]()
                self.sync()
                clocks["cpu"][name].append(time.process_time() - cpu)
                clocks["wall"][name].append(time.perf_counter() - wall)
        return clocks, peaks


def cpu_peak_from_profile(prof) -> int:
    """Peak of the running total of CPU allocations the profiler saw, minus the total at its start."""
    try:
        events = []
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            fields = node.extra_fields
            if type(fields).__name__ == "_ExtraFields_Allocation" and fields.device.type == "cpu":
                events.append((node.start_time_ns, fields.alloc_size, fields.total_allocated))
        if not events:
            return 0
        events.sort()
        start = events[0][2] - events[0][1]
        return max(total for _, _, total in events) - start
    except AttributeError:  # private API moved: cumulate the per-event sizes instead
        sizes = [(e.time_range.start, e.cpu_memory_usage) for e in prof.events() if e.name == "[memory]"]
        running = peak = 0
        for _, size in sorted(sizes):
            running += size
            peak = max(peak, running)
        return peak


# ------------------------------------------------------------------------------------------------------------------
# The comparisons
# ------------------------------------------------------------------------------------------------------------------


def paired_ratio(clocks: dict, clock: str, a: str, b: str) -> dict:
    """Median over rounds of time(a) / time(b) on `clock` ("value"), with, for judging the noise, the quartiles of
    the per-round ratios, the ratio of the medians and the ratio of the minima (load only ever adds time, so the
    minima are the least disturbed calls), and the same on the other clock."""
    ratio = {"numerator": a, "denominator": b, "clock": clock}
    for name, times in sorted(clocks.items(), key=lambda item: item[0] != clock):
        per_round = [x / y for x, y in zip(times[a], times[b])]
        suffix = "" if name == clock else f"_{name}"
        ratio[f"value{suffix}"] = statistics.median(per_round)
        quartiles = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else per_round * 3
        ratio[f"quartiles{suffix}"] = [quartiles[0], quartiles[2]]
        ratio[f"ratio_of_medians{suffix}"] = statistics.median(times[a]) / statistics.median(times[b])
        ratio[f"ratio_of_minima{suffix}"] = min(times[a]) / min(times[b])
        ratio[f"per_round{suffix}"] = per_round
    return ratio


def summarize(clocks: dict, clock: str, peaks: dict, work: float) -> dict:
    """Raw timings of both clocks, medians, throughput (`work` units per median second) and peaks."""
    return {
        "clock": clock,
        "times_s": clocks,
        "median_s": {n: statistics.median(t) for n, t in clocks[clock].items()},
        "median_wall_s": {n: statistics.median(t) for n, t in clocks["wall"].items()},
        "tokens_per_s": {n: work / statistics.median(t) for n, t in clocks["wall"].items()},
        "peak_memory_bytes": peaks,
    }


def train_batch(args, length: int) -> int:
    if not args.max_batch_tokens:
        return args.batch_size
    return max(1, min(args.batch_size, args.max_batch_tokens // length))


def generation_shape(args, length: int) -> tuple[int, int]:
    """(sources per generate call, new tokens) at this length."""
    new_tokens = min(length, args.gen_max_new_tokens) if args.gen_max_new_tokens else length
    if not args.gen_max_batch_tokens:
        return args.gen_batch_size, new_tokens
    return max(1, min(args.gen_batch_size, args.gen_max_batch_tokens // max(length, new_tokens))), new_tokens


def measure(args, bench: Bench, model_kw: dict, length: int, part: str, plan: list[Comparison], results: dict) -> None:
    """Time (and measure the memory of) every runner the `part` comparisons name at this length, interleaved, and
    store the ratios."""
    plan = [c for c in plan if c.part == part]
    if not plan:
        return
    tag = f"L{length}"
    repeats = args.repeats_long if length >= args.long_from else args.repeats
    memory = not args.no_memory
    names = list(dict.fromkeys(name for c in plan for name in (c.numerator, c.denominator)))
    models = {}  # one model per (mask, attention): cached and uncached beam search share it
    for name in names:
        if runner_model(name) not in models:
            models[runner_model(name)] = build_model(model_kw, *runner_model(name), args.seed)
    if part in ("forward", "train"):
        batch = train_batch(args, length)
        step, label = (bench.forward, "forward") if part == "forward" else (bench.train_step, "training")
        runners = {name: step(models[runner_model(name)], batch, length) for name in names}
        log(f"[{tag}] {label}: batch {batch}, {len(runners)} models, {args.warmup} warm-up, {repeats} rounds")
        clocks, peaks = bench.interleaved(runners, repeats, args.warmup, memory)
        entry = {
            "batch_size": batch,
            "repeats": repeats,
            "throughput_unit": "target tokens (batch * seq_len) per wall-clock second",
            **summarize(clocks, args.clock, peaks, batch * length),
        }
        if part == "train":
            entry["parameters"] = {n: sum(p.numel() for p in models[runner_model(n)].parameters()) for n in names}
    else:
        batch, new_tokens = generation_shape(args, length)
        runners = {
            name: bench.generate(
                models[runner_model(name)], batch, length, new_tokens, args.num_beams, runner_cache(name)
            )
            for name in names
        }
        log(
            f"[{tag}] beam search: batch {batch} x {args.num_beams} beams, {new_tokens} new tokens, "
            f"{len(runners)} runs, {repeats} rounds"
        )
        # the memory pass doubles as the first warm-up of generation (nothing persists between generate calls)
        clocks, peaks = bench.interleaved(runners, repeats, args.warmup - 1 if memory else args.warmup, memory)
        entry = {
            "batch_size": batch,
            "num_beams": args.num_beams,
            "new_tokens": new_tokens,
            "repeats": repeats,
            "throughput_unit": "beam tokens (batch * num_beams * new_tokens) per wall-clock second",
            **summarize(clocks, args.clock, peaks, batch * args.num_beams * new_tokens),
        }
    results["settings"].setdefault(tag, {})[part] = entry
    for c in plan:
        ratio = paired_ratio(clocks, args.clock, c.numerator, c.denominator)
        if c.target is not None:
            op, bound, _ = TARGETS[c.target]
            ratio.update(target=f"{op} {bound}", target_name=c.target)
            ratio["pass"] = bool(ratio["value"] <= bound if op == "<=" else ratio["value"] >= bound)
        results["ratios"][f"{tag}/{c.key}"] = ratio
        if peaks:
            results["memory_ratios"][f"{tag}/{c.key}"] = {
                "value": peaks[c.numerator] / max(peaks[c.denominator], 1),
                "numerator": c.numerator,
                "denominator": c.denominator,
            }
    del models, runners
    gc.collect()


# ------------------------------------------------------------------------------------------------------------------
# Reporting
# ------------------------------------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_results(results: dict, path: Path | None) -> None:
    """The JSON of `--out`, replaced atomically: a reader never sees half a file."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".tmp").write_text(json.dumps(results, indent=1, default=str))
        path.with_suffix(".tmp").replace(path)


def machine_info(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu,
    }
    with contextlib.suppress(OSError):
        info["load_average_at_start"] = os.getloadavg()
    return info


def format_table(results: dict) -> str:
    clock = results["options"]["clock"]
    other = "wall" if clock == "cpu" else "cpu"
    lines = [
        f"time ratios: median over rounds of the per-round ratio on the {clock} clock; for judging the noise, the "
        "quartiles of the per-round ratios,\nthe ratio of the minima, and the median on the "
        f"{other} clock",
        f"{'setting':<8} {'ratio':<32} {'value':>7} {'target':>8}  {'status':<6} {'quartiles':>13} "
        f"{'of minima':>9} {other:>6}",
    ]
    for key, r in results["ratios"].items():
        tag, _, name = key.partition("/")
        status = ("PASS" if r["pass"] else "MISS") if "pass" in r else "info"
        low, high = r["quartiles"]
        lines.append(
            f"{tag:<8} {name:<32} {r['value']:>7.3f} {r.get('target', '-'):>8}  {status:<6} {low:>6.3f}-{high:<6.3f} "
            f"{r['ratio_of_minima']:>9.3f} {r[f'value_{other}']:>6.3f}"
        )
    if results["memory_ratios"]:
        lines += ["", f"{'setting':<8} {'peak-memory ratio':<32} {'value':>7}"]
        for key, r in results["memory_ratios"].items():
            tag, _, name = key.partition("/")
            lines.append(f"{tag:<8} {name:<32} {r['value']:>7.3f}")
    lines += [
        "",
        f"{'setting':<8} {'run':<24} {'batch':>5} {clock + ' s':>8} {'wall s':>8} {'tokens/s':>9} {'peak MiB':>9}",
    ]
    for tag, entry in results["settings"].items():
        for part in PARTS:
            block = entry.get(part, {"median_s": {}})
            for name, median in block["median_s"].items():
                peak = block["peak_memory_bytes"].get(name)
                peak_text = f"{peak / 2**20:>9.1f}" if peak is not None else f"{'-':>9}"
                lines.append(
                    f"{tag:<8} {part + ' ' + name:<24} {block['batch_size']:>5} {median:>8.3f} "
                    f"{block['median_wall_s'][name]:>8.3f} {block['tokens_per_s'][name]:>9.0f} {peak_text}"
                )
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tags = list(results["settings"])

    def names(ratios: dict, keep) -> list[str]:
        return list(dict.fromkeys(k.split("/", 1)[1] for k in ratios if keep(k)))

    cost = names(results["ratios"], lambda k: "nocache" not in k)
    speedup = names(results["ratios"], lambda k: "nocache" in k)
    memory = names(results["memory_ratios"], lambda k: True)
    panels = [("time", cost), ("speedup", speedup)] + ([("memory", memory)] if memory else [])
    fig = plt.figure(figsize=(14, 10 if memory else 5.5))
    grid = fig.add_gridspec(2 if memory else 1, 2, width_ratios=[len(cost) + 1, len(speedup) + 2])
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])]
    if memory:
        axes.append(fig.add_subplot(grid[1, :]))
    width = 0.8 / len(tags)
    for axis, (kind, panel_names) in zip(axes, panels):
        source = results["memory_ratios"] if kind == "memory" else results["ratios"]
        for i, tag in enumerate(tags):
            values = [source.get(f"{tag}/{n}", {}).get("value", float("nan")) for n in panel_names]
            positions = [j + (i - (len(tags) - 1) / 2) * width for j in range(len(panel_names))]
            train = results["settings"][tag].get("train")
            label = f"seq len {tag[1:]}" + (f" (train batch {train['batch_size']})" if train else "")
            bars = axis.bar(positions, values, width, label=label)
            axis.bar_label(bars, fmt="%.2f", fontsize=6, rotation=90, padding=2)
        axis.set_xticks(range(len(panel_names)))
        axis.set_xticklabels(panel_names, rotation=35, ha="right", fontsize=8)
        axis.axhline(1.0, color="black", lw=0.5)
        if kind != "memory":  # the targets of the ratios on this panel
            shown = {
                source[f"{tag}/{n}"].get("target_name") for tag in tags for n in panel_names if f"{tag}/{n}" in source
            }
            for j, name in enumerate(target for target in TARGETS if target in shown):
                op, bound, what = TARGETS[name]
                axis.axhline(bound, color=f"C{3 + j}", ls="--", lw=1, label=f"target {what} {op} {bound}")
        if kind == "time":
            axis.set_ylabel("time ratio (< 1: numerator faster)")
            axis.set_title("training step, cached beam search")
        elif kind == "speedup":
            axis.set_ylabel("use_cache=False time / cached time")
            axis.set_title("cache speed-up")
        else:
            axis.set_ylabel("peak-memory ratio")
            axis.set_title("peak memory (same pairs)")
        axis.set_ylim(0, axis.get_ylim()[1] * (1.7 if kind == "speedup" else 1.3))  # room for the legend
        axis.legend(fontsize=7, loc="upper center", ncol=1 if kind == "speedup" else 3)
    machine = results["machine"]
    fig.suptitle(
        f"C-DNPG speed ratios ({results['options']['clock']} clock), {machine['device_name']}, "
        f"{machine['torch_threads']} thread(s), torch {machine['torch']}, {results['dtype']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------------------
# --profile: where the time goes
# ------------------------------------------------------------------------------------------------------------------


# modules whose forward passes get a `record_function` range in the profiles ("cdnpg::...")
PROFILED_MODULES = {
    GranularityHead: "cdnpg::GranularityHead (eq. 4)",
    CDNPGAttention: "cdnpg::CDNPGAttention (mask, cache and attention)",
}


@contextlib.contextmanager
def labelled_modules(model: torch.nn.Module):
    """Label the forward pass of every granularity head and attention module with a profiler range, through forward
    hooks on the modules (the model is not edited). Backward ops keep their autograd names (MulBackward0, ...)."""
    handles = []
    for module in model.modules():
        label = PROFILED_MODULES.get(type(module))
        if label is None:
            continue
        open_ranges = []

        def enter(module, inputs, label=label, open_ranges=open_ranges):
            open_ranges.append(torch.profiler.record_function(label).__enter__())

        def leave(module, inputs, output, open_ranges=open_ranges):
            open_ranges.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave, always_call=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def profile_runs(args, bench: Bench, model_kw: dict, out_dir: Path) -> None:
    """Profile one training step and one cached beam search of each --profile-variants model at each length;
    write the op tables (sorted by self CPU time) and print a summary of the labelled ranges."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = []
    for length in args.seq_lens:
        batch = train_batch(args, length)
        gen_batch, new_tokens = generation_shape(args, length)
        for variant in args.profile_variants:
            for what in ("train", "generate"):
                model = build_model(model_kw, variant, "sdpa", args.seed)
                if what == "train":
                    fn = bench.train_step(model, batch, length)
                    shape = f"batch {batch}"
                else:
                    fn = bench.generate(model, gen_batch, length, new_tokens, args.num_beams, "dynamic")
                    shape = f"batch {gen_batch} x {args.num_beams} beams, {new_tokens} new tokens"
                for _ in range(max(1, args.warmup)):
                    fn()
                with (
                    labelled_modules(model),
                    profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof,
                ):
                    fn()
                averages = prof.key_averages()
                total = sum(e.self_cpu_time_total for e in averages) / 1e6
                name = f"L{length}_{what}_{variant}"
                header = f"{name}: {shape}, self CPU total {total:.3f} s\n"
                (out_dir / f"{name}.txt").write_text(
                    header
                    + averages.table(sort_by="self_cpu_time_total", row_limit=60, max_name_column_width=70)
                    + "\n\nby input shape:\n"
                    + prof.key_averages(group_by_input_shape=True).table(
                        sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=50
                    )
                )
                labels = {e.key: e.cpu_time_total / 1e6 for e in averages if e.key.startswith("cdnpg::")}
                backward = {
                    e.key: e.cpu_time_total / 1e6
                    for e in averages
                    if e.key.startswith("autograd::engine::evaluate_function:")
                    and any(op in e.key for op in MASK_BACKWARD_OPS)
                }
                summary.append({"name": name, "shape": shape, "self_cpu_total_s": total, "ranges_s": labels})
                lines = [header.rstrip()]
                lines += [f"    {t:8.3f} s {100 * t / total:5.1f}%  {k}" for k, t in sorted(labels.items())]
                if backward:
                    t = sum(backward.values())
                    lines.append(f"    {t:8.3f} s {100 * t / total:5.1f}%  backward of mask-type elementwise ops")
                    summary[-1]["mask_type_backward_s"] = backward
                print("\n".join(lines), flush=True)
                del model, fn, prof
                gc.collect()
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))


# autograd nodes of the elementwise ops the masks are made of (also used elsewhere, so an upper bound for "none")
MASK_BACKWARD_OPS = (
    "ClampBackward",
    "ClampMinBackward",
    "ClampMaxBackward",
    "LogBackward",
    "PowBackward",
    "WhereBackward",
    "RsubBackward",
    "SigmoidBackward",
    "ExpandBackward",
    "UnsqueezeBackward",
    "SqueezeBackward",
    "ToCopyBackward",
)


# ------------------------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--seq-lens", type=int, nargs="+", help="source = target lengths (default 20 64 256)")
    parser.add_argument("--batch-size", type=int, help="training batch (default 32, the paper's)")
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        help="cap batch * seq_len of a training step (default 1024 on CPU: batch 32 at 20, 16 at 64, 4 at 256;\n"
        "0 = no cap, the default on CUDA)",
    )
    parser.add_argument("--repeats", type=int, help="timed rounds (default 5)")
    parser.add_argument("--repeats-long", type=int, help="timed rounds at seq lens >= --long-from (default 3)")
    parser.add_argument("--long-from", type=int, default=128)
    parser.add_argument("--warmup", type=int, help="untimed calls of each model before timing (default 1)")
    parser.add_argument("--variants", nargs="+", choices=GA_VARIANTS, help="granularity masks compared with 'none'")
    parser.add_argument(
        "--eager-variants",
        nargs="*",
        choices=(*GA_VARIANTS, "none"),
        help="SDPA vs eager (default product on CPU, product none on CUDA; built even if --variants leaves them out)",
    )
    parser.add_argument(
        "--gen-variants",
        nargs="+",
        choices=(*GA_VARIANTS, "none"),
        help="cached vs use_cache=False beam search (default product on CPU, product none on CUDA; built even if\n"
        "--variants leaves them out); 'none' always runs cached, as the baseline of the others",
    )
    parser.add_argument("--num-beams", type=int, default=8)
    parser.add_argument("--gen-batch-size", type=int, help="sources per generate call (default 4)")
    parser.add_argument(
        "--gen-max-batch-tokens",
        type=int,
        help="cap gen batch * max(seq_len, new tokens) (default 80 on CPU: 4 sources at 20, 1 at 64; 0 = no cap)",
    )
    parser.add_argument(
        "--gen-max-new-tokens",
        type=int,
        help="cap max_new_tokens = seq_len (default 64 on CPU: use_cache=False at 256 steps is hours; 0 = no cap)",
    )
    parser.add_argument(
        "--static-variants",
        nargs="*",
        choices=GRANULARITY_MASKS,
        help="beam search with a static cache and a compiled decoding step, against the dynamic cache and against\n"
        "BART doing the same (default product)",
    )
    parser.add_argument(
        "--flex-variants",
        nargs="*",
        choices=GRANULARITY_MASKS,
        help="forward pass with flex attention (the mask computed in its kernel) against SDPA (default product)",
    )
    parser.add_argument(
        "--warm-variants",
        nargs="*",
        choices=GRANULARITY_MASKS,
        help="training step of a warm-started model (all-MiniLM-L6-v2's size) against BART of that size\n"
        "(default resonance)",
    )
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="what to time")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory passes")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:n]")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="bf16: autocast, fp32 weights")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch.set_num_threads (default 1 on CPU: on a shared machine, OpenMP threads that wait for a descheduled\n"
        "sibling inflate small ops many times over, which ruins ratios; 0 = torch's choice)",
    )
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        help="clock of the ratios (default cpu on CPU: process CPU time, which leaves out the time spent waiting\n"
        "for a core on a shared machine; wall on CUDA); both are recorded",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny model and lengths: a < 1 minute smoke run")
    parser.add_argument("--out", type=Path, help="JSON with every raw timing, the ratios and the machine")
    parser.add_argument("--plot", type=Path, help="bar chart of the ratios with the targets (PNG)")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="instead of timing: torch.profiler tables of one training step and one cached beam search of each\n"
        "--profile-variants model at each --seq-lens, written to DIR, with a summary of the mask/cache ranges",
    )
    parser.add_argument("--profile-variants", nargs="+", default=["product", "none"], choices=(*GA_VARIANTS, "none"))
    args = parser.parse_args(argv)

    cpu = not args.device.startswith("cuda")
    defaults = dict(
        seq_lens=[20, 64, 256],
        batch_size=32,
        max_batch_tokens=1024 if cpu else 0,
        repeats=5,
        repeats_long=3,
        warmup=1,
        variants=list(GA_VARIANTS),
        eager_variants=["product"] if cpu else ["product", "none"],
        gen_variants=["product"] if cpu else ["product", "none"],
        static_variants=["product"],
        flex_variants=["product"],
        warm_variants=["resonance"],
        gen_batch_size=4,
        gen_max_batch_tokens=80 if cpu else 0,
        gen_max_new_tokens=64 if cpu else 0,
        threads=1 if cpu else 0,
        clock="cpu" if cpu else "wall",
    )
    if args.quick:
        defaults.update(
            seq_lens=[8, 16], batch_size=4, repeats=2, repeats_long=2, gen_batch_size=2, gen_max_new_tokens=8
        )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch sees no CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    bench = Bench(device, dtype, args.seed)
    model_kw = QUICK_MODEL if args.quick else PAPER_MODEL
    if args.profile:
        profile_runs(args, bench, model_kw, args.profile)
        return {}
    plan = comparisons(args)
    results = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "model": {field: getattr(CDNPGConfig(**model_kw), field) for field in QUICK_MODEL},
        "dtype": args.dtype,
        "machine": machine_info(device),
        "targets": {k: f"{op} {bound}" for k, (op, bound, _) in TARGETS.items()},
        "expected_ratio_keys": [f"L{length}/{c.key}" for length in args.seq_lens for c in plan],
        "ratios": {},
        "memory_ratios": {},
        "settings": {},
    }
    started = time.perf_counter()
    try:
        for length in args.seq_lens:
            # compiled kernels (flex attention's, the static cache's step) are per shape, and past torch's recompile
            # limit torch falls back to uncompiled code: each length starts from an empty compile cache
            torch._dynamo.reset()
            for part in PARTS:
                measure(args, bench, model_kw, length, part, plan, results)
                write_results(results, args.out)  # a later failure keeps what was measured
    except BaseException as error:
        results["error"] = f"{type(error).__name__}: {error}"
        write_results(results, args.out)
        log(f"stopped by {results['error']}" + (f"; what was measured is in {args.out}" if args.out else ""))
        raise
    results["wall_time_s"] = time.perf_counter() - started
    with contextlib.suppress(OSError):
        results["machine"]["load_average_at_end"] = os.getloadavg()

    print(format_table(results))
    print(f"\nwall time {results['wall_time_s']:.0f} s on {results['machine']['device_name']}")
    write_results(results, args.out)
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot(results, args.plot)
    return results


if __name__ == "__main__":
    main()
