"""The fresh-machine scripts: scripts/python.sh picks the Python that scripts/setup.sh and scripts/test.sh make every
virtualenv with, one that makes a virtualenv with pip and whose C headers inductor compiles kernels against;
benchmarks/startup.py compares how fast fresh processes of several environments import torch and transformers."""

import json
import os
import statistics
import subprocess
import sys

import pytest

from tests.conftest import ROOT

MAKES_THE_ENVIRONMENTS = """
import ensurepip, os, sys, sysconfig, venv
print(sys.version_info >= (3, 10), os.path.isfile(os.path.join(sysconfig.get_path("include"), "Python.h")))
"""


def python_sh(**env: str) -> str:
    environment = {key: value for key, value in os.environ.items() if key != "PYTHON"} | env
    done = subprocess.run(["bash", "scripts/python.sh"], cwd=ROOT, env=environment, capture_output=True, text=True)
    assert done.returncode == 0 and not done.stderr, done.stderr
    return done.stdout.strip()


def test_python_sh_prints_the_python_of_the_PYTHON_variable_where_it_is_set():
    assert python_sh(PYTHON="/opt/python3.12/bin/python3") == "/opt/python3.12/bin/python3"


def test_python_sh_prints_the_system_python_where_it_makes_the_environments_else_python3():
    qualifies = False
    if os.access("/usr/bin/python3", os.X_OK):
        system = subprocess.run(["/usr/bin/python3", "-c", MAKES_THE_ENVIRONMENTS], capture_output=True, text=True)
        qualifies = system.returncode == 0 and system.stdout.split() == ["True", "True"]
    assert python_sh() == ("/usr/bin/python3" if qualifies else "python3")


def test_the_startup_benchmark_times_fresh_processes_of_each_python_and_prints_their_ratios(capsys):
    """`benchmarks/startup.py`: one fresh process per interpreter, variant and round; no timing is asserted."""
    import startup

    argv = ["--pythons", sys.executable, "--code", "import json", "--compare-collector", "--rounds", "2"]
    result = startup.main(argv)
    at_work = f"{sys.executable} (collector at work)"  # long_lived_imports made a plain block
    assert set(result["cpu_seconds"]) == {sys.executable, at_work}
    for name, seconds in result["cpu_seconds"].items():
        assert len(seconds) == 2 and min(seconds) > 0 and result["median_s"][name] == statistics.median(seconds)
    assert result["ratio_to_first"] == {
        sys.executable: 1.0,
        at_work: result["median_s"][at_work] / result["median_s"][sys.executable],
    }
    assert json.loads(capsys.readouterr().out) == result


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pythons", "/no/such/python"], "--pythons: /no/such/python is not an executable"),
        (["--pythons", sys.executable, sys.executable], "--pythons: name each interpreter once"),
        (["--pythons", sys.executable, "--code", "import no_such_module"], f"--code failed in {sys.executable}"),
    ],
)
def test_the_startup_benchmark_refuses_bad_input_in_one_line(argv, message, capsys):
    import startup

    with pytest.raises(SystemExit) as exited:
        startup.main([*argv, "--rounds", "1"])
    assert exited.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1]


def test_long_lived_imports_pause_the_collector_then_freeze_what_was_imported():
    """`cdnpg.startup.long_lived_imports`, as training/run.py uses it, in a fresh process: no collection inside the
    block, the imported objects frozen after it, collection on again, and a collector that was off stays off."""
    code = """
import gc, json
from cdnpg.startup import long_lived_imports
seen = {"frozen_before": gc.get_freeze_count()}
with long_lived_imports():
    seen["enabled_inside"] = gc.isenabled()
    import decimal
seen |= {"enabled_after": gc.isenabled(), "frozen_after": gc.get_freeze_count()}
gc.disable()
with long_lived_imports():
    import fractions
seen["stays_off"] = not gc.isenabled()
print(json.dumps(seen))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["enabled_inside"] is False and seen["enabled_after"] is True and seen["stays_off"] is True
    assert seen["frozen_before"] == 0 < seen["frozen_after"]
