"""Checks of the launch and the hardware before training: processes launched together must train together, and
--bf16 on a CPU that emulates bfloat16 gets one line saying what it costs."""

import logging
import os
from pathlib import Path

from cdnpg.training.arguments import CDNPGTrainingArguments, UsageError

logger = logging.getLogger("cdnpg.training")


def check_distributed_launch(args: CDNPGTrainingArguments) -> None:
    """Processes that a launcher started together must train together. accelerate turns FSDP and multi-GPU configs
    into unconnected single processes where there is no GPU: each would train the whole model on all the data and
    write the same files as the others."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and args.world_size == 1:
        raise UsageError(
            f"{launched} processes were launched but run as {launched} separate single-process runs writing to the "
            "same output_dir. Without GPUs accelerate runs only DDP on CPUs: launch with "
            "--config_file training/configs/accelerate/ddp.yaml (or --multi_gpu --use_cpu true); FSDP needs GPUs"
        )


# Measured (issue 28): minilm_quora.yaml on an AVX2-only AMD EPYC, 38.7 s per step with --bf16, 2.6 s without
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
