"""Test-only: lets accelerate's FSDP plugin set up on CPU processes (gloo), to simulate a GPU FSDP launch.

accelerate 1.15 turns an FSDP launch into FSDP only for GPU-type devices (`AcceleratorState.__init__` lists them);
on CPU processes it runs the same config as DDP. Put this folder on PYTHONPATH of `accelerate launch` (Python imports
`sitecustomize` at start-up) and, in processes that the FSDP config launched (ACCELERATE_USE_FSDP=true), a CPU
process group becomes an FSDP one: the rest (the plugin, `fully_shard`, the Trainer's FSDP save and load) is
accelerate's and torch's own code, as on GPUs. Not covered: NCCL, device placement, mixed precision on GPUs.
Never installed with the package; user runs never import it.
"""

import os

if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    accelerate_init = AcceleratorState.__init__

    def init_with_fsdp_on_cpu(self, mixed_precision=None, cpu=False, dynamo_plugin=None, deepspeed_plugin=None,
                              fsdp_plugin=None, *args, **kwargs):  # fmt: skip
        """accelerate's own set-up, then what it does for an FSDP plugin on GPUs, done for CPU processes too."""
        accelerate_init(self, mixed_precision, cpu, dynamo_plugin, deepspeed_plugin, fsdp_plugin, *args, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU and fsdp_plugin is not None:
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            self.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = init_with_fsdp_on_cpu
