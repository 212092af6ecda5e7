"""Every fenced Python and shell snippet of README.md and docs/*.md runs as written, offline, on a tiny model.

A snippet runs unless a marker on the lines right above its fence says otherwise and why (an HTML comment, which
GitHub does not show):

    <!-- doctest: skip: REASON -->              the snippet does not run
    <!-- doctest: skip `COMMAND`: REASON -->    (shell) its commands that start with COMMAND do not run
    <!-- doctest: tiny: REASON -->              (shell) its commands that run a script of TINY_FLAGS get that script's
                                                flags appended, which shrink minutes of training to seconds

A new snippet therefore runs by default, and a marker has to stay true: one that is not right above a fence, gives
no reason, or no longer applies (no command starts with its COMMAND; `tiny` where no command runs a TINY_FLAGS
script) fails `test_markers_sit_above_a_snippet_say_why_and_apply`, and so does a test a reason names
(tests/test_x.py::test_y) that does not exist. Every fence names its language: python and bash/sh/shell snippets run,
the others (text, yaml, ...) are not code.

Each snippet runs from its own copy of one prepared checkout of the project, as a user would from a fresh clone: a
shell snippet in a fresh bash, the Python snippets one after another in one fresh Python process, each with fresh
globals and what it changed in the process undone (tests/snippet_runner.py). `.venv` is the environment running
these tests, whose bin comes first on PATH; nothing lies beside the checkout, and the Hub is offline. A tiny C-DNPG
checkpoint is saved once, lies under each name of CHECKPOINTS that the snippet names (a training command writes its
own; run.py refuses a non-empty output folder), and is in the offline Hub cache under HUB_IDS; the files of
INPUT_FILES are there. A snippet naming another checkpoint or input file fails: add it here.

No page (README.md, docs/*.md, model_card.md) names a path outside the repository, since a user's clone has nothing
beside it: `outside_paths` is the rule.
"""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cdnpg.data import model_token_ids, template_corpus, train_wordpiece_tokenizer
from cdnpg.hub import save_checkpoint
from tests.conftest import tiny_model

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGES = [*DOCS, ROOT / "model_card.md"]  # what a user reads: no path outside the repository
PYTHON, SHELL = {"python", "py"}, {"bash", "sh", "shell"}
CHECKPOINTS = ("runs/template", "runs/minilm_quora")  # made by the README's main job and Quora command
HUB_IDS = ("user/name",)
INPUT_FILES = {
    "questions.txt": "how do i learn python ?\nwhat is the capital of france ?\n",
    "questions.tsv": "how do i learn python ?\thow can i learn python ?\nwhy is the sky blue ?\twhy is the sky blue ?\n",
    # a user's own pairs (README's "Train on your own pairs", train.md's "Data")
    **{
        f"{split}.jsonl": "".join(
            f'{{"source": "how do i learn {topic} ?", "target": "how can i learn {topic} ?"}}\n'
            for topic in ("python", "french", "to cook", "chess", "to swim", "guitar", "math", "to draw")[:size]
        )
        for split, size in (("train", 8), ("valid", 4), ("test", 4))
    },
}
# seconds instead of minutes or hours: 2 steps on a few pairs of the data the command names, with its own model
TINY_FLAGS = {
    "training/run.py": "--max_steps 2 --max_train_samples 64 --max_eval_samples 8 --max_predict_samples 8",
}

FENCE = re.compile(r"^(?P<indent>\s*)```(?P<language>\S*)\s*$")
MARKER = re.compile(r"^<!-- doctest: (?P<kind>skip|tiny)(?: `(?P<command>[^`]+)`)?: (?P<reason>\S.*?) -->$")
TEST_REFERENCE = re.compile(r"(tests/\w+\.py)::(\w+)")


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


@dataclass
class Marker:
    kind: str  # "skip" or "tiny"
    command: str | None  # skip: the commands it applies to (None: the whole snippet)
    reason: str


@dataclass
class Snippet:
    path: Path
    line: int  # of the opening fence, from 1
    language: str
    code: str
    markers: list[Marker] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{shown(self.path)}:{self.line}"

    def skipped(self) -> str | None:
        """The reason the whole snippet does not run, if it does not."""
        return next((m.reason for m in self.markers if m.kind == "skip" and m.command is None), None)


