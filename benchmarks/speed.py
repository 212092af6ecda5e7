#!/usr/bin/env python
"""Speed of C-DNPG's granularity masks, as ratios of models timed side by side in one process.

    python benchmarks/speed.py --seq-lens 20 64 256 --out speed.json   # the paper's model (docs/speed.md)
    python benchmarks/speed.py --quick --out /tmp/quick.json             # tiny model, about a minute (smoke test)
    python benchmarks/speed.py --seq-lens 20 --parts train --profile prof  # where the time goes: torch.profiler
    python benchmarks/speed.py --seq-lens 20 --kernels-only --out k.json  # kernels per step, no timing

`comparisons` lists the ratios and TARGETS their bounds. The models of a part take turns in rotated order, each call
a `torch.utils.benchmark.Timer` measurement (CPU: process time, one thread); a ratio is the median of the per-round
ratios. Every runner's kernels per call are counted beside its times (`count_kernels`): on a GPU, where a small
model is launch-bound, they set the step time. Protocol, reading and GPU command: docs/speed.md; tables and figures
of result files: benchmarks/report.py.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import itertools
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config
from common import DECODING, format_table, machine_info, write_json
from report import show
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils import benchmark
from transformers import GenerationConfig

from cdnpg.training import bart_like
from cdnpg.training.arguments import architecture_fields
from modeling_cdnpg import GRANULARITY_MASKS, CDNPGConfig, CDNPGForConditionalGeneration, GranularityHead
from modeling_cdnpg.modeling_cdnpg import CACHE_NAME, CDNPGAttention

GA_VARIANTS = tuple(mask for mask in GRANULARITY_MASKS if mask != "none")
PARTS = ("train", "generate", "forward")
BART, WARM = "bart", "minilm:"  # runner names: transformers' BART; prefix of a model of MINILM_MODEL's size
COPY = "copy-"  # runner prefix: "copy-learned:resonance" is resonance with the learned copy gate
FUSED = "fused:"  # runner prefix: "fused:resonance" builds its masks compiled (config.compile_granularity_masks)
QUICK_MODEL = {"vocab_size": 512, "max_position_embeddings": 64, **architecture_fields(d_model=32, layers=2)}
QUICK_MODEL.update(architecture_fields(attention_heads=4, ffn_dim=64))
MINILM_MODEL = {  # what `cdnpg convert` makes of all-MiniLM-L6-v2 (random weights: only the size matters here)
    **architecture_fields(d_model=384, layers=6, attention_heads=12, ffn_dim=1536), "activation_function": "gelu",
    "layernorm_embedding": True, "layer_norm_eps": 1e-12,
}  # fmt: skip
TARGETS = {  # name -> (comparison, bound); the paper reports 1.25 for GA / none with its implementation
    "train_ga_vs_none": ("<=", 1.10), "train_none_vs_bart": ("<=", 1.05), "gen_cache_speedup": (">=", 3.0),
    "train_warm_vs_bart": ("<=", 1.15), "train_copy_vs_plain": ("<=", 1.10),  # issue 29: copying may cost a tenth
}  # fmt: skip
BATCH, GEN_BATCH = 32, 4  # training batch (the paper's) and beam-search sources; 4 and 2 with --quick
CPU_TRAIN_TOKENS = 1024  # batch x L cap of a training step on CPU: batch 32 at L 20, 16 at 64, 4 at 256
CPU_GEN_TOKENS = 80  # sources x max(L, new tokens) cap of a beam search on CPU: 4 sources at 20, 1 from 64 on
CPU_NEW_TOKENS = 64  # new-token cap on CPU: use_cache=False recomputes every position at every step
NOT_LAUNCHED = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "resize_", "resolve_conj",
                "resolve_neg", "detach", "lift_fresh", "_unsafe_view"}  # allocations, metadata: no kernel  # fmt: skip
DISPATCHED = set(torch._C._dispatch_get_all_op_names())  # overloads with kernels (not TorchScript's)
KERNEL_COLUMNS = ("forward", "backward", "total", "step", "generate_per_token", "call")
INDUCTOR_CPU_KERNEL = re.compile(r"(^|_)cpp_fused_")  # an inductor C++ kernel's profiler range (kernel profile on)
PROFILED = {GranularityHead: "cdnpg::GranularityHead (eq. 4)", CDNPGAttention: "cdnpg::CDNPGAttention"}


def comparisons(args) -> list[tuple[str, str, str, str, str | None]]:
    """Every ratio these options measure at each length, as (key, part, numerator runner, denominator runner, target):
    the models built are exactly the runners named here. A runner name says what runs how: "product" (SDPA) or
    "product@eager" in train and forward; "product+cache", "product-cache" (use_cache=False) or "product+static"
    (static cache, `torch.compile`d forward) in generate; "product+compiled" (`torch.compile`d model) in train."""
    plan = [(f"train/{v}_vs_none", "train", v, "none", "train_ga_vs_none") for v in args.variants]
    plan.append(("train/none_vs_bart", "train", "none", BART, "train_none_vs_bart"))
    plan += [(f"train/{v}_sdpa_vs_eager", "train", v, f"{v}@eager", None) for v in args.eager_variants]
    for v in args.warm_variants:
        plan.append((f"train/warm_{v}_vs_bart", "train", WARM + v, WARM + BART, "train_warm_vs_bart"))
    for v, gate, size in itertools.product(args.copy_variants, ("learned", "granularity"), ("", WARM)):
        key = f"train/{size.replace(':', '_')}{v}_{gate}_copy_vs_{v}"
        plan.append((key, "train", f"{size}{COPY}{gate}:{v}", size + v, "train_copy_vs_plain"))
    for v in args.compiled_variants:  # the same step as one compiled graph: against eager, and as GA adds to none
        plan.append((f"train/{v}_compiled_vs_eager", "train", f"{v}+compiled", v, None))
        plan += (
            [(f"train/{v}_vs_none_compiled", "train", f"{v}+compiled", "none+compiled", None)] if v != "none" else []
        )
    if args.compiled_variants:
        plan.append(("train/none_vs_bart_compiled", "train", "none+compiled", f"{BART}+compiled", None))
    for v in args.fused_variants:  # eager model, the GA mask compiled alone: against none and the unfused mask
        plan.append((f"train/{v}_fused_vs_none", "train", FUSED + v, "none", None))
        plan.append((f"train/{v}_fused_vs_unfused", "train", FUSED + v, v, None))
        for gate in ("learned", "granularity") if v in args.copy_variants else ():  # what copying adds to it
            key = f"train/{v}_fused_{gate}_copy_vs_{v}_fused"
            plan.append((key, "train", f"{FUSED}{COPY}{gate}:{v}", FUSED + v, "train_copy_vs_plain"))
        plan.append((f"gen/{v}_fused_vs_none_cached", "generate", f"{FUSED}{v}+cache", "none+cache", None))
    for v in args.gen_variants:
        plan.append((f"gen/{v}_nocache_vs_cache", "generate", f"{v}-cache", f"{v}+cache", "gen_cache_speedup"))
        plan += [(f"gen/{v}_vs_none_cached", "generate", f"{v}+cache", "none+cache", None)] if v != "none" else []
    plan.append(("gen/none_vs_bart_cached", "generate", "none+cache", f"{BART}+cache", None))
    for v, gate in itertools.product(args.copy_variants, ("learned", "granularity")):
        plan.append((f"gen/{v}_{gate}_copy_vs_{v}_cached", "generate", f"{COPY}{gate}:{v}+cache", f"{v}+cache", None))
    for v in args.static_variants:
        plan.append((f"gen/{v}_static_compiled_vs_dynamic", "generate", f"{v}+static", f"{v}+cache", None))
        plan.append((f"gen/{v}_static_compiled_vs_bart", "generate", f"{v}+static", f"{BART}+static", None))
        if v != "none" and "none" in args.static_variants:  # what GA adds to a compiled decoding step
            plan.append((f"gen/{v}_vs_none_static_compiled", "generate", f"{v}+static", "none+static", None))
    plan += [(f"forward/{v}_flex_vs_sdpa", "forward", f"{v}@flex_attention", v, None) for v in args.flex_variants]
    return [c for c in plan if c[1] in args.parts]


def model_name(runner: str) -> str:
    """The model a runner times: "product@eager" of "product@eager", "product" of "product+cache" and of
    "product+compiled" (which compiles a wrapper of it); a static-cache runner's own ("product+static"), whose forward
    is compiled."""
    return runner if runner.endswith("+static") else runner.split("+")[0].removesuffix("-cache")


def build_model(runner: str, model_kw: dict) -> torch.nn.Module:
    """The model a runner times: C-DNPG with that mask and attention implementation, or BART of the same size
    (`cdnpg.training.bart_like`); "minilm:" ones take MINILM_MODEL's size. Flex attention has no attention dropout,
    so its models are built without (the forward part is in eval mode, where dropout is off anyway)."""
    name, _, attn = runner.split("+")[0].removesuffix("-cache").partition("@")
    torch.manual_seed(0)
    if name.startswith(WARM):
        name, model_kw = name.removeprefix(WARM), {**model_kw, **MINILM_MODEL}
        if name != BART:  # what from_bert builds besides: BERT's prediction head, no activation dropout
            model_kw = {**model_kw, "lm_head_transform": True, "activation_dropout": 0.0}
    if name.startswith(FUSED):
        name, model_kw = name.removeprefix(FUSED), {**model_kw, "compile_granularity_masks": True}
    if name.startswith(COPY):
        gate, _, name = name.removeprefix(COPY).partition(":")
        model_kw = {**model_kw, "copy_mechanism": gate}
    if attn == "flex_attention":
        model_kw = {**model_kw, "attention_dropout": 0.0}
    if name == BART:
        return bart_like(CDNPGConfig(**model_kw))
    config = CDNPGConfig(granularity_mask=name, attn_implementation=attn or "sdpa", **model_kw)
    return CDNPGForConditionalGeneration(config)


def random_ids(config, batch: int, length: int, seed: int, device) -> torch.Tensor:
    """Random ids above the special ones ([PAD], [CLS], [SEP] of bert-base-uncased by default)."""
    first = max(config.pad_token_id, config.bos_token_id, config.eos_token_id) + 1
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(first, config.vocab_size, (batch, length), generator=generator).to(device)


def workload(runner: str, model, part: str, batch: int, length: int, new_tokens: int, args):
    """The call a runner's measurements time, on a fixed random batch."""
    model.to(args.device)
    source = random_ids(model.config, batch, length, 0, args.device)
    mask = torch.ones_like(source)
    autocast = torch.autocast(args.device.type, torch.bfloat16) if args.dtype == "bf16" else contextlib.nullcontext()
    if part == "train":
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        labels = random_ids(model.config, batch, length, 1, args.device)

        step_model = torch.compile(model, backend=args.compile_backend) if runner.endswith("+compiled") else model

        def train_step(observe=lambda half: contextlib.nullcontext()):  # count_kernels observes the halves
            with observe("forward"), autocast:
                loss = step_model(input_ids=source, attention_mask=mask, labels=labels).loss
            with observe("backward"):
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return train_step
    model.eval()
    if part == "forward":  # without the LM head, whose (b, L, vocabulary) logits would dominate the memory
        target = random_ids(model.config, batch, length, 2, args.device)

        def forward():
            with torch.inference_mode(), autocast:
                model.model(input_ids=source, attention_mask=mask, decoder_input_ids=target)

        return forward
    special = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
    config = GenerationConfig(num_beams=DECODING["num_beams"], max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              early_stopping=False, use_cache=not runner.endswith("-cache"),
                              **{key: getattr(model.config, key) for key in special})  # fmt: skip
    if runner.endswith("+static"):  # transformers 5.24 compiles no beam search itself: it calls the model directly
        config.cache_implementation = "static"
        mode = "reduce-overhead" if args.device.type == "cuda" else None  # CUDA graphs
        model.forward = torch.compile(model.forward, backend=args.compile_backend, mode=mode, fullgraph=True)

    def beam_search():
        with torch.inference_mode(), autocast:
            out = model.generate(input_ids=source, attention_mask=mask, generation_config=config)
        if out.shape != (batch, new_tokens + 1):
            raise RuntimeError(f"{runner}: generate returned {tuple(out.shape)}, expected {(batch, new_tokens + 1)}")

    if runner.endswith("+cache"):  # one cached step of 8 beams of one source, as beam search runs it
        beams, state = source[:1].expand(config.num_beams, -1), {}
        with torch.inference_mode(), autocast:
            encoded = model.get_encoder()(input_ids=beams, attention_mask=mask[:1].expand_as(beams))
        start = torch.full((config.num_beams, 1), config.decoder_start_token_id, device=args.device)

        def decoding_step():  # the first call fills the cache: the cross-attention keys and values, the start token
            with torch.inference_mode(), autocast:
                out = model(encoder_outputs=encoded, attention_mask=mask[:1].expand_as(beams), decoder_input_ids=start,
                            use_cache=True, **{CACHE_NAME: state.get("cache")})  # fmt: skip
            state["cache"] = getattr(out, CACHE_NAME)

        beam_search.step = decoding_step
    return beam_search


