#!/usr/bin/env python
"""Speed of C-DNPG's granularity masks: ratios of models timed side by side in one process, and their kernels.

    python benchmarks/speed.py --seq-lens 20 64 256 --out speed.json   # the paper's model (docs/speed.md)
    python benchmarks/speed.py --quick --out /tmp/quick.json             # tiny model: the smoke run
    python benchmarks/speed.py --seq-lens 20 --kernels-only --masks eager compiled --out k.json  # kernels, no timing
    python benchmarks/speed.py --device cuda --dtype bf16 --seq-lens 20 64 256 --masks eager compiled --out gpu.json

A `Model` is what is measured, a `Comparison` the ratio of two models in one part (a training step, or beam search)
with its targets. The models of a part take turns in rotated order, each call a `torch.utils.benchmark.Timer`
measurement (CPU: process time, one thread); a ratio is the median of the per-round ratios. Every model's kernels are
counted beside (`count_kernels`): a small model on a GPU is launch-bound, so they set its step time. `--masks`: GA's
masks as aten ops ("eager", a CPU's default) or compiled (`compile_granularity_masks=True`, CUDA's default).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import itertools
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config
from common import DECODING, machine_info, write_json
from report import show
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils import benchmark
from transformers import GenerationConfig
from transformers.modeling_outputs import Seq2SeqLMOutput

from cdnpg.training import bart_like
from configuration_cdnpg import COPY_MECHANISMS, GRANULARITY_MASKS
from modeling_cdnpg import CDNPGConfig, CDNPGForConditionalGeneration

BART = "bart"  # the mask of transformers' BartForConditionalGeneration of the same size
GA = tuple(mask for mask in GRANULARITY_MASKS if mask != "none")
PARTS = ("train", "generate")
KERNELS_AT_MOST = {"resonance": 1.20, "product": 1.30, "decoding step": 1.20}  # GA / none, compiled masks
CACHE = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"  # transformers 5.24's name


QUICK_STACK = {"layers": 2, "attention_heads": 4, "ffn_dim": 64}  # the encoder's and the decoder's of --quick's model
QUICK_MODEL = {"vocab_size": 512, "max_position_embeddings": 64, "d_model": 32,
               **{f"{side}_{k}": v for side in ("encoder", "decoder") for k, v in QUICK_STACK.items()}}  # fmt: skip
BATCH, GEN_BATCH = 32, 4  # training batch (the paper's) and beam-search sources; 4 and 2 with --quick
CPU_TRAIN_TOKENS = 1024  # batch x L cap of a training step on CPU: batch 32 at L 20, 16 at 64, 4 at 256
CPU_GEN_TOKENS = 80  # sources x max(L, new tokens) cap of a beam search on CPU: 4 sources at 20, 1 from 64 on
CPU_NEW_TOKENS = 64  # new-token cap of a beam search on CPU: one thread decodes 256 tokens in minutes
NOT_LAUNCHED = {  # aten ops that launch no kernel of their own: views, allocations, metadata, host reads, and
    # conversions that do nothing unless they copy (then the copy inside them is counted)
    "view", "_unsafe_view", "_reshape_alias", "reshape", "as_strided", "alias", "detach", "detach_", "expand",
    "expand_as", "broadcast_to", "transpose", "t", "permute", "unsqueeze", "squeeze", "slice", "select", "narrow",
    "view_as", "flatten", "unflatten", "split", "split_with_sizes", "chunk", "unbind", "lift_fresh", "resolve_conj",
    "resolve_neg", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_", "promote_types",
    "result_type", "item", "_local_scalar_dense", "is_nonzero", "to", "contiguous", "type_as", "dropout",
}  # fmt: skip
INDUCTOR_CPU_KERNEL = re.compile(r"(^|_)cpp_fused_")  # an inductor C++ kernel's profiler range (kernel profile on)


@dataclasses.dataclass(frozen=True)
class Model:
    """One measured model: C-DNPG, or transformers' BART of the same size (mask "bart")."""

    mask: str = "none"  # granularity_mask, or BART
    compiled_masks: bool = False  # compile_granularity_masks: GA's masks as generated kernels (CUDA's default)
    copy: str | None = None  # copy_mechanism

    @property
    def label(self) -> str:
        """The mask and the fields that differ from the defaults: "resonance (copy=learned)"."""
        fields = dataclasses.fields(self)[1:]
        changed = [f"{f.name}={getattr(self, f.name)}" for f in fields if getattr(self, f.name) != f.default]
        return f"{self.mask} ({', '.join(changed)})" if changed else self.mask

    def build(self, quick: bool) -> torch.nn.Module:
        torch.manual_seed(0)
        fields = dict(QUICK_MODEL) if quick else {}
        if self.mask == BART:
            return bart_like(CDNPGConfig(**fields))
        config = CDNPGConfig(granularity_mask=self.mask, compile_granularity_masks=self.compiled_masks,
                             copy_mechanism=self.copy, **fields)  # fmt: skip
        return CDNPGForConditionalGeneration(config)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """`numerator`'s time (and kernels) over `denominator`'s in one part, and the bounds the ratio should meet."""

    part: str  # "train": a training step; "generate": beam search (and one cached decoding step)
    numerator: Model
    denominator: Model
    at_most: float | None = None  # time
    kernels_at_most: float | None = None

    @property
    def key(self) -> str:
        return f"{self.part}/{self.numerator.label} / {self.denominator.label}"


