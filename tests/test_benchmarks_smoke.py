"""`benchmarks/speed.py` and `benchmarks/report.py`: a quick run measures and counts every comparison its options
name, and keeps what it measured when a later length fails; report.py prints its tables; the kernel count agrees with
a count by hand, a direct profiler count and a dispatcher-level count, and sees what GA adds and what compiling the
masks takes away. No timing is asserted: the ratios of a tiny model on a shared machine say nothing; the full
benchmark is read in docs/speed.md."""

import contextlib
import io
import json
import math
import os
import shutil

import pytest
import report
import speed
import torch
import torch._inductor.config
from speed import BART, Comparison, Model
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

CPU = torch.device("cpu")
needs_a_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None, reason="inductor's CPU kernels need a C++ compiler"
)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> dict:
    """One quick run of both parts, with the copy gates, at L 8 and then at L 80, which the quick model's 64 positions
    refuse: what --out kept."""
    out = tmp_path_factory.mktemp("speed") / "quick.json"
    flags = ["--quick", "--seq-lens", "8", "80", "--repeats", "2", "--min-run-time", "0.01", "--copy-variants",
             "resonance", "--out", str(out)]  # fmt: skip
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(Exception, match="max_position_embeddings"):
        speed.main(flags)
    return {"out": out, "results": json.loads(out.read_text())}


def test_a_quick_run_measures_every_comparison_and_keeps_them_when_a_later_length_fails(quick_run):
    results = quick_run["results"]
    keys = {f"L8/{comparison['key']}" for comparison in results["comparisons"]}
    assert set(results["ratios"]) == set(results["kernel_ratios"]) == keys  # every one, at L 8 only
    names = {key.removeprefix("L8/") for key in keys}
    assert {f"train/{mask} / none" for mask in ("resonance", "scope", "product", "mean")} <= names
    assert {"train/none / bart", "generate/none / bart", "generate/product / none",
            "train/resonance (copy=learned) / resonance", "train/resonance (copy=granularity) / resonance"} <= names  # fmt: skip
    for key in keys:
        ratio = results["ratios"][key]
        assert all(math.isfinite(value) and value > 0 for value in [ratio["value"], *ratio["quartiles"]]), key
        assert len(ratio["per_round"]) == 2
    assert results["ratios"]["L8/train/resonance / none"]["target"] == "<= 1.05"
    assert results["kernel_ratios"]["L8/train/none / bart"]["target"] == "<= 1.0"
    # kernel targets are for compiled masks, a GPU's default; a CPU's eager masks launch more and have none
    assert "target" not in results["kernel_ratios"]["L8/train/product / none"]
    # the models counted and timed are exactly those the comparisons name, each in every round
    named = {f"L8/{c['part']}/{Model(**model).label}" for c in results["comparisons"]
             for model in (c["numerator"], c["denominator"])}  # fmt: skip
    assert set(results["kernels"]) == named and len(results["measurements"]) == 2 * len(named)
    for field in ("torch", "transformers", "cpu_count", "cpu"):
        assert results["machine"][field]


def test_kernels_only_counts_every_models_kernels_and_times_nothing(tmp_path):
    out = tmp_path / "kernels.json"
    flags = ["--quick", "--seq-lens", "8", "--parts", "train", "--variants", "resonance", "--kernels-only"]
    with contextlib.redirect_stderr(io.StringIO()):
        speed.main([*flags, "--out", str(out)])
    results = json.loads(out.read_text())
    assert {"L8/train/resonance", "L8/train/none"} <= set(results["kernels"])
    assert results["kernels"]["L8/train/resonance"]["total"] > results["kernels"]["L8/train/none"]["total"] > 0
    assert "L8/train/resonance / none" in results["kernel_ratios"]
    assert not results["ratios"] and not results["median_s"] and not results["measurements"]