def parse(path: Path) -> tuple[list[Snippet], list[str]]:
    """The fenced snippets of a markdown file with their markers, and what is wrong with the markers and fences."""
    lines = path.read_text(encoding="utf-8").splitlines()
    snippets, problems, pending = [], [], []
    fence, indent, body = None, "", []  # the open fence, its indentation and its lines so far
    where = shown(path)
    for number, line in enumerate(lines, 1):
        if fence is not None:
            if line.strip() == "```":
                fence.code = "\n".join(text.removeprefix(indent) for text in body) + "\n"
                snippets.append(fence)
                fence = None
            else:
                body.append(line)
            continue
        if line.strip().startswith("<!-- doctest"):
            if not (match := MARKER.match(line.strip())):
                problems.append(f"{where}:{number}: not a marker: {line.strip()!r} (see tests/test_docs.py)")
            else:
                pending.append((number, Marker(match["kind"], match["command"], match["reason"])))
            continue
        if match := FENCE.match(line):
            if not match["language"]:
                problems.append(f"{where}:{number}: a fence without a language (```text for what is not code)")
            fence = Snippet(path, number, match["language"], "", [marker for _, marker in pending])
            indent, body = match["indent"], []
            if pending and fence.language not in PYTHON | SHELL:
                problems.append(f"{where}:{pending[0][0]}: a marker above a {fence.language or 'plain'} fence")
            pending = []
            continue
        problems += [f"{where}:{n}: a marker that is not right above a fence" for n, _ in pending]
        pending = []
    problems += [f"{where}:{n}: a marker that is not right above a fence" for n, _ in pending]
    if fence is not None:
        problems.append(f"{where}:{fence.line}: a fence that is never closed")
    return snippets, problems


def split_commands(line: str) -> list[str]:
    """`a && b  # note` -> ["a", "b"]: split at `&&` and cut the comment, outside quotes."""
    parts, current, quote, i = [], "", None, 0
    while i < len(line):
        char = line[i]
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (not current or current[-1].isspace()):
            break
        elif line.startswith("&&", i):
            parts.append(current)
            current, i = "", i + 2
            continue
        current += char
        i += 1
    return [part.strip() for part in [*parts, current] if part.strip()]


def shell_script(snippet: Snippet) -> tuple[str, set[str]]:
    """The bash script a shell snippet runs as, and the markers' COMMANDs and TINY_FLAGS scripts that applied."""
    tiny = any(marker.kind == "tiny" for marker in snippet.markers)
    skips = [marker.command for marker in snippet.markers if marker.kind == "skip" and marker.command]
    commands, applied = [], set()
    for line in snippet.code.replace("\\\n", " ").splitlines():
        for command in split_commands(line):
            if skip := next((prefix for prefix in skips if command.startswith(prefix)), None):
                applied.add(skip)
                continue
            for script, flags in TINY_FLAGS.items():
                if tiny and script in command.split():
                    applied.add(script)
                    command = f"{command} {flags}"
            commands.append(command)
    return "set -euo pipefail\n" + "\n".join(commands) + "\n", applied


# A path outside the repository: `../` that leaves it (a markdown link resolves from its page, anything else from the
# repository root, where commands run), or an absolute or home path, unless it is a system path every machine has.
PARENT_PATH = re.compile(r"(?<![\w.])(?:\.\./)+[\w.-][\w./-]*")
# starts a token (not a URL's, not `a/b`'s): a home path, or an absolute one of a folder and a name (`/paraphrase`
# alone is a web API's name, as Gradio's)
ABSOLUTE_PATH = re.compile(r"(?<![^\s`(\[\"'=])(?:~/[\w.-][\w./-]*|/[\w.-]+/[\w./-]*)")
SYSTEM_PATHS = ("/usr/", "/proc/", "/dev/", "/etc/")
LINK_TARGET = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def outside_paths(page: Path, root: Path = ROOT) -> list[str]:
    """`page:line: path` for each path the page names outside the repository at `root`."""
    found, folder = [], page.parent.relative_to(root)
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        links = {match.start("target") for match in LINK_TARGET.finditer(line)}
        for match in PARENT_PATH.finditer(line):
            base = folder if match.start() in links else Path()
            if os.path.normpath(base / match.group()).startswith(".."):
                found.append(f"{shown(page)}:{number}: {match.group()}")
        found += [f"{shown(page)}:{number}: {match.group()}" for match in ABSOLUTE_PATH.finditer(line)
                  if not match.group().startswith(SYSTEM_PATHS)]  # fmt: skip
    return found


