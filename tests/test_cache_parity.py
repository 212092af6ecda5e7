"""Cached decoding returns what decoding without a cache returns, on tiny trained paraphrasers (conftest.py) whose
next token depends on the whole prefix: every mask, attention backend and decoding mode, the static cache, novelty and
keep_details, the pipeline, and the remote code in a fresh process on this transformers and on 4.57.x.

transformers 5.24 renamed the cache argument (`past_key_values` -> `cache`); a model that dropped it decoded every step
from the newest token alone, and a random tiny model, which repeats one token whatever it sees, did not notice.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

from cdnpg.hub import REMOTE_CODE_FILES
from modeling_cdnpg import granularity_kernels
from modeling_cdnpg.generation_cdnpg import granularity_processors, paraphrase
from modeling_cdnpg.modeling_cdnpg import CACHE_NAME
from tests.conftest import COPYING, MASKS, ROOT, SOURCES, cache_of, why_not_prefix_dependent
from tests.test_cli import run_cli
from tests.test_hub import PYTHONS, run_isolated

MODES = {
    "greedy": dict(num_beams=1),
    "beam search": dict(num_beams=4, num_return_sequences=2),
    "sampling": dict(do_sample=True, top_k=20, num_return_sequences=2),
}


def load(folder, dtype: torch.dtype = torch.float32):
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).to(dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    inputs = tokenizer(SOURCES, padding=True, return_tensors="pt")
    return model, tokenizer, {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}


def generate(model, inputs, seed=0, **kwargs):
    torch.manual_seed(seed)  # sampling draws the same numbers with and without the cache
    with torch.no_grad():
        return model.generate(**inputs, return_dict_in_generate=True, output_scores=True, output_logits=True, **kwargs)


@pytest.mark.parametrize("kind", [*MASKS, *COPYING])
def test_the_saved_paraphrasers_next_token_depends_on_the_whole_prefix(paraphrasers, kind):
    """What makes the parity tests below able to fail, checked on the checkpoints as they load (the fixture checked
    the models it trained): outputs that are not one repeated token, and other outputs from a decoder that sees only
    the newest token (a dropped cache)."""
    model, tokenizer, _ = load(paraphrasers[kind])
    assert why_not_prefix_dependent(model, tokenizer) is None


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", [*MASKS, *COPYING])
def test_cached_decoding_equals_uncached_decoding(paraphrasers, kind, implementation, mode):
    """In float64, so that rounding cannot pass for a cache bug nor hide one: in float32 the two decodings' logits
    differed by up to 1e-3 on CI's CPU (5e-6 typically here), in float64 (generate() hands them over as float32) by
    at most one float32 rounding step. Float32 decoding is compared by the sequences of the tests below."""
    model, _, inputs = load(paraphrasers[kind], torch.float64)
    model.set_attn_implementation(implementation)
    cached = generate(model, inputs, use_cache=True, **MODES[mode])
    uncached = generate(model, inputs, use_cache=False, **MODES[mode])
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(torch.stack(cached.logits), torch.stack(uncached.logits), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(torch.stack(cached.scores), torch.stack(uncached.scores), atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("kind", ["resonance", "scope", "none"])
def test_cached_decoding_equals_uncached_decoding_with_flex_attention(paraphrasers, kind, monkeypatch):
    """Greedy and beam search, three masks. Flex attention compiled by aot_eager: the masks that reach it are under
    test, not inductor's kernels (whose C++ compile per input shape takes minutes on a CPU)."""
    monkeypatch.setattr(granularity_kernels, "COMPILE_BACKEND", "aot_eager")
    model, _, inputs = load(paraphrasers[kind])
    model.set_attn_implementation("flex_attention")
    for mode in ("greedy", "beam search"):
        cached = generate(model, inputs, use_cache=True, **MODES[mode])
        uncached = generate(model, inputs, use_cache=False, **MODES[mode])
        assert torch.equal(cached.sequences, uncached.sequences), mode


