"""Runs Python scripts one after another in this one process, each as `python SCRIPT` runs it from its working folder:
`__main__` with fresh globals, the script's folder first on sys.path, its output in files of its own and its exit
code. What a script changes in the process (the working folder, the environment, sys.path, the modules it imported
from its own folder) is undone before the next one. tests/test_docs.py runs the docs' Python snippets so, without
seconds of imports apiece.

    python tests/snippet_runner.py JOBS_JSON

JOBS_JSON: a list of {"script", "cwd", "stdout", "stderr"} (paths); the exit codes, in order, are the JSON list of
the last line of stdout.
"""

import contextlib
import json
import os
import runpy
import sys
import traceback
from pathlib import Path


def exit_code(stop: SystemExit) -> int:
    """The code `python SCRIPT` exits with after `sys.exit(stop.code)`."""
    if stop.code is None:
        return 0
    return stop.code if isinstance(stop.code, int) else 1


def run_script(script: Path, cwd: Path, stdout: Path, stderr: Path) -> int:
    environment, path, modules = dict(os.environ), list(sys.path), set(sys.modules)
    with (
        stdout.open("w") as out,
        stderr.open("w") as err,
        contextlib.chdir(cwd),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        sys.path[0] = str(script.parent)
        try:
            runpy.run_path(str(script), run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = exit_code(stop)
        except BaseException:  # as Python ends a script: the traceback, exit code 1
            traceback.print_exc()
            code = 1
    os.environ.clear()
    os.environ.update(environment)
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        if Path(getattr(sys.modules[name], "__file__", None) or "/").resolve().is_relative_to(script.parent.resolve()):
            del sys.modules[name]
    return code


if __name__ == "__main__":
    jobs = json.loads(Path(sys.argv[1]).read_text())
    codes = [run_script(*(Path(job[key]) for key in ("script", "cwd", "stdout", "stderr"))) for job in jobs]
    print(json.dumps(codes))
