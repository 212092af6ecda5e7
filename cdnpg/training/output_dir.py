"""The run's folder: one run at a time (`run_lock`), transformers' output_dir convention (refuse a non-empty one
unless the run resumes or replaces it), left as the run found it when the run fails or is stopped before its first
checkpoint, the checkpoint a resumed run continues from, and the errors that say where the model is when a run stops
early: Ctrl-C or `kill` (`TrainingInterrupted`) or a failure after the save (`PostTrainingError`)."""

import json
import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from accelerate import PartialState
from accelerate.utils import broadcast_object_list
from filelock import FileLock, Timeout
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from cdnpg.training.arguments import CDNPGTrainingArguments, UsageError

logger = logging.getLogger("cdnpg.training")
# What a run writes to output_dir. Any of the first marks a folder as an earlier run's, which --overwrite_output_dir
# may remove; the results are what a resumed run replaces, so none of them outlives the run that wrote it.
TOKENIZER = "tokenizer"  # the WordPiece vocabulary a run trains, saved before training so that a resumed run keeps it
RUN_FILES = ("config.json", "trainer_state.json", "training_args.bin", TOKENIZER, "all_results.json")
RESULT_FILES = (
    "predictions.jsonl", "all_results.json", "train_results.json", "eval_results.json", "test_results.json", "README.md"
)  # fmt: skip


class PostTrainingError(RuntimeError):
    """A step after the model was saved failed: the message says which, and where the model is."""


def last_complete_checkpoint(folder: Path) -> str | None:
    """The newest checkpoint the Trainer finished writing (its trainer_state.json comes last): Ctrl-C during a save
    leaves a newer folder without it, which cannot be resumed."""
    steps = [
        (int(path.name.removeprefix(PREFIX_CHECKPOINT_DIR + "-")), path)
        for path in folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*")
        if path.name.removeprefix(PREFIX_CHECKPOINT_DIR + "-").isdigit() and (path / TRAINER_STATE_NAME).is_file()
    ]
    return str(max(steps)[1]) if steps else None


def rerun_command(argv: Sequence[str], *flags: str) -> str:
    """The command that started this run (its flags `argv`, this Python), with `flags` in place of any
    `--resume_from_checkpoint` and `--overwrite_output_dir` it had."""
    given, replaced = list(argv), ("--resume_from_checkpoint", "--overwrite_output_dir")
    for flag in replaced:
        if flag in given:  # the flag and its value make way for the new ones
            at = given.index(flag)
            del given[at : at + 2]
    given = [arg for arg in given if not arg.startswith(tuple(f"{flag}=" for flag in replaced))]
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"<the same launch command> {shlex.join([sys.argv[0], *given, *flags])}"
    python = Path(sys.executable)  # this interpreter, as it runs from here: .venv/bin/python in a checkout
    python = python.relative_to(Path.cwd()) if python.is_relative_to(Path.cwd()) else python
    return shlex.join([str(python), sys.argv[0], *given, *flags])


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or `kill`) during a run: the message names the last checkpoint and how to resume from it.
    `progress_bar`: a progress bar may be drawn on the current line of stderr (tqdm leaves the cursor after it), so the
    message must start a line of its own."""

    def __init__(self, output_dir: str, argv: Sequence[str], progress_bar: bool = False):
        self.progress_bar = progress_bar
        folder = Path(output_dir)
        last = last_complete_checkpoint(folder)
        if last is None:
            message = f"interrupted before the first checkpoint in {folder}: nothing to resume, run again"
        else:
            message = f"interrupted; the last checkpoint is {last}. {continue_from(last, argv)}"
        super().__init__(message)


def continue_from(checkpoint: str, argv: Sequence[str]) -> str:
    """How to go on from a complete checkpoint: the command that resumes from it, or, for one saved without the
    optimizer and schedule (`save_only_model`), which cannot resume, the flag that starts a new run from its weights."""
    if resumable(checkpoint):
        return f"Resume with: {rerun_command(argv, '--resume_from_checkpoint', checkpoint)}"
    return (
        f"It holds the model but not the optimizer state (save_only_model): start a new run from its weights with "
        f"--model_name_or_path {checkpoint} and another --output_dir"
    )


def resumable(checkpoint: str | os.PathLike) -> bool:
    """The optimizer and schedule state is saved beside the weights: the Trainer can resume from `checkpoint`."""
    path = Path(checkpoint)
    return any(path.glob("optimizer*")) and any(path.glob("scheduler*"))


def resume_checkpoint(args: CDNPGTrainingArguments) -> str | None:
    """The checkpoint `--resume_from_checkpoint` names. `true` is the Trainer's own value for the last checkpoint in
    `output_dir`: the last complete one here (`last_complete_checkpoint`), since a newer one a kill interrupted while it
    was written cannot be resumed; `false` resumes nothing, as the Trainer reads it."""
    given = args.resume_from_checkpoint
    if given is None or given.lower() not in ("true", "false"):
        return given
    if given.lower() == "false":
        return None
    last = last_complete_checkpoint(Path(args.output_dir))
    if last is None:
        raise UsageError(
            f"--resume_from_checkpoint {given}: {args.output_dir} holds no complete checkpoint to resume (none with "
            f"{TRAINER_STATE_NAME}): run again with --overwrite_output_dir true to replace what is there"
        )
    logger.info("--resume_from_checkpoint %s: resuming from %s, the last complete checkpoint", given, last)
    return last


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """`kill` (SIGTERM, also what a launcher sends its processes when it is stopped) stops the run as Ctrl-C does,
    so that the folder is put back and the message names the checkpoint; Python's default would end the process at
    once. Only the main thread can take signals: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def model_kept_on_failure(output_dir: str | os.PathLike, step: str) -> Iterator[None]:
    """Run a step that comes after the model was saved; its failure becomes a `PostTrainingError` saying so."""
    try:
        yield
    except Exception as error:
        logger.exception("%s failed", step)
        raise PostTrainingError(
            f"{step} failed ({type(error).__name__}: {error}); the trained model is saved in {output_dir}"
        ) from error


