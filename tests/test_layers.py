"""The layers point one way: the command line (cdnpg.cli, cdnpg.commands) on top; the page (cdnpg.demo), the Space
and the library below it. Nothing below the command line imports it."""

import re
import subprocess
import sys

from tests.conftest import ROOT

COMMAND_LINE = ("cdnpg.cli", "cdnpg.commands")
# an import of a command-line module, in a function or not
IMPORTS_COMMAND_LINE = re.compile(
    r"^\s*(from|import)\s+cdnpg(\.(cli|commands)\b|\s+import\s+.*\b(cli|commands)\b)", re.M
)


def test_no_module_below_the_command_line_imports_it():
    """Every module of cdnpg, modeling_cdnpg and configuration_cdnpg but the command line's own, imported in a fresh
    process (`__main__` modules, which run, are left out): the command line's modules are not loaded after."""
    code = f"""
import importlib, pkgutil, sys
import cdnpg, configuration_cdnpg, modeling_cdnpg
names = [module.name for package in (cdnpg, configuration_cdnpg, modeling_cdnpg)
         for module in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
         if module.name not in {COMMAND_LINE!r} and not module.name.endswith(".__main__")]
for name in names:
    importlib.import_module(name)
assert "cdnpg.demo" in names and "cdnpg.training.run" in names, names
print(sorted(name for name in {COMMAND_LINE!r} if name in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_the_page_and_the_space_name_no_command_line_module():
    """The page's and the Space's sources import nothing of the command line, in a function or not."""
    for path in (ROOT / "cdnpg" / "demo.py", ROOT / "spaces" / "cdnpg-demo" / "app.py"):
        assert not IMPORTS_COMMAND_LINE.search(path.read_text(encoding="utf-8")), path


def test_no_main_module_below_the_command_line_imports_it():
    """The `__main__` modules, which the fresh-process test leaves out because they run, import nothing of the
    command line either: the command line's own module form is `python -m cdnpg.cli`."""
    mains = [path for package in ("cdnpg", "configuration_cdnpg", "modeling_cdnpg")
             for path in (ROOT / package).rglob("__main__.py")]  # fmt: skip
    assert mains, "no __main__ module found"
    for path in mains:
        assert not IMPORTS_COMMAND_LINE.search(path.read_text(encoding="utf-8")), path