def test_report_prints_the_tables_of_speed_results(quick_run, capsys):
    report.main([str(quick_run["out"])])
    printed = capsys.readouterr().out
    assert "| L8/train/product / none |" in printed  # the time ratios, then the kernels and their ratios
    assert "| L8/train/bart | " in printed and "| L8/generate/product / none | " in printed
    report.main([])  # the results kept in benchmarks/results/
    assert "| L/part/model (kernels) |" in capsys.readouterr().out
    # a run that ends prints torch.utils.benchmark's table of its measurements, then report.py's
    speed.main(["--quick", "--seq-lens", "8", "--parts", "generate", "--gen-variants", "--repeats", "1"])
    printed = capsys.readouterr().out
    assert "generate ---]" in printed and "| L8/generate/none / bart |" in printed


def test_report_averages_seeds_and_leaves_out_a_metric_a_run_could_not_compute(tmp_path, capsys):
    """novelty.py writes NaN for the high-z words of a model without z: left out of the mean, not failing it."""
    files = []
    for seed, bleu in ((0, 20.0), (1, 22.0)):
        run = {"benchmark": "novelty", "model": f"none-copy-s{seed}", "setting": "beam search", "family": "beam",
               "value": 0.0, "settings": {"split": "report", "pairs": 2},
               "metrics": {"bleu4": bleu, "ibleu": 10.0, "high_z_kept": float("nan")}}  # fmt: skip
        files.append(tmp_path / f"runs-{seed}.jsonl")
        files[-1].write_text(json.dumps(run) + "\n")
    report.main(list(map(str, files)))
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| beam search"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1:4] == ["21.00 ± 1.41", "10.00 ± 0.00", "–"]  # BLEU-4, true iBLEU, self-BLEU-4 (not written)
    assert cells[7] == "–"  # high-z words kept


def test_the_options_name_the_comparisons_as_plain_data():
    """--masks compares GA with none each way its masks are built, and the two ways with each other, kernel targets
    going to the compiled masks a GPU runs by default; a subset of --variants leaves the others out; the default way
    is the device's (compiled on CUDA)."""
    args = speed.parse_args(
        ["--masks", "eager", "compiled", "--variants", "resonance", "--copy-variants", "resonance"]
    )
    plan = speed.comparisons(args)
    none, resonance, compiled_masks = Model(), Model("resonance"), Model("resonance", compiled_masks=True)
    assert Comparison("train", compiled_masks, none, at_most=1.05, kernels_at_most=1.20) in plan
    assert Comparison("train", resonance, none, at_most=1.05) in plan
    assert Comparison("train", compiled_masks, resonance) in plan
    assert Comparison("train", none, Model(BART), at_most=1.05, kernels_at_most=1.0) in plan
    assert Comparison("generate", Model("product", compiled_masks=True), none, kernels_at_most=1.20) in plan
    assert Comparison("generate", Model("product"), none) in plan
    copy = Model("resonance", compiled_masks=True, copy="granularity")
    assert Comparison("train", copy, compiled_masks, at_most=1.10) in plan
    assert all(c.numerator != c.denominator for c in plan) and len(set(plan)) == len(plan)
    assert not any(c.numerator.mask in ("scope", "product", "mean") for c in plan if c.part == "train")
    assert not any(m.compiled_masks for c in plan for m in (c.numerator, c.denominator) if m.mask in ("none", BART))
    config = copy.build(quick=True).config
    assert config.compile_granularity_masks is True and config.copy_mechanism == "granularity"
    assert speed.parse_args([]).masks == ["eager"] and speed.parse_args(["--device", "cuda"]).masks == ["compiled"]


