"""Shared fixtures: a tiny random C-DNPG (2+2 layers, d 32) keeps every model test to seconds on a CPU; tiny trained
paraphrasers, whose next token depends on the whole prefix, for the decoding tests; and the guard that fails a test
in which our code (the project's files or the remote code of its checkpoints) makes transformers warn of a
deprecation.

The trained paraphrasers are the same to the bit in every process, whatever ran before them, the thread count or the
load on the machine: the tokenizer is a file shipped with the tests (`tokenizers` breaks frequency ties differently in
each process), and the training runs under `deterministic_training`, which sets and afterwards restores the global
torch state it reads. Each is checked after training for what the decoding tests need, and retrained with the next
seed when it lacks it (`trained_paraphraser`).
"""

import atexit
import contextlib
import dataclasses
import gc
import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

# Each pytest-xdist worker (and the processes it starts) copies checkpoints' remote code into a modules folder of its
# own: transformers writes the files there in place, and a worker importing a file another one is writing would fail.
# transformers reads the location once, at import, so it is set before anything imports it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix=f"cdnpg-modules-{os.environ['PYTEST_XDIST_WORKER']}-")
    atexit.register(shutil.rmtree, os.environ["HF_MODULES_CACHE"], ignore_errors=True)

import pytest
import torch
import transformers
from filelock import FileLock

from cdnpg.data import model_token_ids, template_corpus
from cdnpg.hub import save_checkpoint
from modeling_cdnpg import CDNPGConfig, CDNPGForConditionalGeneration
from modeling_cdnpg.modeling_cdnpg import CACHE_NAME

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
# a WordPiece tokenizer trained once on the fixture corpus below (256 template-corpus pairs, 400 tokens) and shipped:
# trained anew, its ids would differ between processes
TOKENIZER = ROOT / "tests" / "data" / "tokenizer"
MASKS = ("resonance", "scope", "product", "mean", "none")
PAD, BOS, EOS = 0, 1, 2


# gloo's teardown may abort a process that leaves while another one still works ("terminate called without an
# active exception"; torchrun reports it as SIGABRT): everything the process had to do is done by then. The tests that
# launch several processes launch once more on it.
GLOO_TEARDOWN_ABORT = ("terminate called without an active exception", "Signal 6 (SIGABRT)")


def gloo_teardown_abort(result: subprocess.CompletedProcess) -> bool:
    return result.returncode != 0 and any(sign in result.stderr for sign in GLOO_TEARDOWN_ABORT)


def relaunched_on_gloo_teardown_abort(
    launch: Callable[[], subprocess.CompletedProcess], output: Path | None
) -> subprocess.CompletedProcess:
    """`launch()`'s result, launched once more (`output` removed first, unless None: a resumed run keeps it) when gloo
    aborted one of its processes at teardown. torchrun stops the other processes of a launch at once."""
    result = launch()
    if gloo_teardown_abort(result):
        if output is not None:
            shutil.rmtree(output, ignore_errors=True)
        result = launch()
    return result


def two_machine_ranks(argv: list[str], env: dict[str, str], output: Path) -> list[subprocess.CompletedProcess]:
    """docs/distributed.md's several-machine launch with both machines on this one: two `accelerate launch` commands
    (the shipped DDP config), one per --machine_rank with one process each, meeting at 127.0.0.1 on a free port, each
    running `argv` (a script and its arguments, or `-m module ...`) from the checkout and writing to `output`. Both are
    waited for; each result's stderr is kept. When gloo aborts one at teardown, the other machine would wait 5 minutes
    in torchrun's exit barrier for it: it is stopped, `output` removed and both launched once more."""
    for attempt in (1, 2):
        machines = _start_machine_ranks(argv, env)
        deadline = time.monotonic() + 600
        try:
            while not all(machine.done for machine in machines) and time.monotonic() < deadline:
                if attempt == 1 and any(gloo_teardown_abort(machine.result()) for machine in machines if machine.done):
                    break
                time.sleep(0.5)
        finally:
            for machine in machines:
                machine.stop()
        results = [machine.result() for machine in machines]
        shutil.rmtree(machines[0].log.parent)
        if not any(gloo_teardown_abort(result) for result in results):
            return results
        shutil.rmtree(output, ignore_errors=True)
    return results


@dataclasses.dataclass
class _MachineRank:
    process: subprocess.Popen
    log: Path

    @property
    def done(self) -> bool:
        return self.process.poll() is not None

    def result(self) -> subprocess.CompletedProcess:
        stderr = self.log.read_text(errors="replace")
        return subprocess.CompletedProcess(self.process.args, self.process.poll(), None, stderr)

    def stop(self) -> None:
        """The launcher and the process it started (a session of their own)."""
        if not self.done:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _start_machine_ranks(argv: list[str], env: dict[str, str]) -> list[_MachineRank]:
    with socket.socket() as probe:  # a free port for the rendezvous, as a user picks one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(ROOT / "training" / "configs" / "accelerate" / "ddp.yaml"), "--num_machines", "2",
                "--num_processes", "2", "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]  # fmt: skip
    logs = Path(tempfile.mkdtemp(prefix="machine-ranks-"))
    machines = []
    for rank in (0, 1):
        log = logs / f"rank{rank}.log"
        with log.open("w") as stderr:
            process = subprocess.Popen(
                [*launcher, "--machine_rank", str(rank), *argv],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, text=True, env=env, start_new_session=True,
            )  # fmt: skip
        machines.append(_MachineRank(process, log))
    return machines


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


