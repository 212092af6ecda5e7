"""Shared fixtures: a tiny random C-DNPG (2+2 layers, d 32) keeps every model test to seconds on a CPU; tiny trained
paraphrasers, whose next token depends on the whole prefix, for the decoding tests; and the guard that fails a test
in which our code (the project's files or the remote code of its checkpoints) makes transformers warn of a
deprecation."""

import logging
import sysconfig
import traceback
import warnings
from pathlib import Path

import pytest
import torch

from cdnpg.data import model_token_ids, save_tokenizer, template_corpus, train_wordpiece_tokenizer
from cdnpg.hub import save_checkpoint
from modeling_cdnpg import CDNPGConfig, CDNPGForConditionalGeneration
from modeling_cdnpg.modeling_cdnpg import CACHE_NAME

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MASKS = ("resonance", "scope", "product", "mean", "none")
PAD, BOS, EOS = 0, 1, 2


def tiny_config(**overrides) -> CDNPGConfig:
    fields = dict(
        vocab_size=60,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
    )
    fields.update(overrides)
    return CDNPGConfig(**fields)


def tiny_model(seed: int = 0, **overrides) -> CDNPGForConditionalGeneration:
    torch.manual_seed(seed)
    model = CDNPGForConditionalGeneration(tiny_config(**overrides))
    with torch.no_grad():  # W_G spread wider than its init, so that z really varies between tokens
        for name, param in model.named_parameters():
            if "granularity_head" in name:
                param.normal_(0, 0.5)
    return model.eval()


def cache_of(output):
    """The cache a forward or `generate()` returned, under its name in the installed transformers (`CACHE_NAME`)."""
    return getattr(output, CACHE_NAME)


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is absent")
    return SHARED


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    """One tokenizer for runs that are compared: `tokenizers` breaks frequency ties differently in each process."""
    corpus = template_corpus(num_train=256, num_valid=16, num_test=16, seed=0)["train"]
    tokenizer = train_wordpiece_tokenizer([*corpus["source"], *corpus["target"]], vocab_size=400)
    return str(save_tokenizer(tokenizer, tmp_path_factory.mktemp("tokenizer")))


# ------------------------------------------------------------------------------------------------------------------
# Tiny trained paraphrasers: what a decoding test needs
# ------------------------------------------------------------------------------------------------------------------

PARAPHRASER_STEPS = 250  # the training loss falls from 6 to about 0.2: fluent template paraphrases, seconds per mask