def test_the_kernel_count_is_one_per_kernel_a_function_launches_by_hand():
    """Views, a conversion to the same dtype and dropout in eval mode launch nothing; `linear` is its GEMM, a
    `masked_fill` its copy and its fill, `contiguous` of a transposed view a copy."""
    x, w, b, mask = torch.randn(8, 16), torch.randn(8, 16), torch.randn(8), torch.rand(2, 32) > 0.5

    def f():
        h = torch.nn.functional.linear(x, w, b).view(2, 4, 8).transpose(1, 2).contiguous()  # 1 + 1
        h = torch.nn.functional.dropout(h.to(torch.float32).reshape(2, 32), 0.5, training=False)  # 0
        return h.masked_fill(mask, 0.0).softmax(-1).sum()  # 2 + 1 + 1

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        f()
    assert speed.kernels(prof.events(), CPU) == 6


class DispatchCount(TorchDispatchMode):
    """A second way to count: the aten ops the dispatcher hands to a backend (below autograd and implicit composite
    ops), less views and what speed.py counts as launching nothing. It sees an op made of kernels of its own
    (`masked_fill`: a copy and a fill; `_safe_softmax`: softmax, isneginf, all, where) once."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += not func.is_view and func.overloadpacket.__name__ not in speed.NOT_LAUNCHED
        return func(*args, **(kwargs or {}))


def test_the_kernel_counts_grow_with_what_ga_adds_and_match_a_direct_and_a_dispatcher_count(quick_run):
    """GA adds kernels to none, product to resonance, a copy gate to its mask; a decoding step is a fraction of beam
    search's per-token count. BART's training step counts as the same model profiled here, and no fewer than the ops
    the dispatcher runs, nor more than the kernels that some of them are made of add (a tenth here)."""
    counts = quick_run["results"]["kernels"]
    train = {name: counts[f"L8/train/{name}"]["total"] for name in ("none", "resonance", "product", "bart")}
    assert train["none"] < train["resonance"] < train["product"]
    assert counts["L8/train/resonance (copy=learned)"]["total"] > train["resonance"]
    step = {name: counts[f"L8/generate/{name}"]["step"] for name in ("none", "product", "bart")}
    assert step["none"] < step["product"] and step["bart"] < counts["L8/generate/bart"]["generate_per_token"]

    model = Model(BART).build(quick=True).train()
    source, labels = (speed.random_ids(model.config, 4, 8, seed, CPU) for seed in (0, 1))  # the quick run's batch
    batch = {"input_ids": source, "attention_mask": torch.ones_like(source), "labels": labels}
    model(**batch).loss.backward()  # warm-up
    model.zero_grad(set_to_none=True)  # as after an optimizer step: the next gradients are stored, not added
    with profile(activities=[ProfilerActivity.CPU]) as forward:
        loss = model(**batch).loss
    with profile(activities=[ProfilerActivity.CPU]) as backward:
        loss.backward()
    direct = {"forward": speed.kernels(forward.events(), CPU), "backward": speed.kernels(backward.events(), CPU)}
    assert direct == {half: counts["L8/train/bart"][half] for half in direct}
    with DispatchCount() as dispatched:
        model(**batch)
    assert dispatched.ops <= direct["forward"] <= 1.15 * dispatched.ops


@needs_a_compiler
def test_inductor_cpu_kernels_are_counted_one_per_generated_loop():
    """With inductor's kernel profile on (speed.py turns it on for CPU), a compiled function's generated C++ loops
    are profiler ranges: each counts once, as do the extern GEMMs, and what runs inside them not at all."""

    def f(x, w):
        return ((x @ w) + 1).relu() * 2 - x.sum()  # mm, then one fused loop; eager: mm, add, relu, mul, sum, sub

    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        compiled = torch.compile(f, backend="inductor", fullgraph=True)
        x, w = torch.randn(8, 8), torch.randn(8, 8)
        compiled(x, w)
        counts = {}
        for name, call in (("compiled", compiled), ("eager", f)):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                call(x, w)
            counts[name] = speed.kernels(prof.events(), CPU)
    assert counts == {"compiled": 2, "eager": 6}


@needs_a_compiler
def test_masks_compiled_alone_launch_fewer_kernels_than_aten_masks_and_more_than_none():
    """What a CUDA user gets by default, counted on a CPU: resonance with `compile_granularity_masks=True` fuses its
    masks into inductor's kernels, so its training step launches fewer kernels than with aten masks, and more than
    `none`'s (the granularity heads)."""
    args = speed.parse_args(["--quick"])
    counts = {}
    torch._dynamo.reset()  # the masks compile anew, with the kernel profile on
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        for model in (Model(), Model("resonance"), Model("resonance", compiled_masks=True)):
            step = speed.workload(model, model.build(quick=True), "train", 2, 8, 8, args)
            counts[model.label] = speed.count_kernels(step, "train", 8, CPU)["total"]
    assert counts["none"] < counts["resonance (compiled_masks=True)"] < counts["resonance"]