# Two processes decoding the same input with the same checkpoint compute a candidate's score, a mean of float32
# log-probabilities, with the same operations; a kernel chosen at run time, or another batch shape, may add in another
# order, which moves a score of a few nats by about 1e-6. This bound holds that with room to spare.
ACROSS_PROCESSES = 1e-4


def printed_scores(score: float, tolerance: float = ACROSS_PROCESSES) -> set[str]:
    """What the command line may print (3 decimals) for a score that another process computed as `score`: the
    rounding of any value within `tolerance` of it. Rounding is monotonic and the tolerance is below half a printed
    unit, so the interval's two ends give them all: one string, or two when `score` lies beside a rounding boundary."""
    return {f"{score - tolerance:.3f}", f"{score + tolerance:.3f}"}


@pytest.fixture(autouse=True)
def logging_levels_restored():
    """A benchmark's or run.py's main() called in-process sets transformers' verbosity for the whole process, as a
    script may, and run.py's logger and `disable_tqdm` default follow it: later tests would log nothing below it."""
    verbosity = transformers.utils.logging.get_verbosity()
    level = logging.getLogger("cdnpg.training").level
    yield
    transformers.utils.logging.set_verbosity(verbosity)
    logging.getLogger("cdnpg.training").setLevel(level)


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is absent")
    return SHARED


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    """The shipped tokenizer (`TOKENIZER`), copied so that no test can change the file in the repository."""
    return str(shutil.copytree(TOKENIZER, tmp_path_factory.mktemp("tokenizer") / "tokenizer"))


# ------------------------------------------------------------------------------------------------------------------
# Tiny trained paraphrasers: what a decoding test needs
# ------------------------------------------------------------------------------------------------------------------

PARAPHRASER_STEPS = 250  # the training loss falls from 6 to about 0.1: fluent template paraphrases, seconds per mask
# the other kinds' schedule: their parity tests need only a prefix-dependent model (`trained_paraphraser` checks it),
# which fewer steps at a higher rate give; the ranking and novelty tests read the resonance paraphraser, whose beams
# need the longer training
QUICK_PARAPHRASER = {"steps": 60, "learning_rate": 1e-2}
PARAPHRASER_SEEDS = (0, 1, 2, 3)  # tried in turn until one trains a model that the decoding tests can rely on
SOURCES = [
    "how can i get from paris to rome by train ?",
    "why is pinterest so popular ?",
    "what are the must - see places in new zealand ?",
    "how useful is scala for game theory ?",
]