def comparisons(args: argparse.Namespace) -> list[Comparison]:
    """Every ratio the options ask for, and the models built: those they name. What GA adds (to `none`, to a copy
    gate, per decoding step) is compared for each way of building its masks (--masks)."""
    none, bart, plan = Model(), Model(BART), []

    def ga(mask: str, masks: str, **fields) -> Model:  # the masks' way matters to GA masks only
        return Model(mask, masks == "compiled" and mask in GA, **fields)

    for masks in args.masks:  # the paper reports 1.25 for GA / none in training with its implementation
        targets = KERNELS_AT_MOST if masks == "compiled" else {}  # for the masks a (launch-bound) GPU runs
        for v in args.variants:
            plan.append(Comparison("train", ga(v, masks), none, at_most=1.05, kernels_at_most=targets.get(v)))
        for v, gate in itertools.product(args.copy_variants, COPY_MECHANISMS[1:]):
            plan.append(Comparison("train", ga(v, masks, copy=gate), ga(v, masks), at_most=1.10))
        for v in (v for v in args.gen_variants if v in GA):  # per decoding step
            plan.append(Comparison("generate", ga(v, masks), none, kernels_at_most=targets.get("decoding step")))
    if "eager" in args.masks and "compiled" in args.masks:
        plan += [Comparison("train", ga(v, "compiled"), ga(v, "eager")) for v in args.variants]
    plan.append(Comparison("train", none, bart, at_most=1.05, kernels_at_most=1.0))
    plan.append(Comparison("generate", none, bart))
    return [c for c in dict.fromkeys(plan) if c.part in args.parts]


def random_ids(config, batch: int, length: int, seed: int, device) -> torch.Tensor:
    """Random ids above the special ones ([PAD], [CLS], [SEP] of bert-base-uncased by default)."""
    first = max(config.pad_token_id, config.bos_token_id, config.eos_token_id) + 1
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(first, config.vocab_size, (batch, length), generator=generator).to(device)


def workload(spec: Model, model, part: str, batch: int, length: int, new_tokens: int, args):
    """The call a model's measurements time, on a fixed random batch."""
    model.to(args.device)
    source = random_ids(model.config, batch, length, 0, args.device)
    mask = torch.ones_like(source)
    autocast = torch.autocast(args.device.type, torch.bfloat16) if args.dtype == "bf16" else contextlib.nullcontext()
    if part == "train":
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        labels = random_ids(model.config, batch, length, 1, args.device)

        def train_step(observe=lambda half: contextlib.nullcontext()):  # count_kernels observes the halves
            with observe("forward"), autocast:
                loss = model(input_ids=source, attention_mask=mask, labels=labels).loss
            with observe("backward"):
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return train_step
    model.eval()
    special = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
    config = GenerationConfig(num_beams=DECODING["num_beams"], max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              early_stopping=False,
                              **{key: getattr(model.config, key) for key in special})  # fmt: skip

    def beam_search():
        with torch.inference_mode(), autocast:
            out = model.generate(input_ids=source, attention_mask=mask, generation_config=config)
        if out.shape != (batch, new_tokens + 1):
            raise RuntimeError(f"{spec.label}: generate returned {tuple(out.shape)}, not {(batch, new_tokens + 1)}")

    beams, state = source[:1].expand(config.num_beams, -1), {}  # one cached step of 8 beams of one source
    with torch.inference_mode(), autocast:
        encoded = model.get_encoder()(input_ids=beams, attention_mask=mask[:1].expand_as(beams))
    start = torch.full((config.num_beams, 1), config.decoder_start_token_id, device=args.device)

    def decoding_step():  # the first call fills the cache: the cross-attention keys and values, the start token
        with torch.inference_mode(), autocast:
            out = model(encoder_outputs=encoded, attention_mask=mask[:1].expand_as(beams), decoder_input_ids=start,
                        use_cache=True, **{CACHE: state.get("cache")})  # fmt: skip
        state["cache"] = getattr(out, CACHE)

    beam_search.step = decoding_step
    return beam_search