@pytest.mark.slow
@pytest.mark.serial
def test_a_quick_augment_run_measures_every_comparison(tmp_path, capsys):
    """`benchmarks/augment.py --quick`: every comparison measured (finite, positive), the targets judged, the compiled
    call's warm-up timed, the JSON written and report.py's table printed from it. The compiled call's rounds run with
    recompilation forbidden, so the warm-up compiled every batch shape they decode. No timing is asserted: a tiny
    model on a shared machine."""
    import augment

    out = tmp_path / "augment-quick.json"
    with contextlib.redirect_stderr(io.StringIO()):
        augment.main(["--quick", "--out", str(out)])
    results = json.loads(out.read_text())
    assert set(results["comparisons"]) == {
        "augment / paraphrase --input", "batch size 16 / 4", "inference_mode / no_grad",
        "static cache / dynamic cache", "compiled static cache / dynamic cache", "2 processes / 1 process",
        "default call / plain beam search", "peak memory, large / small input",
    }  # fmt: skip
    for name, judged in results["comparisons"].items():
        assert math.isfinite(judged["value"]) and judged["value"] > 0, name
    assert {name for name, judged in results["comparisons"].items() if "target" in judged} == set(augment.TARGETS)
    assert set(results["peak_memory_mib"]) == {"1,000 rows", "100,000 rows"}
    assert results["compile_seconds"] > 0 and "benchmarks/augment.py --quick" in results["command"]
    capsys.readouterr()
    report.main([str(out)])
    assert "| 2 processes / 1 process |" in capsys.readouterr().out


def test_an_augment_part_not_run_is_absent_from_the_comparisons_and_the_table(capsys):
    """`--parts processes` (or `memory`) alone: only that part's comparison, its target judged, and report.py's table
    of it; the parts not run leave no row, NaN or missing key behind."""
    import augment

    assert augment.parse_args([]).parts == ["in-process", "processes", "memory"]
    args = augment.parse_args(["--quick", "--parts", "processes"])
    rates = {"1 process": [2.0, 4.0], "2 processes": [3.0, 8.0]}
    judged = augment.comparisons(args, rates, {})
    assert judged == {"2 processes / 1 process": {"value": 1.75, "per_round": [1.5, 2.0], "target": ">= 1.8",
                                                  "passed": False}}  # fmt: skip
    memory = augment.comparisons(augment.parse_args(["--quick", "--parts", "memory"]), {}, {"1,000 rows": 100,
                                 "100,000 rows": 120})  # fmt: skip
    assert memory == {"peak memory, large / small input": {"value": 1.2, "per_round": [1.2], "target": "<= 1.3",
                                                           "passed": True}}  # fmt: skip
    capsys.readouterr()
    report.augment([{"comparisons": judged, "sentences_per_second": rates}, {"comparisons": memory,
                    "sentences_per_second": {}}])  # fmt: skip
    table = capsys.readouterr().out
    assert "| 2 processes / 1 process | 1.75 | >= 1.8 | MISS |" in table
    assert "| peak memory, large / small input | 1.20 | <= 1.3 | PASS |" in table
    assert "augment / paraphrase --input" not in table and "nan" not in table.lower()
