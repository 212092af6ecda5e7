"""docs/api.md is what scripts/api_docs.py makes from the code's docstrings, and documents every public argument."""

import dataclasses
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

from modeling_cdnpg import CDNPGConfig, ParaphraseSettings, granularity_processors, paraphrase
from modeling_cdnpg.pipeline_cdnpg import CDNPGText2TextPipeline

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("api_docs", ROOT / "scripts" / "api_docs.py")
api_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(api_docs)
PAGE = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")


def section(page: str, heading: str) -> str:
    """The text of the `## ` section whose heading contains `heading`, its code fences left out: what it says."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("## ") and heading in line)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return re.sub(r"```.*?```", "", "\n".join(lines[start:end]), flags=re.S)


def parameters(function) -> list[str]:
    kinds = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    return [
        p.name for p in inspect.signature(function).parameters.values() if p.name != "self" and p.kind not in kinds
    ]


def test_the_committed_api_page_is_what_the_docstrings_give_now(tmp_path):
    assert api_docs.render() == PAGE, "docs/api.md is stale: run python scripts/api_docs.py"
    assert api_docs.main(["--check"]) == 0
    (stale := tmp_path / "api.md").write_text(PAGE.replace("## `ParaphraseSettings`", "## Settings"))
    assert api_docs.main(["--check", "--out", str(stale)]) == 1


@pytest.mark.parametrize(
    "heading, documented",
    [
        ("`CDNPGConfig`", parameters(CDNPGConfig.__init__)),
        ("`paraphrase()`", parameters(paraphrase)),
        ("`ParaphraseSettings`", [field.name for field in dataclasses.fields(ParaphraseSettings) if field.init]),
        ("`granularity_processors()`", parameters(granularity_processors)),
        ("The pipeline", parameters(CDNPGText2TextPipeline.__call__)
         + parameters(CDNPGText2TextPipeline._sanitize_parameters)),
    ],
)  # fmt: skip
def test_every_public_argument_is_described_in_its_section_outside_the_signature(heading, documented):
    text = section(PAGE, heading)
    missing = [name for name in documented if not re.search(rf"`{name}`", text)]
    assert documented and not missing, f"{heading}: {missing} not described on docs/api.md: document them"


def test_config_fields_show_the_defaults_that_init_has():
    text = section(PAGE, "`CDNPGConfig`")
    for name, parameter in inspect.signature(CDNPGConfig.__init__).parameters.items():
        if parameter.default is not inspect.Parameter.empty:
            assert f"`{name}` = `{parameter.default!r}`" in text, name


def test_a_config_field_the_docstring_leaves_out_is_missing_from_the_page():
    class Undocumented(CDNPGConfig):
        """Configuration.

        Args:
            vocab_size (`int`, defaults to 30522), d_model (`int`):
                Sizes.
        """

    names = [name for names, _, _ in api_docs.config_entries(inspect.getdoc(Undocumented).split("Args:")[1])
             for name in names]  # fmt: skip
    assert names == ["vocab_size", "d_model"]
    assert "encoder_layers" in parameters(CDNPGConfig.__init__) and "encoder_layers" not in names
