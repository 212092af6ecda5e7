"""`python -m cdnpg ...` is the `cdnpg` command, and `accelerate launch -m cdnpg augment ...` runs it on N
processes."""

import sys

from cdnpg.cli import main

if __name__ == "__main__":
    sys.exit(main())