def shapes(args, length: int, part: str) -> tuple[int, int]:
    """(batch, new tokens) of a part at this length: the training and forward batch, or the beam-search sources."""
    batch = ((2, GEN_BATCH) if part == "generate" else (4, BATCH))[not args.quick]  # (--quick, full)
    if args.device.type == "cuda":
        return batch, length
    new_tokens = min(length, CPU_NEW_TOKENS)  # the CPU caps
    cap = CPU_GEN_TOKENS // max(length, new_tokens) if part == "generate" else CPU_TRAIN_TOKENS // length
    return max(1, min(batch, cap)), new_tokens


def peak_memory(fn, device) -> int | None:
    """Peak bytes allocated during one call of fn above those allocated before it, on CUDA; None on CPU."""
    if device.type != "cuda":
        return None
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


@functools.cache
def launches(name: str) -> bool:
    """Whether an aten op the profiler recorded runs a kernel of its own: it returns a tensor and is no allocation,
    view (metadata only) or composite op (made of other ops, which are counted instead)."""
    if not name.startswith("aten::") or name.removeprefix("aten::") in NOT_LAUNCHED:
        return False
    packet = getattr(torch.ops.aten, name.removeprefix("aten::"))  # the profiler names no overload: the first
    overloads = [getattr(packet, name) for name in sorted(packet.overloads(), key="default".__ne__)]
    op = next(op for op in overloads if op.name() in DISPATCHED)
    composite = op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
    return not (composite or op.is_view) and any(str(r.type).startswith("Tensor") for r in op._schema.returns)