def lock_files(output_dir: str | os.PathLike) -> tuple[Path, Path]:
    """The lock of a run's folder and the note naming its holder, beside the folder (inside it they would be taken
    for a run's files, and removed with a folder that a stopped run puts back): `runs/.x.lock`, `runs/.x.lock.json`."""
    folder = Path(output_dir).absolute()
    lock = folder.parent / f".{folder.name}.lock"
    return lock, lock.with_name(lock.name + ".json")


def lock_holder(output_dir: str | os.PathLike) -> str:
    """Who holds the lock of `output_dir`, as its note says: process, host, since when, command."""
    try:
        note = json.loads(lock_files(output_dir)[1].read_text())
        return f"process {note['pid']} on {note['host']}, since {note['since']}: {note['command']}"
    except (OSError, ValueError, KeyError):  # the holder has not written it yet
        return "a process that is starting"


@contextmanager
def output_dir_lock(
    output_dir: str | os.PathLike, command: Sequence[str] = (), flag: str = "--output_dir"
) -> Iterator[None]:
    """Hold the lock of `output_dir` in this process, for as long as the body runs.

    The lock is the operating system's (filelock's `FileLock`: flock on Unix), taken by one process: it ends with
    that process, however it ends, `kill -9` included, so a killed run never blocks the next one and no lock is ever
    stale. The note beside it names the holder for the run it refuses. `flag`: the option that named the folder.

    Raises:
        UsageError: another process holds the lock: "--output_dir X is in use by another run (process P on H, since
            T: COMMAND) ...".
    """
    lock_path, note_path = lock_files(output_dir)
    lock = FileLock(lock_path, timeout=0)
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except Timeout:  # an OSError too: first
        raise UsageError(
            f"{flag} {output_dir} is in use by another run ({lock_holder(output_dir)}): wait until it ends, or "
            f"choose another {flag}"
        ) from None
    except OSError as error:  # a read-only or full filesystem
        raise UsageError(f"{flag} {output_dir}: cannot write its lock {lock_path}: {error.strerror}") from None
    try:
        since = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        note = {"pid": os.getpid(), "host": socket.gethostname(), "since": since, "command": shlex.join(command)}
        partial = note_path.with_name(f"{note_path.name}.{os.getpid()}")
        partial.write_text(json.dumps(note))
        os.replace(partial, note_path)
        yield
    finally:
        note_path.unlink(missing_ok=True)  # while the lock is still held: the next holder's note is never removed
        lock.release()


