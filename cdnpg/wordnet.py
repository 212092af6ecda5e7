"""Install WordNet 3.0 for NLTK from Debian's packages, without NLTK's downloader.

METEOR (``nltk.translate.meteor_score``) needs WordNet for its synonym stage, and ``nltk.download("wordnet")``
needs internet access that CI and the training machines do not have. Debian ships the same Princeton WordNet 3.0
database in two packages::

    apt-get install -y --no-install-recommends wordnet-base wordnet-sense-index

``wordnet-base`` provides ``/usr/share/wordnet/{data,index}.{noun,verb,adj,adv}``, the ``*.exc`` morphology
exception lists and ``cntlist.rev``; ``wordnet-sense-index`` provides ``index.sense``. NLTK's reader additionally
wants ``lexnames`` (lexicographer file number -> name), which Debian does not install because its C library has the
table compiled in. The table is documented in ``lexnames(5WN)`` (shipped by ``wordnet-base``); it is embedded below
and, when that man page is present, checked against it.

The script lays the files out as ``<target>/corpora/wordnet/`` (NLTK's corpus layout). The default target is
``sys.prefix/nltk_data``, i.e. inside the active virtualenv, which is on NLTK's default search path. Running it again
is a no-op when everything is already in place. It finishes by loading WordNet with the reader METEOR's scoring uses
(``WORDNET``, NLTK's reader less a map that WordNet 3.0 does not need) and checking that METEOR gives credit for a
WordNet synonym.

The English WordNet reader does not need the Open Multilingual Wordnet (``omw-1.4``/``omw-2.0``): NLTK loads it lazily
and only for ``lang != "eng"``, which neither METEOR nor this project uses.

Usage (the same from a source checkout or an installed wheel)::

    cdnpg install-wordnet [--target DIR] [--source /usr/share/wordnet]
    python training/install_wordnet.py [--target DIR] [--source /usr/share/wordnet]   # a checkout, as setup.sh does

The files (about 36 MB) are copied, not symlinked: NLTK 3.10's corpus reader refuses paths that resolve outside the
corpus root ("Security Violation ... escapes root"), so links into /usr/share/wordnet would not load.
"""

from __future__ import annotations

import argparse
import filecmp
import gzip
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import nltk
from nltk.corpus import CorpusReader, LazyCorpusLoader
from nltk.corpus.reader.wordnet import WordNetCorpusReader
from nltk.data import FileSystemPathPointer
from nltk.translate.meteor_score import meteor_score

logger = logging.getLogger("install_wordnet")

APT_COMMAND = "apt-get install -y --no-install-recommends wordnet-base wordnet-sense-index"
DEFAULT_SOURCE = Path("/usr/share/wordnet")
LEXNAMES_MAN_PAGE = Path("/usr/share/man/man5/lexnames.5WN.gz")
DEBIAN_COPYRIGHT = Path("/usr/share/doc/wordnet-base/copyright")

# Files NLTK's WordNetCorpusReader opens (``WordNetCorpusReader._FILES``), minus ``lexnames`` which is generated.
DATABASE_FILES = (
    "cntlist.rev",
    "index.sense",
    "index.adj",
    "index.adv",
    "index.noun",
    "index.verb",
    "data.adj",
    "data.adv",
    "data.noun",
    "data.verb",
    "adj.exc",
    "adv.exc",
    "noun.exc",
    "verb.exc",
)

