"""How training/run.py and the `cdnpg` commands that load a model import torch, transformers and the rest: about
450,000 objects that live as long as the process. CPython's garbage collector would go through them again and again
while they are imported, and at every full collection afterwards, which on 2 CPU cores is about a third of the CPU
time of a short training run. This module imports nothing heavy, so that an entry point can use it before torch is
loaded."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def long_lived_imports() -> Iterator[None]:
    """Run the block (the entry point's imports) with the garbage collector paused, then freeze every object that
    exists, so that later collections leave them out (`gc.freeze`); collection goes on as before for what follows."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
