"""Install WordNet 3.0 for NLTK (METEOR) from Debian's packages: `cdnpg.wordnet`, kept here for scripts/setup.sh.

    python training/install_wordnet.py [--target DIR] [--source /usr/share/wordnet]

An installed package has the same as `cdnpg install-wordnet`.
"""

import sys

from cdnpg.wordnet import main

if __name__ == "__main__":
    sys.exit(main())
