"""A Hugging Face Space for a C-DNPG checkpoint: the page of `cdnpg demo` (cdnpg/demo.py).

The model is the environment variable CDNPG_MODEL (a Hub id such as owner/name, or a folder), set in the Space's
settings as a variable. The `cdnpg`, `modeling_cdnpg` and `configuration_cdnpg` packages sit beside this file
(docs/demo.md says how to copy them in). Spaces sets GRADIO_SERVER_NAME and GRADIO_SERVER_PORT, which launch() reads.
"""

import os
import sys

from cdnpg.demo import build_app, load_demo
from cdnpg.errors import InputError

MODEL = os.environ.get("CDNPG_MODEL", "").strip()
if not MODEL:
    sys.exit("app.py: set the environment variable CDNPG_MODEL to a C-DNPG checkpoint (a Hub id owner/name)")
try:
    # the checkpoint's own model code is this package's (imported above); remote code covers a checkpoint saved by
    # another version of it
    demo = build_app(load_demo(MODEL, device=os.environ.get("CDNPG_DEVICE", "auto"), trust_remote_code=True))
except InputError as err:
    sys.exit(f"app.py: {err}")

if __name__ == "__main__":
    demo.launch(ssr_mode=False)