def shapes(args, length: int, part: str) -> tuple[int, int]:
    """(batch, new tokens) of a part at this length: the training batch, or the beam-search sources."""
    batch = ((2, GEN_BATCH) if part == "generate" else (4, BATCH))[not args.quick]  # (--quick, full)
    if args.device.type == "cuda":
        return batch, length
    new_tokens = min(length, CPU_NEW_TOKENS)  # the CPU caps
    cap = CPU_GEN_TOKENS // max(length, new_tokens) if part == "generate" else CPU_TRAIN_TOKENS // length
    return max(1, min(batch, cap)), new_tokens


def kernels(events, device: torch.device) -> int:
    """Kernels among profiled events. On CUDA the device's own (kernels, copies, fills). Elsewhere each aten op that
    does work (not NOT_LAUNCHED) with no such op inside it (`linear` counts once, a `masked_fill` twice: its copy and
    its fill), and each C++ kernel inductor generates (a profiler range of its own when
    `torch._inductor.config.cpp.enable_kernel_profile` is on as it compiles)."""
    if device.type == "cuda":
        return sum(event.device_type == DeviceType.CUDA for event in events)

    def works(event) -> bool:
        return event.name.startswith("aten::") and event.name.removeprefix("aten::") not in NOT_LAUNCHED

    def innermost(event) -> bool:
        return not any(works(child) or not innermost(child) for child in event.cpu_children)

    return sum(bool(INDUCTOR_CPU_KERNEL.search(e.name)) or (works(e) and innermost(e)) for e in events)


def count_kernels(call, part: str, new_tokens: int, device: torch.device) -> dict[str, float]:
    """Kernels of one call after a warm-up call (first-call allocations, compilation): a training step's forward and
    backward apart; a beam search's per new token, and one decoding step of a cached one."""
    counts, activities = {}, [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device.type == "cuda" else [])]

    @contextlib.contextmanager
    def observe(name: str):
        with profile(activities=activities) as prof:
            yield
        counts[name] = kernels(prof.events(), device)

    call()
    if part == "train":
        call(observe)
        return counts | {"total": counts["forward"] + counts["backward"]}
    with observe("call"):
        call()
    counts = {"generate_per_token": counts["call"] / new_tokens}
    call.step()
    with observe("step"):
        call.step()
    return counts | {"total": counts["generate_per_token"]}


def judged(value: float, at_most: float | None = None) -> dict:
    """A ratio, and its target and whether it is met when it has one."""
    return {"value": value, **({} if at_most is None else {"target": f"<= {at_most}", "passed": value <= at_most})}