# WordNet 3.0 lexicographer files, as tabulated in lexnames(5WN): (file number, name). The syntactic category
# (1 noun, 2 verb, 3 adjective, 4 adverb) follows from the name's prefix, as the man page explains.
LEXNAMES = (
    (0, "adj.all"),
    (1, "adj.pert"),
    (2, "adv.all"),
    (3, "noun.Tops"),
    (4, "noun.act"),
    (5, "noun.animal"),
    (6, "noun.artifact"),
    (7, "noun.attribute"),
    (8, "noun.body"),
    (9, "noun.cognition"),
    (10, "noun.communication"),
    (11, "noun.event"),
    (12, "noun.feeling"),
    (13, "noun.food"),
    (14, "noun.group"),
    (15, "noun.location"),
    (16, "noun.motive"),
    (17, "noun.object"),
    (18, "noun.person"),
    (19, "noun.phenomenon"),
    (20, "noun.plant"),
    (21, "noun.possession"),
    (22, "noun.process"),
    (23, "noun.quantity"),
    (24, "noun.relation"),
    (25, "noun.shape"),
    (26, "noun.state"),
    (27, "noun.substance"),
    (28, "noun.time"),
    (29, "verb.body"),
    (30, "verb.change"),
    (31, "verb.cognition"),
    (32, "verb.communication"),
    (33, "verb.competition"),
    (34, "verb.consumption"),
    (35, "verb.contact"),
    (36, "verb.creation"),
    (37, "verb.emotion"),
    (38, "verb.motion"),
    (39, "verb.perception"),
    (40, "verb.possession"),
    (41, "verb.social"),
    (42, "verb.stative"),
    (43, "verb.weather"),
    (44, "adj.ppl"),
)
SYNTACTIC_CATEGORY = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}


class InstallError(RuntimeError):
    """Raised when WordNet cannot be installed; the message says what to do."""


def lexnames_text() -> str:
    """Render the ``lexnames`` file in WordNet's format: ``NN<TAB>name<TAB>category``, one line per file."""
    lines = [f"{number:02d}\t{name}\t{SYNTACTIC_CATEGORY[name.split('.')[0]]}" for number, name in LEXNAMES]
    return "\n".join(lines) + "\n"


def check_lexnames_against_man_page(man_page: Path = LEXNAMES_MAN_PAGE) -> bool:
    """Compare the embedded table with Debian's lexnames(5WN) page; return False when the page is not installed.

    Docker images often drop man pages, so a missing page is not an error; a different table is.
    """
    if not man_page.is_file():
        return False
    with gzip.open(man_page, "rt", encoding="utf-8", errors="replace") as handle:
        rows = [re.match(r"^(\d\d)\t(\S+)", line) for line in handle]
    documented = tuple((int(m.group(1)), m.group(2)) for m in rows if m)
    if documented != LEXNAMES:
        raise InstallError(f"The embedded lexnames table differs from {man_page}: {documented!r}")
    return True


def default_target() -> Path:
    """``sys.prefix/nltk_data``: inside the active virtualenv and on NLTK's default search path."""
    return Path(sys.prefix) / "nltk_data"


def _install_file(source: Path, destination: Path) -> bool:
    """Copy one file unless an identical copy is there; return True when something changed.

    The copy goes through a temporary file and ``os.replace`` so an interrupted run never leaves a truncated file.
    """
    if destination.is_symlink():
        destination.unlink()
    if (
        destination.is_file()
        and filecmp.cmp(source, destination, shallow=False)
        and destination.stat().st_mode == source.stat().st_mode
    ):
        return False
    with tempfile.NamedTemporaryFile(dir=destination.parent, delete=False) as handle:
        temporary = Path(handle.name)
    shutil.copyfile(source, temporary)
    shutil.copymode(source, temporary)
    os.replace(temporary, destination)
    return True


def _write_text(destination: Path, text: str) -> bool:
    """Write ``text`` unless the file already holds it; return True when something changed."""
    if destination.is_file() and not destination.is_symlink() and destination.read_text(encoding="utf-8") == text:
        return False
    if destination.is_symlink():
        destination.unlink()
    destination.write_text(text, encoding="utf-8")
    return True


def install(target: Path, source: Path = DEFAULT_SOURCE) -> Path:
    """Lay out the Debian WordNet files as ``<target>/corpora/wordnet`` and return that directory."""
    missing = [name for name in DATABASE_FILES if not (source / name).is_file()]
    if missing:
        raise InstallError(
            f"WordNet database files are missing from {source}: {', '.join(missing)}.\n"
            f"Install Debian's WordNet 3.0 packages first (as root):\n    {APT_COMMAND}"
        )
    if check_lexnames_against_man_page():
        logger.info("lexnames table matches %s", LEXNAMES_MAN_PAGE)
    corpus_dir = target / "corpora" / "wordnet"
    corpus_dir.mkdir(parents=True, exist_ok=True)
    changed = [name for name in DATABASE_FILES if _install_file(source / name, corpus_dir / name)]
    if _write_text(corpus_dir / "lexnames", lexnames_text()):
        changed.append("lexnames")
    # The Princeton licence asks for the notice to travel with the database; NLTK exposes it as wordnet.license().
    if DEBIAN_COPYRIGHT.is_file() and _install_file(DEBIAN_COPYRIGHT, corpus_dir / "LICENSE"):
        changed.append("LICENSE")
    if changed:
        logger.info("Installed %s into %s", ", ".join(changed), corpus_dir)
    else:
        logger.info("WordNet already installed in %s; nothing to do", corpus_dir)
    return corpus_dir


