"""`python -m cdnpg.data OUT_DIR` writes the template corpus as train/valid/test JSONL files (default data/template)."""

import logging
import sys

from cdnpg.data import write_template_corpus

logging.basicConfig(level=logging.INFO)
for split, path in write_template_corpus(sys.argv[1] if len(sys.argv) > 1 else "data/template").items():
    logging.getLogger("cdnpg.data").info("wrote %s to %s", split, path)