@pytest.mark.parametrize("kind", [*MASKS, *COPYING])
def test_static_cache_decoding_equals_uncached_decoding(paraphrasers, kind):
    from transformers import StaticCache

    model, _, inputs = load(paraphrasers[kind])
    for mode in ("greedy", "beam search"):
        static = generate(model, inputs, cache_implementation="static", **MODES[mode])
        uncached = generate(model, inputs, use_cache=False, **MODES[mode])
        assert torch.equal(static.sequences, uncached.sequences), mode
        assert isinstance(cache_of(static).self_attention_cache, StaticCache)


@pytest.mark.parametrize("kind", ["resonance", "product", "none", *COPYING])
def test_novelty_and_keep_details_decode_alike_with_and_without_the_cache(paraphrasers, kind):
    model, tokenizer, inputs = load(paraphrasers[kind])
    settings = dict(novelty=0.5, keep_details=1.0, num_return_sequences=3)
    cached = paraphrase(model, tokenizer, inputs, use_cache=True, **settings)
    uncached = paraphrase(model, tokenizer, inputs, use_cache=False, **settings)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores)
    rules = granularity_processors(model, tokenizer, inputs, novelty=0.5, keep_details=1.0)
    with torch.no_grad():
        ruled = [model.generate(**inputs, logits_processor=rules, use_cache=cache) for cache in (True, False)]
    assert torch.equal(*ruled), "the rules in transformers' own generate()"


def test_the_pipeline_paraphrases_alike_with_and_without_the_cache(paraphrasers):
    paraphraser = pipeline("text2text-generation", model=str(paraphrasers["resonance"]), trust_remote_code=True)
    for settings in ({}, {"novelty": 0.5, "keep_details": 1.0}):
        cached = paraphraser(SOURCES, num_return_sequences=2, **settings)
        uncached = paraphraser(SOURCES, num_return_sequences=2, use_cache=False, **settings)
        assert cached == uncached, settings


@pytest.mark.parametrize("python", PYTHONS)
def test_remote_code_decodes_alike_with_and_without_the_cache_in_a_fresh_process(python, paraphrasers, tmp_path):
    """Every mask's checkpoint, loaded with trust_remote_code where this project is not importable: greedy, beam
    search, sampling, the static cache, novelty with keep_details and the pipeline give the same ids with and
    without the cache, greedy and beam search the ids of this process, and transformers warns of no deprecation."""
    expected = {}
    for kind in MASKS:
        model, _, inputs = load(paraphrasers[kind])
        expected[kind] = {
            mode: generate(model, inputs, use_cache=False, **MODES[mode]).sequences.tolist()
            for mode in ("greedy", "beam search")
        }
    got = run_isolated(
        python,
        f"""
        import json, logging, warnings
        import torch, transformers
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
        from transformers.dynamic_module_utils import get_class_from_dynamic_module
        messages = []
        class Collect(logging.Handler):
            def emit(self, record):
                messages.append(record.getMessage())
        logging.getLogger("transformers").addHandler(Collect())
        warnings.simplefilter("always")
        modes = {MODES!r}
        results, static_types = {{}}, {{}}
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            for kind in {list(MASKS)!r}:
                folder = {str(next(iter(paraphrasers.values())).parent)!r} + "/" + kind
                model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
                tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
                batch = tokenizer({SOURCES!r}, padding=True, return_tensors="pt")
                inputs = {{"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}}
                def run(**kwargs):
                    torch.manual_seed(0)
                    with torch.no_grad():
                        return model.generate(**inputs, **kwargs).tolist()
                found = {{}}
                for mode, settings in modes.items():
                    found[mode] = [run(use_cache=True, **settings), run(use_cache=False, **settings)]
                found["static"] = [run(cache_implementation="static", num_beams=4), run(use_cache=False, num_beams=4)]
                with torch.no_grad():
                    out = model.generate(**inputs, cache_implementation="static", return_dict_in_generate=True)
                cache = out.cache if "cache" in out else out.past_key_values  # its name on 5.24+ / 4.57
                static_types[kind] = type(cache.self_attention_cache).__name__
                paraphrase = get_class_from_dynamic_module("generation_cdnpg.paraphrase", folder)
                found["novelty"] = [
                    paraphrase(model, tokenizer, inputs, novelty=0.5, keep_details=1.0, num_return_sequences=3,
                               use_cache=cache).sequences.tolist()
                    for cache in (True, False)
                ]
                paraphraser = pipeline("text2text-generation", model=folder, trust_remote_code=True)
                found["pipeline"] = [paraphraser({SOURCES!r}, num_return_sequences=2, use_cache=cache)
                                     for cache in (True, False)]
                results[kind] = found
        messages += [str(warning.message) for warning in warned]
        print(json.dumps({{"version": transformers.__version__, "results": results, "messages": messages,
                          "static_types": static_types}}))
        """,
        cwd=tmp_path,
        env={"TRANSFORMERS_VERBOSITY": "warning"},
    )
    assert not [message for message in got["messages"] if "deprecat" in message.lower()], got["version"]
    assert set(got["static_types"].values()) == {"StaticCache"}, got["version"]
    for kind, found in got["results"].items():
        for mode, (cached, uncached) in found.items():
            assert cached == uncached, (got["version"], kind, mode)
        for mode in ("greedy", "beam search"):
            assert found[mode][0] == expected[kind][mode], (got["version"], kind, mode)