def train_tiny_paraphraser(
    tokenizer, granularity_mask: str, steps: int = PARAPHRASER_STEPS, seed: int = 0, **overrides
) -> CDNPGForConditionalGeneration:
    """A d 64 C-DNPG trained on 256 template-corpus pairs. A random tiny model repeats one token whatever it sees, so a
    decoder that lost its prefix (a dropped cache) decodes the same; this one writes a different word at each step,
    chosen from all the words before it."""
    corpus = template_corpus(num_train=256, num_valid=16, num_test=16, seed=0)["train"]
    sources = tokenizer(list(corpus["source"]), padding=True, return_tensors="pt")
    targets = tokenizer(list(corpus["target"]), padding=True, return_tensors="pt")
    labels = targets["input_ids"][:, 1:].masked_fill(targets["attention_mask"][:, 1:] == 0, -100)
    torch.manual_seed(seed)
    sizes = dict(d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, dropout=0.0, attention_dropout=0.0)
    config = tiny_config(**model_token_ids(tokenizer), **sizes, granularity_mask=granularity_mask, **overrides)
    model = CDNPGForConditionalGeneration(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        rows = torch.randint(0, len(corpus), (32,), generator=batches)
        loss = model(sources["input_ids"][rows], sources["attention_mask"][rows], labels=labels[rows]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.generation_config.max_new_tokens = 16
    return model.eval()


# paraphrasers with a copy mechanism: name -> (granularity mask, gate); "none" + learned is Transformer+Copy
COPYING = {"none+copy": ("none", "learned"), "resonance+copy": ("resonance", "learned"),
           "resonance+granularity copy": ("resonance", "granularity")}  # fmt: skip


@pytest.fixture(scope="session")
def paraphrasers(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    """Per granularity mask, and per copy setting of `COPYING`, a tiny trained paraphraser saved as a checkpoint
    (weights, remote code, tokenizer)."""
    from cdnpg.data import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    folder = tmp_path_factory.mktemp("paraphrasers")
    kinds = {kind: (kind, None) for kind in MASKS} | COPYING
    return {
        kind: save_checkpoint(train_tiny_paraphraser(tokenizer, mask, copy_mechanism=gate), tokenizer, folder / kind)
        for kind, (mask, gate) in kinds.items()
    }


# ------------------------------------------------------------------------------------------------------------------
# The deprecation guard
# ------------------------------------------------------------------------------------------------------------------

LIBRARIES = (sysconfig.get_paths()["stdlib"], "site-packages")  # the standard library, installed packages


def ours(filename: str) -> bool:
    """A file of this project (its virtualenvs aside), or the remote code of its checkpoints (transformers_modules)."""
    return (filename.startswith(str(ROOT)) and "site-packages" not in filename) or "transformers_modules" in filename


def library_frame(frame: traceback.FrameSummary) -> bool:
    return frame.filename.startswith("<") or any(part in frame.filename for part in LIBRARIES)


def from_our_code(frames: list[traceback.FrameSummary]) -> str | None:
    """Where our code called the library that warned: the innermost frame outside the libraries (transformers,
    torch, ..., the standard library) and this file, if it is ours."""
    for frame in reversed(frames):
        if library_frame(frame) or frame.filename == __file__:
            continue
        return f"{frame.filename}:{frame.lineno}" if ours(frame.filename) else None
    return None


def from_transformers(frames: list[traceback.FrameSummary]) -> bool:
    """Whether the innermost frame outside the warnings machinery and this file is transformers' own code."""
    for frame in reversed(frames):
        if frame.filename in (__file__, warnings.__file__):
            continue
        return f"{Path('site-packages', 'transformers')}" in frame.filename
    return False


class DeprecationGuard(logging.Handler):
    """Collects transformers' deprecation messages, logged (`logger.warning_once`) or warned (FutureWarning,
    DeprecationWarning), that our code caused: the nearest caller outside the libraries is ours."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "deprecat" in message.lower():  # a record of a transformers logger: this handler sits on theirs
            where = from_our_code(traceback.extract_stack())
            if where:
                self.found.append(f"{message} (from {where})")

    def warned(self, message, category, filename, lineno, file=None, line=None) -> None:
        if not issubclass(category, (FutureWarning, DeprecationWarning)):
            self.showwarning(message, category, filename, lineno, file, line)  # to pytest, as before
            return
        frames = traceback.extract_stack()  # the project's filters ignore the rest of these two kinds
        if "deprecat" in str(message).lower() and from_transformers(frames):
            where = from_our_code(frames)
            if where:
                self.found.append(f"{message} (from {where})")

    def __enter__(self) -> "DeprecationGuard":
        logging.Logger.warning_once.cache_clear()  # transformers logs each message once per process: once per test
        logging.getLogger("transformers").addHandler(self)
        self.catcher = warnings.catch_warnings()
        self.catcher.__enter__()
        warnings.simplefilter("always", FutureWarning)
        warnings.simplefilter("always", DeprecationWarning)
        self.showwarning, warnings.showwarning = warnings.showwarning, self.warned
        return self

    def __exit__(self, *exc) -> None:
        warnings.showwarning = self.showwarning
        self.catcher.__exit__(*exc)
        logging.getLogger("transformers").removeHandler(self)


def guarded(item):
    """Run a test phase; fail it when our code made transformers warn of a deprecation, naming the message and the
    line. `@pytest.mark.transformers_deprecation` marks the tests that use a deprecated name on purpose."""
    with DeprecationGuard() as guard:
        result = yield
    if guard.found and not item.get_closest_marker("transformers_deprecation"):
        pytest.fail("transformers deprecation from our code:\n" + "\n".join(dict.fromkeys(guard.found)))
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from guarded(item))


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "transformers_deprecation: uses a name transformers deprecated, on purpose")