SNIPPETS, PROBLEMS = [], []
for _doc in DOCS:
    _found, _problems = parse(_doc)
    SNIPPETS += _found
    PROBLEMS += _problems
RUNNABLE = [snippet for snippet in SNIPPETS if snippet.language in PYTHON | SHELL]


def marker_problems(snippet: Snippet) -> list[str]:
    """What is wrong with a snippet's markers: a stale one, or a reason naming a test that does not exist."""
    problems = []
    applied = shell_script(snippet)[1] if snippet.language in SHELL else set()
    for marker in snippet.markers:
        if snippet.language in PYTHON and (marker.kind == "tiny" or marker.command):
            problems.append(f"{snippet.name}: `tiny` and `skip COMMAND` are for shell snippets")
        elif marker.kind == "skip" and marker.command and marker.command not in applied:
            problems.append(f"{snippet.name}: no command starts with `{marker.command}`")
        elif marker.kind == "tiny" and not applied & set(TINY_FLAGS):
            problems.append(f"{snippet.name}: `tiny`, but no command runs one of {sorted(TINY_FLAGS)}")
        for test_file, test_name in TEST_REFERENCE.findall(marker.reason):
            tree = ast.parse((ROOT / test_file).read_text()) if (ROOT / test_file).is_file() else ast.Module()
            if test_name not in {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}:
                problems.append(f"{snippet.name}: the marker names {test_file}::{test_name}, which does not exist")
    return problems


def test_markers_sit_above_a_snippet_say_why_and_apply():
    problems = PROBLEMS + [problem for snippet in RUNNABLE for problem in marker_problems(snippet)]
    assert not problems, "\n".join(problems)


def test_markers_skip_commands_and_shrink_training_and_every_fence_names_its_language(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- doctest: skip `pip install`: needs the network -->\n<!-- doctest: tiny: trains for hours -->\n"
        "```bash\npip install x && python training/run.py a.yaml --flag 'a && b'  # note\npython other.py\n```\n"
        "<!-- doctest: skip: needs a GPU; tests/test_docs.py::test_snippet_runs covers it -->\n"
        "```python\nimport torch\n```\n"
        "<!-- doctest skip -->\n\n<!-- doctest: skip: far from its fence -->\n\n```\nusage\n```\n"
    )
    (shell, python, plain), problems = parse(doc)
    script, applied = shell_script(shell)
    assert script.splitlines()[1:] == [
        f"python training/run.py a.yaml --flag 'a && b' {TINY_FLAGS['training/run.py']}",
        "python other.py",
    ]
    assert applied == {"pip install", "training/run.py"}
    assert python.skipped().startswith("needs a GPU") and shell.skipped() is None and plain.code == "usage\n"
    assert marker_problems(shell) == marker_problems(python) == []
    assert [problem.split(": ", 1)[1] for problem in problems] == [
        "not a marker: '<!-- doctest skip -->' (see tests/test_docs.py)",
        "a marker that is not right above a fence",
        "a fence without a language (```text for what is not code)",
    ]


def test_a_stale_marker_or_a_missing_test_in_a_reason_is_a_problem(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- doctest: skip `pip install`: needs the network -->\n<!-- doctest: tiny: trains for hours -->\n"
        "```bash\npython other.py\n```\n"
        "<!-- doctest: skip: covered by tests/test_docs.py::test_that_does_not_exist -->\n```python\npass\n```\n"
    )
    (shell, python), _ = parse(doc)
    assert [problem.split(": ", 1)[1] for problem in marker_problems(shell) + marker_problems(python)] == [
        "no command starts with `pip install`",
        f"`tiny`, but no command runs one of {sorted(TINY_FLAGS)}",
        "the marker names tests/test_docs.py::test_that_does_not_exist, which does not exist",
    ]


def test_no_page_names_a_path_outside_the_repository():
    found = [problem for page in PAGES for problem in outside_paths(page)]
    assert not found, "a user's clone has nothing outside it; name their own files instead:\n" + "\n".join(found)