class WordNet30Reader(WordNetCorpusReader):
    """NLTK's WordNet reader, loaded in under half of its time:

    - less the map from WordNet 3.0 to the loaded WordNet when the loaded one is 3.0. NLTK 3.10 builds that map at
      every load, also for 3.0 itself, where it is the identity (it compares the loaded version with the corpus name
      "wordnet"): two passes over index.sense. The map serves only the Open Multilingual Wordnet's languages; METEOR
      reads English synsets;
    - the files a load reads from start to end (`SEQUENTIAL`: the lemma index and the exception lists, 180,000
      lines) through Python's own buffered reader, where NLTK's seekable stream decodes each line in Python. The data
      files, which NLTK seeks in by byte offset, stay NLTK's."""

    SEQUENTIAL = frozenset(name for pos in ("noun", "verb", "adj", "adv") for name in (f"index.{pos}", f"{pos}.exc"))

    def map_wn(self, version: str = "wordnet"):
        return None if version == "wordnet" and self.get_version() == "3.0" else super().map_wn(version)

    def open(self, file: str):
        if file in self.SEQUENTIAL and isinstance(self.root, FileSystemPathPointer):  # not a zipped corpus
            return open(self.root.join(file), encoding=self.encoding(file))
        return super().open(file)


# `nltk.corpus.wordnet` with the reader above, which METEOR's scoring reads (cdnpg.training.paraphrase_metrics): the
# corpus and its multilingual data found as NLTK finds them
WORDNET = LazyCorpusLoader(
    "wordnet", WordNet30Reader, LazyCorpusLoader("omw-2.0", CorpusReader, r".*/wn-data-.*\.tab", encoding="utf8")
)


def verify(target: Path) -> None:
    """Load WordNet from ``target`` with the reader METEOR's scoring uses (`WORDNET`) and check the lookups METEOR
    relies on."""
    if str(target) not in nltk.data.path:
        nltk.data.path.insert(0, str(target))
    dogs = {synset.name() for synset in WORDNET.synsets("dog")}
    if "dog.n.01" not in dogs:
        raise InstallError(f"WordNet loaded from {target} but synsets('dog') lacks dog.n.01: {sorted(dogs)}")
    # NLTK runs the synonym stage on Porter stems, so the pair must survive stemming unchanged: car/auto do.
    reference = ["the", "car", "is", "fast"]
    synonym = meteor_score([reference], ["the", "auto", "is", "fast"], wordnet=WORDNET)
    unrelated = meteor_score([reference], ["the", "banana", "is", "fast"], wordnet=WORDNET)
    if not synonym > unrelated:
        raise InstallError(f"METEOR gave no synonym credit (car/auto {synonym:.4f} vs car/banana {unrelated:.4f})")
    logger.info(
        "Verified WordNet %s: %d synsets for 'dog'; METEOR car/auto %.4f > car/banana %.4f",
        WORDNET.get_version(),
        len(dogs),
        synonym,
        unrelated,
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="cdnpg install-wordnet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=default_target(), help="NLTK data dir (default: %(default)s)")
    parser.add_argument(
        "--source", type=Path, default=DEFAULT_SOURCE, help="Debian WordNet dir (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    target = args.target.resolve()
    on_search_path = any(Path(path).resolve() == target for path in nltk.data.path)
    try:
        install(target, args.source)
        verify(target)
    except InstallError as error:
        logger.error("%s", error)
        return 1
    if not on_search_path:
        logger.warning("%s is not on NLTK's default search path; set NLTK_DATA=%s when running METEOR", target, target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