@contextmanager
def run_lock(args: CDNPGTrainingArguments, argv: Sequence[str] = (), flag: str = "--output_dir") -> Iterator[None]:
    """One run at a time in `args.output_dir`: the launch's main process holds `output_dir_lock` for the whole run,
    and a run that finds it held stops in every process, with the same one-line `UsageError`. The processes of one
    launch, on one machine or several, are one run. `flag`: the option that named the folder (any `args` with an
    `output_dir` will do: `cdnpg augment` holds its --output-dir so)."""
    check_output_path(Path(args.output_dir), flag)
    state = PartialState()
    refusal: list[str | None] = [None]
    with ExitStack() as held:
        if state.is_main_process:
            try:
                held.enter_context(output_dir_lock(args.output_dir, [sys.argv[0], *argv], flag))
            except UsageError as error:
                refusal[0] = str(error)
        if state.num_processes > 1:
            broadcast_object_list(refusal)
        if refusal[0] is not None:
            raise UsageError(refusal[0])
        yield


def check_resumable(checkpoint: str) -> None:
    """A checkpoint resumes a run only with the optimizer and schedule state beside the weights; without them the
    Trainer would silently restart warm-up and AdamW's moments from zero."""
    path = Path(checkpoint)
    if not path.is_dir():
        raise UsageError(f"--resume_from_checkpoint {checkpoint}: no such checkpoint folder")
    if not (path / TRAINER_STATE_NAME).is_file():
        last = last_complete_checkpoint(path.parent)
        instead = (
            f"the last complete one is {last}: give --resume_from_checkpoint {last}"
            if last is not None
            else f"{path.parent} holds no complete one: run again with --overwrite_output_dir true"
        )
        raise UsageError(
            f"--resume_from_checkpoint {checkpoint}: not a complete Trainer checkpoint (no {TRAINER_STATE_NAME}, "
            f"written last: a run stopped while saving it); {instead}"
        )
    if not resumable(path):
        raise UsageError(
            f"--resume_from_checkpoint {checkpoint}: the checkpoint holds the model but not the optimizer and "
            "learning-rate schedule (saved with save_only_model), so resuming would restart warm-up and AdamW from "
            f"zero. Start a new run from its weights with --model_name_or_path {checkpoint}, or save checkpoints "
            "with --save_only_model false"
        )


def check_output_path(folder: Path, flag: str = "--output_dir") -> None:
    """`folder` is, or can become, a folder: neither it nor a folder above it is a file."""
    existing = next(path for path in (folder, *folder.absolute().parents) if path.exists())
    if not existing.is_dir():
        where = "is a file" if existing == folder else f"is inside {existing}, a file"
        raise UsageError(f"{flag} {folder} {where}, not a folder: choose another {flag}")


def check_output_dir(
    args: CDNPGTrainingArguments, inputs: Sequence[str | None] = (), argv: Sequence[str] = ()
) -> None:
    """transformers' convention: a non-empty output_dir is refused unless the run continues (--resume_from_checkpoint)
    or replaces (--overwrite_output_dir) the one there, so nothing of an earlier run is silently reused or mixed in.
    Checks only: nothing is changed. `argv`: the run's flags, for the command a refusal suggests."""
    if args.resume_from_checkpoint:
        check_resumable(args.resume_from_checkpoint)
    folder = Path(args.output_dir)
    check_output_path(folder)
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    if [path.name for path in entries] == [TOKENIZER] and not args.overwrite_output_dir:
        raise UsageError(
            f"--output_dir {folder} holds only the tokenizer of a run stopped before its first checkpoint (nothing "
            f"to resume). Run again, replacing it: {rerun_command(argv, '--overwrite_output_dir', 'true')}"
        )
    if entries and not args.overwrite_output_dir and not args.resume_from_checkpoint:
        listed = f"{', '.join(path.name for path in entries[:4])}{', ...' if len(entries) > 4 else ''}"
        last = last_complete_checkpoint(folder)
        if last is not None and resumable(last):
            resume = f"--resume_from_checkpoint {last} continues it from its last complete checkpoint, "
        else:
            resume = "it holds no checkpoint to resume from; "
        raise UsageError(
            f"--output_dir {folder} is not empty ({listed}): {resume}--overwrite_output_dir true replaces it (its "
            "files are removed); or choose another --output_dir"
        )
    if entries and args.overwrite_output_dir and not args.resume_from_checkpoint:
        for given in filter(None, inputs):  # the model, tokenizer or data this run reads must survive the clean-up
            if Path(given).resolve().is_relative_to(folder.resolve()):
                raise UsageError(
                    f"--overwrite_output_dir would remove {given}, which this run reads: choose another --output_dir"
                )
    if entries and args.overwrite_output_dir and not any((folder / name).exists() for name in RUN_FILES):
        raise UsageError(
            f"--output_dir {folder} holds files but no training run (none of {', '.join(RUN_FILES)}); "
            "--overwrite_output_dir removes only an earlier run's folder: choose another --output_dir"
        )