def measure(args, length: int, part: str, plan: list[Comparison], results: dict) -> None:
    """Count and time every model the `part` comparisons name at this length; store the ratios."""
    if not (plan := [c for c in plan if c.part == part]):
        return
    batch, new_tokens = shapes(args, length, part)
    specs = list(dict.fromkeys(model for c in plan for model in (c.numerator, c.denominator)))
    calls = {spec: workload(spec, spec.build(args.quick), part, batch, length, new_tokens, args) for spec in specs}
    counted = {spec: count_kernels(call, part, new_tokens, args.device) for spec, call in calls.items()}
    results["kernels"] |= {f"L{length}/{part}/{spec.label}": counts for spec, counts in counted.items()}
    for c in plan:
        numerator, denominator = counted[c.numerator], counted[c.denominator]
        of = "step" if part == "generate" else "total"  # a decoding step's
        results["kernel_ratios"][f"L{length}/{c.key}"] = judged(numerator[of] / denominator[of], c.kernels_at_most)
    if args.kernels_only:
        return
    print(f"[L{length}] {part}: batch {batch}, {len(calls)} models, {args.repeats} rounds", file=sys.stderr)
    clock = {"timer": time.process_time} if args.device.type == "cpu" else {}  # Timer's default syncs CUDA
    rounds = []
    for shift in (r % len(specs) for r in range(args.repeats)):
        rounds.append({})
        for spec in specs[shift:] + specs[:shift]:
            timer = benchmark.Timer("call()", globals={"call": calls[spec]}, num_threads=torch.get_num_threads(),
                                    label=part, sub_label=spec.label, description=f"L{length}", **clock)  # fmt: skip
            rounds[-1][spec] = timer.blocked_autorange(min_run_time=args.min_run_time)
    results["measurements"] += [m for measured in rounds for m in measured.values()]
    results["median_s"][f"L{length}/{part}"] = {s.label: statistics.median(m[s].median for m in rounds) for s in specs}
    for c in plan:
        per_round = [m[c.numerator].median / m[c.denominator].median for m in rounds]
        low, _, high = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else per_round * 3
        ratio = judged(statistics.median(per_round), c.at_most)
        results["ratios"][f"L{length}/{c.key}"] = ratio | {"quartiles": [low, high], "per_round": per_round}
    del calls
    gc.collect()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--seq-lens", type=int, nargs="+", help="source = target lengths (default 20 64 256; --quick 8 16)")
    add("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="what to measure")
    add("--masks", nargs="+", choices=("eager", "compiled"), help="how GA's masks are built (default: the device's)")
    add("--variants", nargs="*", default=list(GA), choices=GA, help="GA vs none, training step")
    add("--gen-variants", nargs="*", default=["product"], choices=GA, help="GA vs none, beam search")
    add("--copy-variants", nargs="*", default=[], choices=GA, help="with each copy gate vs without")
    add("--repeats", type=int, help="interleaved rounds (default 5; --quick 2)")
    add("--min-run-time", type=float, default=0.2, help="blocked_autorange's, seconds per measurement")
    add("--device", type=torch.device, default=torch.device("cpu"))
    add("--dtype", default="fp32", choices=("fp32", "bf16"), help="bf16: autocast, fp32 weights")
    add("--quick", action="store_true", help="tiny model, lengths 8 and 16: a smoke run")
    add("--out", type=Path, help="JSON: the ratios, kernels, every measurement, the options, the machine")
    add("--kernels-only", action="store_true", help="count every model's kernels, time nothing")
    args = parser.parse_args(argv)
    args.seq_lens = args.seq_lens or ([8, 16] if args.quick else [20, 64, 256])
    args.repeats = args.repeats or (2 if args.quick else 5)
    args.masks = args.masks or ["compiled" if args.device.type == "cuda" else "eager"]
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    plan = comparisons(args)
    command = " ".join(["speed.py", *(sys.argv[1:] if argv is None else argv)])
    results = {"benchmark": "speed", "command": command, "options": vars(args), "machine": machine_info(),
               "comparisons": [dataclasses.asdict(c) | {"key": c.key} for c in plan], "ratios": {}, "median_s": {},
               "measurements": [], "kernels": {}, "kernel_ratios": {}}  # fmt: skip

    def save():
        if args.out:
            write_json({**results, "measurements": [str(m) for m in results["measurements"]]}, args.out)

    threads = torch.get_num_threads()  # on a CPU one: a thread waiting for a descheduled sibling inflates small ops
    torch.set_num_threads(1 if args.device.type == "cpu" else threads)
    try:  # inductor's C++ kernels as profiler ranges, so that `kernels` counts them
        with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
            for length in args.seq_lens:
                torch.compiler.reset()  # the masks compile anew per length: torch's recompile limit is never reached
                for part in PARTS:
                    measure(args, length, part, plan, results)
                    save()  # a later failure keeps what was measured
    finally:
        torch.set_num_threads(threads)
    if results["measurements"]:
        benchmark.Compare(results["measurements"]).print()
    show([results])
    save()
    return results


if __name__ == "__main__":
    main()