@contextlib.contextmanager
def deterministic_training():
    """The global torch state a training reads, set to fixed values and restored afterwards, so that neither earlier
    tests nor the process's settings change what it computes: one intra-op thread (a reduction split over threads
    adds in another order), float32 defaults and matmul precision, no autocast, gradients on, deterministic
    algorithms, and a forked global RNG (the seed set inside does not leak out, and earlier draws do not leak in)."""
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    precision, deterministic = torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]), torch.autocast("cpu", enabled=False), torch.enable_grad():
            yield
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        torch.set_float32_matmul_precision(precision)
        torch.use_deterministic_algorithms(deterministic)


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter and buffer, by name: equal digests are bit-identical weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def train_tiny_paraphraser(
    tokenizer,
    granularity_mask: str,
    steps: int = PARAPHRASER_STEPS,
    seed: int = 0,
    learning_rate: float = 3e-3,
    **overrides,
) -> CDNPGForConditionalGeneration:
    """A d 64 C-DNPG trained on 256 template-corpus pairs. A random tiny model repeats one token whatever it sees, so a
    decoder that lost its prefix (a dropped cache) decodes the same; this one writes a different word at each step,
    chosen from all the words before it. The same weights for the same arguments, in any process."""
    corpus = template_corpus(num_train=256, num_valid=16, num_test=16, seed=0)["train"]
    sources = tokenizer(list(corpus["source"]), padding=True, return_tensors="pt")
    targets = tokenizer(list(corpus["target"]), padding=True, return_tensors="pt")
    labels = targets["input_ids"][:, 1:].masked_fill(targets["attention_mask"][:, 1:] == 0, -100)
    with deterministic_training():
        torch.manual_seed(seed)
        sizes = dict(d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, dropout=0.0, attention_dropout=0.0)
        config = tiny_config(**model_token_ids(tokenizer), **sizes, granularity_mask=granularity_mask, **overrides)
        model = CDNPGForConditionalGeneration(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
        batches = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            rows = torch.randint(0, len(corpus), (32,), generator=batches)
            # padded to the batch's longest pair, as a seq2seq collator pads: about half the corpus-wide length
            source_mask, target = sources["attention_mask"][rows], labels[rows]
            source_length, target_length = int(source_mask.sum(1).max()), int((target != -100).sum(1).max())
            input_ids = sources["input_ids"][rows, :source_length]
            loss = model(input_ids, source_mask[:, :source_length], labels=target[:, :target_length]).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.generation_config.max_new_tokens = 16
    return model.eval()


def newest_token_only_greedy(model, inputs: dict, steps: int) -> torch.Tensor:
    """Greedy decoding by a decoder that sees only the newest token at position 0: what a dropped cache decoded."""
    ids = torch.full((inputs["input_ids"].shape[0], 1), model.config.decoder_start_token_id)
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(**inputs)
        for _ in range(steps):
            logits = model(**inputs, encoder_outputs=encoder_outputs, decoder_input_ids=ids[:, -1:], use_cache=False)
            ids = torch.cat([ids, logits.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def why_not_prefix_dependent(model, tokenizer) -> str | None:
    """What keeps `model` from proving cache parity on `SOURCES`, or None: greedy decoding must write at least 5
    distinct tokens for each source (not one repeated token), and a decoder that sees only the newest token must
    write something else for every source (so that a dropped cache shows)."""
    batch = tokenizer(SOURCES, padding=True, return_tensors="pt")
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        full = model.generate(**inputs, num_beams=1, do_sample=False, use_cache=False)
    repeating = [tokenizer.decode(row) for row in full.tolist() if len(set(row)) < 5]
    if repeating:
        return f"fewer than 5 distinct tokens in {repeating}"
    newest_only = newest_token_only_greedy(model, inputs, full.shape[1] - 1)
    alike = [tokenizer.decode(a) for a, b in zip(full.tolist(), newest_only.tolist()) if a == b]
    if alike:
        return f"a decoder seeing only the newest token writes the same {alike}"
    return None


def trained_paraphraser(tokenizer, granularity_mask: str, **overrides) -> CDNPGForConditionalGeneration:
    """`train_tiny_paraphraser` with the first of `PARAPHRASER_SEEDS` whose model the decoding tests can rely on
    (`why_not_prefix_dependent`); an error naming every seed and what each model lacked when none is."""
    failures = []
    for seed in PARAPHRASER_SEEDS:
        model = train_tiny_paraphraser(tokenizer, granularity_mask, seed=seed, **overrides)
        reason = why_not_prefix_dependent(model, tokenizer)
        if reason is None:
            return model
        failures.append(f"seed {seed}: {reason}")
    described = ", ".join(f"{key}={value}" for key, value in overrides.items())
    raise RuntimeError(
        f"no seed trained a {granularity_mask} paraphraser ({described or 'no copy'}) whose next token depends on "
        "the whole prefix:\n" + "\n".join(failures)
    )


# paraphrasers with a copy mechanism: name -> (granularity mask, gate); "none" + learned is Transformer+Copy
COPYING = {"none+copy": ("none", "learned"), "resonance+copy": ("resonance", "learned"),
           "resonance+granularity copy": ("resonance", "granularity")}  # fmt: skip


def shared_folder(tmp_path_factory, name: str) -> Path:
    """A folder every process of this test run sees: with pytest-xdist, the workers' common temporary folder."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def paraphrasers(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    """Per granularity mask, and per copy setting of `COPYING`, a tiny trained paraphraser saved as a checkpoint
    (weights, remote code, tokenizer), built once per test run: each under a file lock in a folder every pytest-xdist
    worker sees, the workers taking the kinds in opposite orders so that they build different ones side by side.
    Training is deterministic, so whichever worker builds a checkpoint, it is the same."""
    from cdnpg.data import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    folder = shared_folder(tmp_path_factory, "paraphrasers")
    kinds = {kind: (kind, None) for kind in MASKS} | COPYING
    order = list(kinds)
    if int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")) % 2:
        order.reverse()
    checkpoints = {}
    for kind in order:
        checkpoint, done = folder / kind, folder / f"{kind}.done"
        with FileLock(folder / f"{kind}.lock"):
            if not done.exists():
                mask, gate = kinds[kind]
                schedule = {} if kind == "resonance" else QUICK_PARAPHRASER
                model = trained_paraphraser(tokenizer, mask, copy_mechanism=gate, **schedule)
                save_checkpoint(model, tokenizer, checkpoint)
                done.touch()
        checkpoints[kind] = checkpoint
    return {kind: checkpoints[kind] for kind in kinds}


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


def pytest_collection_finish(session) -> None:
    """The objects of the imports and of collection live as long as the process: frozen, they are left out of the
    garbage collector's full passes, each of which would go through them all (about 0.3 s in a process that imported
    torch, transformers and gradio)."""
    gc.freeze()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items) -> None:
    """The tests marked `serial` start processes of their own on every core: with `--dist loadgroup` they run one
    after another on one worker, so that no two of them run at once."""
    for item in items:
        if item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.xdist_group("serial"))