def kernels(events, device: torch.device) -> int:
    """Kernels among profiled events: on CUDA the device's own (kernels, copies, fills); elsewhere the aten ops that
    launch one (`launches`) and the C++ kernels inductor generates (`INDUCTOR_CPU_KERNEL`, profiled when
    `torch._inductor.config.cpp.enable_kernel_profile` was on as they were compiled), each run inside none of these
    (what runs inside a kernel is its implementation)."""
    if device.type == "cuda":
        return sum(event.device_type == DeviceType.CUDA for event in events)

    def kernel(name: str) -> bool:
        return launches(name) or INDUCTOR_CPU_KERNEL.search(name) is not None

    def nested(event) -> bool:  # inside an op that launches a kernel: part of that op's
        return (parent := event.cpu_parent) is not None and (kernel(parent.name) or nested(parent))

    return sum(kernel(event.name) and not nested(event) for event in events)


def count_kernels(call, part: str, new_tokens: int, device: torch.device) -> dict[str, float]:
    """Kernels of one call after a warm-up call (first-call allocations, compilation): a training step's forward and
    backward apart; a beam search's per new token, and one decoding step of a cached one; a forward's."""
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
    if part == "forward":
        return counts | {"total": counts["call"]}
    counts = {"generate_per_token": counts["call"] / new_tokens}
    if step := getattr(call, "step", None):
        step()
        with observe("step"):
            step()
    return counts | {"total": counts["generate_per_token"]}