def test_the_outside_path_rule_on_a_page_that_breaks_it_and_one_that_does_not(tmp_path):
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "See [the README](../README.md) and [the data](../../data/x.jsonl).\n"  # a link from docs/: in, out
        "```bash\nhead -n 5 ../shared/data/quora/valid.jsonl > valid.jsonl\ncat ../README.md\n```\n"  # from the root
        "Paths that start with `./`, `../`, `/` or `~` are local; `cp data/a.jsonl runs/*/b.json`, 1/2, and/or.\n"
        "WordNet from `/usr/share/wordnet`, `/proc/cpuinfo`; [Quora](https://qim.fs.quoracdn.net/q.tsv).\n"
        'The page API: `/paraphrase`, client.predict(..., api_name="/paraphrase").\n'
        '--train_file /home/me/train.jsonl --output_dir ~/runs/x ("/mnt/data")\n'
    )
    assert [problem.split(": ", 1)[1] for problem in outside_paths(page, root=tmp_path)] == [
        "../../data/x.jsonl",
        "../shared/data/quora/valid.jsonl",
        "../README.md",
        "/home/me/train.jsonl",
        "~/runs/x",
        "/mnt/data",
    ]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """One tiny checkpoint, as run.py saves one (weights, remote code, tokenizer, card), shared by every snippet."""
    corpus = template_corpus(num_train=300, num_valid=10, num_test=10, seed=0)["train"]
    tokenizer = train_wordpiece_tokenizer([*corpus["source"], *corpus["target"]], vocab_size=300, min_frequency=1)
    model = tiny_model(**model_token_ids(tokenizer))
    return save_checkpoint(model, tokenizer, tmp_path_factory.mktemp("docs") / "tiny")


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, checkpoint) -> Path:
    from tests.test_hub import materialise_snapshot

    cache = tmp_path_factory.mktemp("hub")
    files = {
        path.relative_to(checkpoint).as_posix(): path.read_bytes() for path in checkpoint.rglob("*") if path.is_file()
    }
    for repo_id in HUB_IDS:
        materialise_snapshot(cache, repo_id, files)
    return cache


