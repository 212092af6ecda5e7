"""A Hugging Face Space for a C-DNPG checkpoint: the page of `cdnpg demo` (cdnpg/demo.py).

cdnpg is installed from the wheel that requirements.txt names (docs/demo.md builds it into this folder). The model is
the environment variable CDNPG_MODEL: a Hub id such as owner/name, or a folder, read from this folder when relative.
Spaces set GRADIO_SERVER_NAME and GRADIO_SERVER_PORT, which launch() reads; so can a local run.
"""

import os
import sys
from pathlib import Path

from cdnpg.demo import build_app, load_demo
from cdnpg.errors import InputError

MODEL = os.environ.get("CDNPG_MODEL", "").strip()
if not MODEL:
    sys.exit("app.py: set the environment variable CDNPG_MODEL to a C-DNPG checkpoint (a Hub id owner/name)")
if (here := Path(__file__).resolve().parent / MODEL).is_dir():  # a folder beside app.py, wherever it is run from
    MODEL = str(here)
try:
    # the checkpoint's own model code is the wheel's (imported above); remote code covers a checkpoint saved by
    # another version of it
    demo = build_app(load_demo(MODEL, device=os.environ.get("CDNPG_DEVICE", "auto"), trust_remote_code=True))
except InputError as err:
    sys.exit(f"app.py: {err}")

if __name__ == "__main__":
    demo.launch(ssr_mode=False)