def measure(args, model_kw: dict, length: int, part: str, plan: list[tuple], results: dict) -> None:
    """Time every runner the `part` comparisons name at this length in interleaved rounds; store the ratios."""
    plan = [c for c in plan if c[1] == part]
    if not plan:
        return
    runners = list(dict.fromkeys(runner for c in plan for runner in c[2:4]))
    batch, new_tokens = shapes(args, length, part)
    models = {}  # one model per (mask, attention): cached and uncached beam search share it, compiled ones do not
    calls = {}
    for runner in runners:
        if (name := model_name(runner)) not in models:
            models[name] = build_model(runner, model_kw)
            if args.profile and not runner.endswith("+static"):  # dynamo cannot trace the hooks' ranges
                label_modules(models[name])
        calls[runner] = workload(runner, models[name], part, batch, length, new_tokens, args)
    if not args.profile:
        for runner, call in calls.items():
            results["kernels"][f"L{length}/{part}/{runner}"] = count_kernels(call, part, new_tokens, args.device)
        for key, _, numerator, denominator, _ in plan:
            counted = [results["kernels"].get(f"L{length}/{part}/{runner}", {}) for runner in (numerator, denominator)]
            of = "step" if all("step" in c for c in counted) else "total"  # else generate() per token
            if all(counted):
                results["kernel_ratios"][f"L{length}/{key}"] = counted[0][of] / counted[1][of]
    if args.kernels_only:
        return
    if args.profile:  # instead of the timing: one profiled call of each runner, after a warm-up call
        args.profile.mkdir(parents=True, exist_ok=True)
        for runner, call in calls.items():
            call()
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                call()
            name, averages = f"L{length}_{part}_{runner}", prof.key_averages()
            table = averages.table(sort_by="self_cpu_time_total", row_limit=60, max_name_column_width=70)
            (args.profile / f"{name}.txt").write_text(f"{name}: batch {batch}\n{table}", encoding="utf-8")
            ranges = {e.key: e.cpu_time_total / 1e6 for e in averages if e.key.startswith("cdnpg::")}
            results["profile"][name] = {"self_cpu_total_s": sum(e.self_cpu_time_total for e in averages) / 1e6,
                                        "ranges_s": ranges}  # fmt: skip
            print(f"{name}: {results['profile'][name]}", file=sys.stderr)
        return
    print(f"[L{length}] {part}: batch {batch}, {len(runners)} runners, {args.repeats} rounds", file=sys.stderr)
    peaks = {runner: peak_memory(call, args.device) for runner, call in calls.items()}
    clock = {"timer": time.process_time} if args.device.type == "cpu" else {}  # Timer's default syncs CUDA
    rounds = []
    for round_ in range(args.repeats):
        shift = round_ % len(runners)
        rounds.append({})
        for runner in runners[shift:] + runners[:shift]:
            timer = benchmark.Timer("call()", globals={"call": calls[runner]}, num_threads=torch.get_num_threads(),
                                    label=part, sub_label=runner, description=f"L{length}", **clock)  # fmt: skip
            rounds[-1][runner] = timer.blocked_autorange(min_run_time=args.min_run_time)
    results["measurements"] += [m for measured in rounds for m in measured.values()]
    results["median_s"][f"L{length}/{part}"] = {r: statistics.median(m[r].median for m in rounds) for r in runners}
    for key, _, numerator, denominator, target in plan:
        per_round = [m[numerator].median / m[denominator].median for m in rounds]
        low, _, high = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else per_round * 3
        ratio = {"value": statistics.median(per_round), "quartiles": [low, high], "per_round": per_round}
        if target:
            op, bound = TARGETS[target]
            passed = ratio["value"] <= bound if op == "<=" else ratio["value"] >= bound
            ratio |= {"target": f"{op} {bound}", "passed": passed}
        if peaks[numerator] is not None:
            ratio["memory"] = peaks[numerator] / max(peaks[denominator], 1)
        results["ratios"][f"L{length}/{key}"] = ratio
    del models, calls
    gc.collect()


