"""Checks of the launch and the hardware before training: processes launched together must train together, the
strategy that trains is the one the accelerate config asked for, --bf16 on a CPU that emulates bfloat16 gets one line
saying what it costs, and training on a busy CPU uses only the cores that are free."""

import logging
import os
import statistics
import time
from pathlib import Path

import torch
from accelerate.utils import DistributedType

from cdnpg.training.arguments import CDNPGTrainingArguments, UsageError

logger = logging.getLogger("cdnpg.training")


def unconnected_processes(num_processes: int) -> int:
    """How many processes a launcher started together (its WORLD_SIZE) when they run as `num_processes` = 1 unconnected
    ones, each doing all the work; 0 when they are connected, or when one process was started."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    return launched if launched > 1 and num_processes == 1 else 0


def check_distributed_launch(args: CDNPGTrainingArguments) -> None:
    """Processes that a launcher started together must train together. accelerate turns FSDP and multi-GPU configs
    into unconnected single processes where there is no GPU: each would train the whole model on all the data and
    write the same files as the others."""
    if launched := unconnected_processes(args.world_size):
        raise UsageError(
            f"{launched} processes were launched but run as {launched} separate single-process runs writing to the "
            "same output_dir. Without GPUs accelerate runs only DDP on CPUs: launch with "
            "--config_file training/configs/accelerate/ddp.yaml (or --multi_gpu --use_cpu true); FSDP needs GPUs"
        )


def distributed_strategy(accelerator) -> str:
    """How accelerate set up this run's processes, as the log and the model card name it."""
    if accelerator.distributed_type == DistributedType.FSDP:
        return f"FSDP{accelerator.state.fsdp_plugin.fsdp_version}"
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        return "DeepSpeed"
    return "DDP" if accelerator.num_processes > 1 else "one process"


def requested_strategy() -> str | None:
    """What the accelerate config asked for, as `accelerate launch` tells the processes it starts."""
    for variable, strategy in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")):
        if os.environ.get(variable, "false").lower() == "true":
            return strategy
    return None


def report_strategy(accelerator) -> None:
    """Say which strategy trains, and warn when the config asked for another: accelerate 1.15 sets FSDP up on GPUs
    only, and trains an FSDP config with --use_cpu true as plain DDP without a word."""
    ran, asked = distributed_strategy(accelerator), requested_strategy()
    processes = accelerator.num_processes
    logger.info("Distributed strategy: %s (%d process%s)", ran, processes, "es" if processes > 1 else "")
    if asked and not ran.startswith(asked) and accelerator.is_main_process:
        logger.warning(
            "The accelerate config asks for %s, but these %d processes train as %s%s",
            asked,
            processes,
            ran,
            " (a full copy of the model in each, nothing sharded): accelerate sets up FSDP on GPUs only"
            if accelerator.device.type == "cpu"
            else "",
        )


# minilm_quora.yaml on an AVX2-only AMD EPYC: 38.7 s per step with --bf16, 2.6 s without
BF16_EMULATION_COST = "about 15x slower than without (38.7 s against 2.6 s per step of minilm_quora.yaml)"


def native_bfloat16_cpu(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU computes bfloat16 natively: the AVX512-BF16 or AMX instructions (x86), or Arm's bf16, as the
    kernel lists its flags in /proc/cpuinfo (or the `cpuinfo` text given). None where they cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"}) if flags else None


def check_bf16_on_cpu(args: CDNPGTrainingArguments, cpuinfo: str | None = None) -> None:
    """One line before training when --bf16 runs on a CPU that emulates bfloat16: it trains, but many times slower."""
    if args.bf16 and args.device.type == "cpu" and native_bfloat16_cpu(cpuinfo) is False:
        logger.warning(
            "--bf16 on a CPU without native bfloat16 (no AVX512-BF16 or AMX): torch emulates it, %s. Drop --bf16 "
            "(or bf16: true in the recipe) to train in fp32 at full speed.",
            BF16_EMULATION_COST,
        )


# -- Threads on a busy CPU ---------------------------------------------------------------------------------------------
# torch runs each operation on one OpenMP thread per core, and every thread waits (spinning) for the others at the end
# of each operation: where another process holds a core, each operation waits for the thread that shares it, and a
# step takes several times longer than on fewer threads.

THREAD_SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # a user's (or launcher's) choice, always kept
LOAD_SAMPLES = 10  # reads of the running threads, 20 ms apart: the median ignores a process that ran only for a moment


def running_threads(proc: Path, pid: int, nice: int) -> int:
    """Threads of processes other than `pid` that are running or waiting for a core (state R) at niceness `nice` or
    less: the ones that hold a core against this process. A thread of a lower priority (higher niceness) yields its
    core, and this process's own threads (its OpenMP workers among them) are what the count is for."""
    count = 0
    for stat in proc.glob("[0-9]*/task/[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except (OSError, IndexError):
            continue  # ended while being read
        state, niceness = fields[0], int(fields[16])  # fields 3 and 19 of proc(5)'s /proc/[pid]/stat
        count += state == "R" and niceness <= nice and int(stat.parts[-4]) != pid
    return count


def busy_cores(samples: int = LOAD_SAMPLES, proc: Path = Path("/proc")) -> int | None:
    """How many cores other processes keep busy now: the median of `samples` counts of `running_threads`. None
    where /proc cannot tell (not Linux)."""
    if not (proc / "self" / "stat").is_file():
        return None
    pid, nice = os.getpid(), os.nice(0)
    counts = []
    for sample in range(samples):
        counts.append(running_threads(proc, pid, nice))
        if sample + 1 < samples:
            time.sleep(0.02)
    return round(statistics.median(counts))


def cpu_threads(default: int, cores: int, busy: int | None) -> int:
    """Threads to train on: torch's `default`, less one for each of this machine's `cores` that other processes keep
    busy (`busy`: None when unknown), and at least one. Never more than the default: on an idle machine it is the
    default."""
    if busy is None:
        return default
    return max(1, min(default, cores - busy))


def choose_cpu_threads(args: CDNPGTrainingArguments) -> None:
    """On a CPU, train on the cores other processes leave free (`cpu_threads`), saying so in one line when that is
    fewer than torch's default; OMP_NUM_THREADS or MKL_NUM_THREADS, when set, decide instead."""
    if args.device.type != "cpu" or any(name in os.environ for name in THREAD_SETTINGS):
        return
    busy = busy_cores()
    if busy is None:
        return
    default, cores = torch.get_num_threads(), len(os.sched_getaffinity(0))  # Linux, as busy_cores
    threads = cpu_threads(default, cores, busy)
    if threads < default:
        logger.warning(
            "other processes keep %d of %d cores busy: training on %d thread%s (OMP_NUM_THREADS chooses)",
            min(busy, cores), cores, threads, "s" if threads > 1 else "",
        )  # fmt: skip
        torch.set_num_threads(threads)