def _remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


@contextmanager
def prepared_output_dir(
    args: CDNPGTrainingArguments, inputs: Sequence[str | None] = (), argv: Sequence[str] = ()
) -> Iterator[Callable[[], None]]:
    """The run's folder, checked (`check_output_dir`); the body prepares the run (data, tokenizer, model, Trainer),
    calls the function it is given just before training, and trains.

    Until the first checkpoint (or the model) is saved the run may fail or be stopped (an empty data file, a model
    that does not load, Ctrl-C, `kill`) and the folder is put back as the run found it: a rerun is not refused for the
    tokenizer the stopped run left, and --overwrite_output_dir keeps the earlier run (its files wait in a folder beside
    it) until the new one has saved something. A resumed run removes the earlier results (predictions, metrics, card:
    written anew) when it starts training, and keeps its folder from then on. Only `kill -9` leaves the tokenizer
    behind: `check_output_dir` then says so and gives the command to run again. `--resume_from_checkpoint true`
    becomes the checkpoint it names (`resume_checkpoint`)."""
    args.resume_from_checkpoint = resume_checkpoint(args)
    check_output_dir(args, inputs, argv)
    folder = Path(args.output_dir)
    existed = folder.is_dir()
    found = {path.name for path in folder.iterdir()} if existed else set()
    resuming = bool(args.resume_from_checkpoint)
    replacing = bool(found) and args.overwrite_output_dir and not resuming
    main_process = args.process_index == 0
    aside: Path | None = None
    PartialState().wait_for_everyone()  # every process has looked before the main one changes anything
    if replacing and main_process:  # entry by entry: the folder itself may be the working directory
        aside = Path(tempfile.mkdtemp(prefix=f".{folder.resolve().name}.replaced-", dir=folder.resolve().parent))
        for name in found:
            os.replace(folder / name, aside / name)
    PartialState().wait_for_everyone()
    started = False

    def start_training() -> None:
        nonlocal started
        PartialState().wait_for_everyone()
        if resuming and main_process:
            for name in RESULT_FILES:
                if name in found and (folder / name).exists():
                    _remove(folder / name)
        started = True
        PartialState().wait_for_everyone()

    def saved_something() -> bool:
        return (folder / "config.json").is_file() or last_complete_checkpoint(folder) is not None

    try:
        yield start_training
    except BaseException:
        if main_process and not (started and (resuming or saved_something())):
            # the other processes fail alike, or wait for the main one in vain
            put_back(folder, existed, found, aside)
            aside = None
        raise
    finally:
        if aside is not None:
            logger.info("Removed the earlier run in %s (--overwrite_output_dir)", folder)
            shutil.rmtree(aside)


def put_back(folder: Path, existed: bool, found: set[str], aside: Path | None) -> None:
    """The folder as a run found it: what the run added removed, and the earlier run it was replacing (in `aside`)
    moved back."""
    if not existed:
        shutil.rmtree(folder, ignore_errors=True)
        return
    if folder.is_dir():
        for path in folder.iterdir():
            if aside is not None or path.name not in found:
                _remove(path)
    if aside is not None:
        for name in found:
            os.replace(aside / name, folder / name)
        aside.rmdir()