def label_modules(model: torch.nn.Module) -> None:
    """A profiler range around the forward pass of every granularity head and attention module, through hooks (the
    model is not edited), so that product against none shows the GA share of attention."""
    for module in model.modules():
        if name := PROFILED.get(type(module)):
            opened = []  # the range this module's forward opened
            module.register_forward_pre_hook(lambda *_, n=name, o=opened: o.append(record_function(n).__enter__()))
            module.register_forward_hook(lambda *_, o=opened: o.pop().__exit__(None, None, None), always_call=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add, masks = parser.add_argument, dict(nargs="*", choices=GRANULARITY_MASKS)
    add("--seq-lens", type=int, nargs="+", help="source = target lengths (default 20 64 256)")
    add("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="what to time")
    add("--variants", nargs="+", default=list(GA_VARIANTS), choices=GA_VARIANTS, help="GA vs none")
    add("--eager-variants", **masks, default=["product"], help="SDPA vs eager, training step")
    add("--gen-variants", **masks, default=["product"], help="use_cache=False vs cached beam search")
    add("--static-variants", **masks, default=["product"], help="static cache + compile vs dynamic")
    add("--compiled-variants", **masks, default=[], help="torch.compile'd training step vs eager, and vs none, BART")
    add("--fused-variants", nargs="*", default=[], choices=GA_VARIANTS, help="masks compiled alone vs none, unfused")
    add("--flex-variants", **masks, default=["product"], help="flex attention vs SDPA, forward")
    add("--warm-variants", **masks, default=["resonance"], help="MiniLM-size model vs BART, training")
    add("--copy-variants", nargs="*", default=[], choices=GA_VARIANTS, help="with each copy gate vs without")
    add("--repeats", type=int, help="interleaved rounds (default 5)")
    add("--min-run-time", type=float, default=0.2, help="blocked_autorange's, seconds per measurement")
    add("--device", type=torch.device, default=torch.device("cpu"))
    add("--dtype", default="fp32", choices=("fp32", "bf16"), help="bf16: autocast, fp32 weights")
    add("--quick", action="store_true", help="tiny model, lengths 8 and 16: a smoke run")
    add("--out", type=Path, help="JSON: the ratios, every measurement, the options, the machine")
    add("--profile", type=Path, metavar="DIR", help="instead of the timing, profile each runner once into DIR")
    add("--kernels-only", action="store_true", help="count every runner's kernels, time nothing")
    add("--compile-backend", default="inductor", help="torch.compile's, for the +static and +compiled runners")
    args = parser.parse_args(argv)
    args.seq_lens = args.seq_lens or ([8, 16] if args.quick else [20, 64, 256])
    args.repeats = args.repeats or (2 if args.quick else 5)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.device.type == "cpu":
        torch.set_num_threads(1)  # a thread waiting for a descheduled sibling would inflate small ops many times
        torch._inductor.config.cpp.enable_kernel_profile = True  # inductor's C++ kernels as profiler ranges: counted
    model_kw = QUICK_MODEL if args.quick else {}
    plan = comparisons(args)
    command = " ".join(["speed.py", *(sys.argv[1:] if argv is None else argv)])
    results = {"benchmark": "speed", "command": command, "options": vars(args), "machine": machine_info(),
               "expected_ratio_keys": [f"L{length}/{c[0]}" for length in args.seq_lens for c in plan],
               "ratios": {}, "median_s": {}, "measurements": [], "profile": {}, "kernels": {},
               "kernel_ratios": {}}  # fmt: skip

    def save():
        if args.out:
            write_json({**results, "measurements": [str(m) for m in results["measurements"]]}, args.out)

    try:
        for length in args.seq_lens:
            torch.compiler.reset()  # compiled code is per shape; past torch's recompile limit it would fall back
            for part in PARTS:
                measure(args, model_kw, length, part, plan, results)
                save()  # a later failure keeps what was measured
    except Exception as error:
        results["error"] = f"{type(error).__name__}: {error}"
        save()
        print(f"stopped by {results['error']}" + (f"; what was measured is in {args.out}" if args.out else ""),
              file=sys.stderr)  # fmt: skip
        raise
    if not (args.profile or args.kernels_only):  # they time no ratio: no table to print
        benchmark.Compare(results["measurements"]).print()
        show([results])
    if kernels := results["kernels"]:
        rows = [[key, *(f"{c[k]:.0f}" if k in c else "–" for k in KERNEL_COLUMNS)] for key, c in kernels.items()]
        print(format_table(["L/part/runner", *KERNEL_COLUMNS], rows))
        print(format_table(["L/ratio", "kernels"], [[k, f"{r:.3f}"] for k, r in results["kernel_ratios"].items()]))
    save()
    return results


if __name__ == "__main__":
    main()