def test_hub_ids_are_in_the_offline_cache_the_snippets_use(hub_cache, checkpoint):
    from huggingface_hub import try_to_load_from_cache

    for repo_id in HUB_IDS:
        for name in ("config.json", "model.safetensors", "modeling_cdnpg.py", "tokenizer.json"):
            cached = try_to_load_from_cache(repo_id, name, cache_dir=hub_cache)
            assert isinstance(cached, str) and Path(cached).read_bytes() == (checkpoint / name).read_bytes(), name


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, checkpoint) -> Path:
    """The project as a user's checkout, prepared once: the tiny checkpoint under each name of CHECKPOINTS, the input
    files of INPUT_FILES and `.venv` linked to the environment running these tests."""
    root = tmp_path_factory.mktemp("docs-checkout")
    project = root / "checkout"
    ignore = shutil.ignore_patterns(".*", "runs", "checkpoints", "build", "dist", "*.egg-info", "__pycache__")
    shutil.copytree(ROOT, project, ignore=ignore)
    (project / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    for name in CHECKPOINTS:
        shutil.copytree(checkpoint, project / name)
    for name, text in INPUT_FILES.items():
        (project / name).write_text(text)
    return project


def environment(hub_cache: Path, home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(hub_cache),
        "HF_HOME": str(home),  # no token, no user cache
        "NO_COLOR": "1",
        "OMP_NUM_THREADS": "1",  # a tiny model gains nothing from more threads, and loses to contention on CI
    }


# the Python snippets run in one process (`python_snippets_run`), on the worker that runs them all
ONE_PROCESS = pytest.mark.xdist_group("docs-python")


def as_test(snippet: Snippet):
    return pytest.param(snippet, marks=[ONE_PROCESS] if snippet.language in PYTHON else [])


def snippet_copy(prepared: Path, folder: Path, snippet: Snippet) -> Path:
    """A copy of the prepared checkout in `folder` for one snippet, which may write in it as a user would, holding
    only the checkpoints the snippet names: a training command refuses a non-empty output folder."""
    workdir = shutil.copytree(prepared, folder / "checkout", symlinks=True)
    for name in CHECKPOINTS:
        if name not in snippet.code:
            shutil.rmtree(workdir / name)
    return workdir


def test_the_snippet_runner_gives_each_script_fresh_globals_and_undoes_what_the_one_before_changed(tmp_path):
    """tests/snippet_runner.py, as `python SCRIPT` would: a script's globals, working folder, environment, sys.path
    and the modules of its own folder do not reach the next script; each has its output and its exit code."""
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
    (first / "own_module.py").write_text("NAME = 'first'\n")
    (first / "script.py").write_text(
        "import os, sys\nimport own_module\nleft = 1\nos.chdir('/')\nos.environ['LEFT'] = '1'\n"
        "sys.path.append('/nowhere')\nprint('first ran')\nsys.exit(3)\n"
    )
    (second / "own_module.py").write_text("NAME = 'second'\n")
    (second / "script.py").write_text(
        "import os, sys\nimport own_module\nassert 'left' not in globals() and __name__ == '__main__'\n"
        f"assert os.getcwd() == {str(second)!r} and 'LEFT' not in os.environ and '/nowhere' not in sys.path\n"
        "assert own_module.NAME == 'second' and sys.path[0] == os.getcwd()\nraise ValueError('second failed')\n"
    )
    jobs = [{"script": str(folder / "script.py"), "cwd": str(folder), "stdout": str(folder / "out"),
             "stderr": str(folder / "err")} for folder in (first, second)]  # fmt: skip
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    runner = subprocess.run([sys.executable, str(ROOT / "tests" / "snippet_runner.py"), str(tmp_path / "jobs.json")],
                            capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert runner.returncode == 0, runner.stderr
    assert json.loads(runner.stdout.splitlines()[-1]) == [3, 1]
    assert (first / "out").read_text() == "first ran\n"
    assert (second / "err").read_text().strip().endswith("ValueError: second failed")  # its own asserts held


@pytest.fixture(scope="module")
def python_snippets_run(prepared, hub_cache, tmp_path_factory) -> dict[str, tuple[int, str]]:
    """Each Python snippet that runs, by name: its exit code and stderr. Each runs from a copy of its own of the
    prepared checkout, as `python snippet.py` with fresh globals, one after another in one fresh process
    (tests/snippet_runner.py) instead of one process each, which would cost seconds of imports apiece."""
    folder = tmp_path_factory.mktemp("python-snippets")
    jobs = []
    for number, snippet in enumerate(s for s in RUNNABLE if s.language in PYTHON and not s.skipped()):
        own = folder / str(number)
        own.mkdir()
        (own / "snippet.py").write_text(snippet.code)
        jobs.append({"name": snippet.name, "script": str(own / "snippet.py"), "cwd": str(snippet_copy(prepared, own, snippet)),
                     "stdout": str(own / "stdout.txt"), "stderr": str(own / "stderr.txt")})  # fmt: skip
    (folder / "jobs.json").write_text(json.dumps(jobs))
    runner = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "snippet_runner.py"), str(folder / "jobs.json")],
        cwd=folder,
        env=environment(hub_cache, folder / "home"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert runner.returncode == 0, runner.stderr[-4000:]
    codes = json.loads(runner.stdout.splitlines()[-1])
    return {job["name"]: (code, Path(job["stderr"]).read_text()) for job, code in zip(jobs, codes)}


@pytest.mark.slow
@pytest.mark.parametrize("snippet", [as_test(snippet) for snippet in RUNNABLE], ids=lambda s: f"{s.name}-{s.language}")
def test_snippet_runs(snippet, prepared, hub_cache, tmp_path, request):
    if reason := snippet.skipped():
        pytest.skip(reason)
    if snippet.language in PYTHON:
        code, stderr = request.getfixturevalue("python_snippets_run")[snippet.name]
        assert code == 0, f"{snippet.name} failed:\n{snippet.code}\n{stderr[-4000:]}"
        return
    script = tmp_path / "snippet.sh"
    script.write_text(shell_script(snippet)[0])
    result = subprocess.run(
        ["bash", str(script)],
        cwd=snippet_copy(prepared, tmp_path, snippet),
        env=environment(hub_cache, tmp_path / "home"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{snippet.name} failed:\n{script.read_text()}\n{result.stderr[-4000:]}"
