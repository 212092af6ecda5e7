"""Runs `cdnpg.training.main()` (training/run.py) with test-only callbacks, for the resume and multi-process tests.

    python tests/run_probe.py [--kill_after_step N | --wait_after_step N] RUN_PY_ARGS...

--kill_after_step N ends the process abruptly (os._exit) right after the checkpoint of step N is written, as a
killed job would. --wait_after_step N waits there instead, after writing `waiting-after-step-N` to the output
directory, so that a test can interrupt training at a known step. At the end of training every process writes
`weights-rank{R}.json` (`weights_digest` of its parameters, and the graphs and graph breaks torch.compile counted in
it) to the output directory, so that a test can check that all ranks hold identical weights, that a saved model loads
with them, and that a rank trained compiled.
"""

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from cdnpg.startup import long_lived_imports

with long_lived_imports():  # as training/run.py imports them
    from transformers import TrainerCallback

    from cdnpg.training import main, one_line_errors


class StopAfterSave(TrainerCallback):
    """At the checkpoint of `step`: end the process abruptly (`wait=False`), or wait to be interrupted."""

    def __init__(self, step: int, wait: bool):
        self.step, self.wait = step, wait

    def on_save(self, args, state, control, **kwargs):
        if state.global_step != self.step:
            return
        if not self.wait:
            os._exit(17)
        (Path(args.output_dir) / f"waiting-after-step-{self.step}").write_text("")
        time.sleep(600)


def weights_digest(model) -> str:
    """sha256 of every parameter, each once under its first name (a tied weight has several): the same for a model
    in training, under FSDP, and loaded from what it saved."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.named_parameters()):
        if hasattr(tensor, "full_tensor"):  # FSDP2 shards parameters as DTensors: every rank gathers all
            tensor = tensor.full_tensor()
        digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class WeightDigest(TrainerCallback):
    def on_train_end(self, args, state, control, model=None, **kwargs):
        from torch._dynamo.utils import counters  # what this process compiled (--torch_compile), 0 without it

        rank = args.process_index
        record = {"sha256": weights_digest(model), "graphs": counters["stats"]["unique_graphs"]}
        record["graph_breaks"] = dict(counters["graph_break"])
        (Path(args.output_dir) / f"weights-rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    argv = sys.argv[1:]
    callbacks = [WeightDigest()]
    if argv[:1] in (["--kill_after_step"], ["--wait_after_step"]):
        callbacks.append(StopAfterSave(int(argv[1]), wait=argv[0] == "--wait_after_step"))
        argv = argv[2:]
    with one_line_errors():
        main(argv, callbacks=callbacks)
