"""`benchmarks/speed.py --quick` runs end to end and writes every ratio, also for a subset of --variants; a failure
keeps what was measured; report.py prints its table and draws its figure; `--profile` labels the granularity heads
and attention modules; the kernel counts match a direct profiler count and what the masks add. No timing is asserted: the ratios of a tiny model on a shared machine say nothing; the
full benchmark and its reading are in docs/speed.md."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest.mock import patch

import pytest
import torch
import torch._inductor.config
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from configuration_cdnpg import COPY_MECHANISMS

ROOT = Path(__file__).resolve().parents[1]
GATES = COPY_MECHANISMS[1:]  # learned, granularity


def speed(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "speed.py"), "--quick", "--compile-backend", "eager", *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,  # about a minute on an idle CPU; dynamo's "eager" backend spares inductor's C++ compilation
    )


def test_speed_quick_writes_every_ratio(tmp_path):
    out = tmp_path / "quick.json"
    completed = speed(tmp_path, "--out", str(out))
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "PASS" in completed.stdout or "MISS" in completed.stdout  # the table was printed

    results = json.loads(out.read_text())
    expected = results["expected_ratio_keys"]
    lengths = results["options"]["seq_lens"]
    for length in lengths:  # every comparison is present at every length
        for name in ("train/product_vs_none", "train/none_vs_bart", "gen/product_nocache_vs_cache"):
            assert f"L{length}/{name}" in expected
    for variant in ("resonance", "scope", "product", "mean"):
        assert f"L{lengths[0]}/train/{variant}_vs_none" in expected
    assert any("sdpa_vs_eager" in key for key in expected)
    for name in (
        "gen/product_static_compiled_vs_dynamic",
        "gen/product_static_compiled_vs_bart",
        "forward/product_flex_vs_sdpa",
        "train/warm_resonance_vs_bart",
    ):
        assert f"L{lengths[0]}/{name}" in expected

    assert set(results["ratios"]) == set(expected)
    for key in expected:
        ratio = results["ratios"][key]
        assert all(math.isfinite(value) and value > 0 for value in [ratio["value"], *ratio["quartiles"]]), key
        assert "memory" not in ratio  # CPU memory is not measured (no public peak counter)
    assert len(results["measurements"]) >= 2 * len(expected)  # every runner, every round
    for field in ("torch", "transformers", "cpu_count", "cpu"):
        assert results["machine"][field]
    figure = tmp_path / "quick.png"
    reported = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "report.py"), str(out), "--plot", str(figure)],
        capture_output=True,
        text=True,
    )
    assert reported.returncode == 0, reported.stderr[-3000:]
    assert f"| L{lengths[0]}/train/product_vs_none |" in reported.stdout
    assert figure.read_bytes().startswith(b"\x89PNG")


def test_a_subset_of_variants_builds_what_each_comparison_needs(tmp_path):
    out = tmp_path / "r.json"
    light = ["--static-variants", "--flex-variants", "--warm-variants"]  # no compiling, no big model
    copy = ["--copy-variants", "resonance"]
    completed = speed(tmp_path, "--variants", "resonance", "scope", *light, *copy, "--out", str(out))
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results["ratios"]) == set(results["expected_ratio_keys"])
    names = {key.split("/", 1)[1] for key in results["ratios"]}
    assert {"train/resonance_vs_none", "train/scope_vs_none", "train/product_sdpa_vs_eager"} <= names
    assert {"gen/product_nocache_vs_cache", "gen/none_vs_bart_cached"} <= names
    assert "train/product_vs_none" not in names and "train/mean_vs_none" not in names
    copies = {f"train/{size}resonance_{gate}_copy_vs_resonance" for size in ("", "minilm_") for gate in GATES}
    assert copies <= names and all(results["ratios"][f"L8/{key}"]["target"] == "<= 1.1" for key in copies)
    assert "error" not in results


def test_a_failed_measurement_keeps_what_was_measured_before_it(tmp_path):
    out = tmp_path / "r.json"  # the quick model has 64 positions: 80 tokens fail, after the 8-token rounds
    flags = ["--seq-lens", "8", "80", "--parts", "train", "--warm-variants", "--out", str(out)]
    completed = speed(tmp_path, *flags)
    assert completed.returncode != 0
    results = json.loads(out.read_text())
    assert "max_position_embeddings" in results["error"] and "L8/train/none_vs_bart" in results["ratios"]
    assert not any(key.startswith("L80/") for key in results["ratios"])
    assert str(out) in completed.stderr


def test_report_averages_seeds_and_leaves_out_a_metric_a_run_could_not_compute(tmp_path):
    """novelty.py writes NaN for the high-z words of a model without z; report.py failed on two such seeds."""
    files = []
    for seed, bleu in ((0, 20.0), (1, 22.0)):
        run = {"benchmark": "novelty", "model": f"none-copy-s{seed}", "setting": "beam search", "family": "beam",
               "value": 0.0, "settings": {"split": "report", "pairs": 2},
               "metrics": {"bleu4": bleu, "ibleu": 10.0, "high_z_kept": float("nan")}}  # fmt: skip
        files.append(tmp_path / f"runs-{seed}.jsonl")
        files[-1].write_text(json.dumps(run) + "\n")
    reported = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), *map(str, files)],
                              capture_output=True, text=True)  # fmt: skip
    assert reported.returncode == 0, reported.stderr[-3000:]
    row = next(line for line in reported.stdout.splitlines() if line.startswith("| beam search"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1:4] == ["21.00 ± 1.41", "10.00 ± 0.00", "–"]  # BLEU-4, true iBLEU, self-BLEU-4 (not written)
    assert cells[7] == "–"  # high-z words kept


def test_profile_labels_granularity_heads_and_attention_through_hooks(tmp_path):
    """--profile profiles each runner once instead of timing it: a table per runner, and in --out the time of the
    labelled ranges, the granularity head's only in models that have one."""
    out = tmp_path / "profile.json"
    flags = ["--seq-lens", "8", "--parts", "train", "generate", "--variants", "product", "--eager-variants"]
    completed = speed(tmp_path, *flags, "--warm-variants", "--static-variants", "--profile", "prof", "--out", str(out))
    assert completed.returncode == 0, completed.stderr[-3000:]
    profiled = json.loads(out.read_text())["profile"]
    runners = {"train_product", "train_none", "train_bart", "generate_product-cache", "generate_product+cache",
               "generate_none+cache", "generate_bart+cache"}  # fmt: skip
    assert set(profiled) == {f"L8_{runner}" for runner in runners}
    assert all((tmp_path / "prof" / f"L8_{runner}.txt").is_file() for runner in runners)
    for runner in runners:
        ranges = {key.split(" ")[0] for key in profiled[f"L8_{runner}"]["ranges_s"]}
        if "bart" in runner:
            assert ranges == set(), runner  # transformers' BART has no C-DNPG module
        elif "product" in runner:
            assert ranges == {"cdnpg::CDNPGAttention", "cdnpg::GranularityHead"}, runner
        else:
            assert ranges == {"cdnpg::CDNPGAttention"}, runner  # "none" has no granularity head