# the last commit whose model code took the cache only as `past_key_values` and dropped what it did not know
CODE_BEFORE_THE_CACHE_RENAME = "70abde4"


def code_before_the_cache_rename(name: str) -> str | None:
    """A remote-code file as cdnpg saved it before transformers 5.24 was supported, from this repository's history."""
    result = subprocess.run(
        ["git", "show", f"{CODE_BEFORE_THE_CACHE_RENAME}:modeling_cdnpg/{name}"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    return result.stdout if result.returncode == 0 else None


def greedy_in_a_fresh_process(folder: Path, cwd: Path) -> dict:
    return run_isolated(
        sys.executable,
        f"""
        import json, torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True)
        inputs = tokenizer({SOURCES!r}, padding=True, return_tensors="pt")
        with torch.no_grad():
            found = [model.generate(**inputs, num_beams=1, use_cache=cache).tolist() for cache in (True, False)]
        print(json.dumps(found))
        """,
        cwd=cwd,
    )


def test_refresh_code_replaces_the_model_code_of_an_old_checkpoint_and_nothing_else(paraphrasers, tmp_path):
    """`cdnpg refresh-code`: the checkpoint's code files become the package's, each in one step; weights, configs and
    tokenizer stay byte for byte; a second run changes nothing. With the code saved before the cache rename, where
    transformers passes `cache=` (5.24 and later), cached greedy decoding differs from uncached; after the refresh
    they agree."""
    folder = tmp_path / "old"
    shutil.copytree(paraphrasers["resonance"], folder)
    old = {name: code_before_the_cache_rename(name) for name in ("modeling_cdnpg.py", "configuration_cdnpg.py")}
    for name, code in old.items():
        (folder / name).write_text(code if code is not None else "# outdated\n" + (folder / name).read_text())
    others = {path.name: path.read_bytes() for path in folder.iterdir() if path.name not in REMOTE_CODE_FILES}
    if None not in old.values() and CACHE_NAME == "cache":
        cached, uncached = greedy_in_a_fresh_process(folder, tmp_path)
        assert cached != uncached, "the old code was expected to decode without its cache here"

    result = run_cli("refresh-code", str(folder))
    assert result.returncode == 0, result.stderr
    assert "modeling_cdnpg.py" in result.stderr and "configuration_cdnpg.py" in result.stderr
    assert "generation_cdnpg.py" not in result.stderr  # unchanged files are not rewritten
    for name in REMOTE_CODE_FILES:
        assert (folder / name).read_bytes() == (paraphrasers["resonance"] / name).read_bytes(), name
    assert {path.name: path.read_bytes() for path in folder.iterdir() if path.name not in REMOTE_CODE_FILES} == others
    cached, uncached = greedy_in_a_fresh_process(folder, tmp_path)
    assert cached == uncached
    again = run_cli("refresh-code", str(folder))
    assert again.returncode == 0 and "already this package's" in again.stderr


@pytest.mark.parametrize(
    "config, message",
    [(None, "no config.json, not a checkpoint folder"), ({"model_type": "bart"}, "model_type 'bart', not a C-DNPG")],
)
def test_refresh_code_refuses_a_folder_that_is_not_a_cdnpg_checkpoint(tmp_path, config, message):
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    result = run_cli("refresh-code", str(tmp_path))
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == (["config.json"] if config else [])