class DispatchCount(TorchDispatchMode):
    """A second way to count kernels: the aten ops the dispatcher hands to a backend (below autograd and composite
    decompositions), less views and allocations."""

    def __init__(self, not_launched: set[str]):
        super().__init__()
        self.not_launched, self.ops = not_launched | {"_local_scalar_dense"}, 0  # .item(): no tensor, no kernel

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += not func.is_view and func.overloadpacket.__name__ not in self.not_launched
        return func(*args, **(kwargs or {}))


def test_kernel_counts_match_a_direct_count_and_grow_with_the_masks(tmp_path):
    """--kernels-only counts every runner's kernels and times nothing. BART's training counts are those of the same
    model profiled here, and within a few ops of a dispatcher-level count; GA adds kernels to "none", the copy gate
    to its mask, and a decoding step is a fraction of beam search's per-token count."""
    out = tmp_path / "k.json"
    flags = ["--seq-lens", "8", "--parts", "train", "generate", "--gen-variants", "resonance", "--static-variants"]
    completed = speed(tmp_path, *flags, "--warm-variants", "--copy-variants", "resonance", "--compiled-variants",
                      "resonance", "--kernels-only", "--out", str(out))  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["measurements"] == [] and "| L8/train/bart |" in completed.stdout
    counts = results["kernels"]
    train = {runner: counts[f"L8/train/{runner}"] for runner in ("none", "resonance", "product", "bart")}
    assert train["none"]["total"] < train["resonance"]["total"] < train["product"]["total"]
    assert counts["L8/train/copy-learned:resonance"]["total"] > train["resonance"]["total"]
    step = {runner: counts[f"L8/generate/{runner}+cache"]["step"] for runner in ("none", "resonance", "bart")}
    assert step["none"] < step["resonance"] and step["bart"] < counts["L8/generate/bart+cache"]["generate_per_token"]
    assert results["kernel_ratios"]["L8/train/resonance_vs_none"] > 1
    # the compiled training step (dynamo's eager backend here: the same aten ops, counted as eager's are)
    compiled = {runner: counts[f"L8/train/{runner}+compiled"]["total"] for runner in ("none", "resonance", "bart")}
    assert compiled["none"] < compiled["resonance"]
    assert {"L8/train/resonance_compiled_vs_eager", "L8/train/resonance_vs_none_compiled",
            "L8/train/none_vs_bart_compiled"} <= set(results["kernel_ratios"])  # fmt: skip

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import speed as bench

    model = bench.build_model("bart", bench.QUICK_MODEL).train()
    source, labels = (bench.random_ids(model.config, 4, 8, seed, "cpu") for seed in (0, 1))  # speed.py's batch at L 8
    batch = {"input_ids": source, "attention_mask": torch.ones_like(source), "labels": labels}
    model(**batch).loss.backward()  # warm-up
    model.zero_grad(set_to_none=True)  # as after an optimizer step: the next gradients are stored, not added
    with profile(activities=[ProfilerActivity.CPU]) as forward:
        loss = model(**batch).loss
    with profile(activities=[ProfilerActivity.CPU]) as backward:
        loss.backward()
    with DispatchCount(bench.NOT_LAUNCHED) as dispatched:
        model(**batch)
    direct = {"forward": bench.kernels(forward.events(), torch.device("cpu")),
              "backward": bench.kernels(backward.events(), torch.device("cpu"))}  # fmt: skip
    assert direct == {half: train["bart"][half] for half in direct}
    # where(x, scalar) is one kernel here, and two ops (the scalar's tensor) for the dispatcher
    assert abs(dispatched.ops - direct["forward"]) <= 0.05 * direct["forward"]


@pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None, reason="inductor's CPU kernels need a C++ compiler"
)
def test_inductor_cpu_kernels_are_counted_one_per_generated_loop():
    """With inductor's kernel profile on (speed.py turns it on for CPU), a compiled function's generated C++ loops
    are profiler ranges: each counts once, as do the extern GEMMs, and what runs inside them not at all."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import speed as bench

    def f(x, w):
        return ((x @ w) + 1).relu() * 2 - x.sum()  # mm, then one fused loop; eager: mm, add, relu, mul, sum, sub

    torch._dynamo.reset()
    with patch.object(torch._inductor.config.cpp, "enable_kernel_profile", True):
        compiled = torch.compile(f, backend="inductor", fullgraph=True)
        x, w = torch.randn(8, 8), torch.randn(8, 8)
        compiled(x, w)
        counts = {}
        for name, call in (("compiled", compiled), ("eager", f)):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                call(x, w)
            counts[name] = bench.kernels(prof.events(), torch.device("cpu"))
            names = [event.name for event in prof.events()]
            if name == "compiled":
                assert any(bench.INDUCTOR_CPU_KERNEL.search(n) for n in names), names
    assert counts == {"compiled": 2, "eager": 6}


def test_compiled_runners_are_compared_with_eager_and_ga_with_none_compiled_alike():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import speed as bench

    args = bench.parse_args(["--parts", "train", "generate", "--compiled-variants", "none", "resonance",
                             "--static-variants", "none", "product"])  # fmt: skip
    plan = {key: (numerator, denominator) for key, _, numerator, denominator, _ in bench.comparisons(args)}
    assert plan["train/resonance_compiled_vs_eager"] == ("resonance+compiled", "resonance")
    assert plan["train/resonance_vs_none_compiled"] == ("resonance+compiled", "none+compiled")
    assert plan["train/none_vs_bart_compiled"] == ("none+compiled", "bart+compiled")
    assert plan["gen/product_vs_none_static_compiled"] == ("product+static", "none+static")
    assert "train/none_vs_none_compiled" not in plan and "gen/none_vs_none_static_compiled" not in plan
    assert bench.model_name("resonance+compiled") == "resonance"  # a compiled wrapper of the eager runner's model


@pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None, reason="inductor's CPU kernels need a C++ compiler"
)
def test_masks_compiled_alone_are_compared_with_none_and_aten_and_launch_fewer_kernels():
    """`--fused-variants`: "fused:resonance" is resonance with config.compile_granularity_masks; its training step,
    counted as speed.py counts, launches fewer kernels than the aten masks' and more than `none`'s (the heads)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import speed as bench

    args = bench.parse_args(["--quick", "--parts", "train", "generate", "--fused-variants", "resonance",
                             "--copy-variants", "resonance"])  # fmt: skip
    plan = {key: (numerator, denominator) for key, _, numerator, denominator, _ in bench.comparisons(args)}
    assert plan["train/resonance_fused_vs_none"] == ("fused:resonance", "none")
    assert plan["train/resonance_fused_learned_copy_vs_resonance_fused"] == (
        "fused:copy-learned:resonance", "fused:resonance"
    )  # fmt: skip
    assert bench.build_model("fused:copy-learned:resonance", bench.QUICK_MODEL).config.copy_mechanism == "learned"
    assert plan["train/resonance_fused_vs_unfused"] == ("fused:resonance", "resonance")
    assert plan["gen/resonance_fused_vs_none_cached"] == ("fused:resonance+cache", "none+cache")
    assert bench.model_name("fused:resonance+cache") == "fused:resonance"
    counts = {}
    torch._dynamo.reset()  # the masks compile anew, with the kernel profile on
    with patch.object(torch._inductor.config.cpp, "enable_kernel_profile", True):
        for runner in ("none", "resonance", "fused:resonance"):
            model = bench.build_model(runner, bench.QUICK_MODEL)
            assert model.config.compile_granularity_masks is runner.startswith(bench.FUSED)
            step = bench.workload(runner, model, "train", 2, 8, 8, args)
            counts[runner] = bench.count_kernels(step, "train", 8, args.device)["total"]
    assert counts["none"] < counts["fused:resonance"] < counts["resonance"]
