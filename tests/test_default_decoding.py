"""A checkpoint's default paraphrasing: run.py's --generation_novelty / --generation_keep_details go
into the generation config, the test split is decoded with them as the pipeline decodes the checkpoint called without
arguments, the card says so, and the shipped warm recipe is what the stated rule picks from the measured table."""

import json
import re
from pathlib import Path

import pytest
import yaml

import cdnpg.training.trainer as trainer_module
from cdnpg.training import UsageError, main, parse_args
from tests.conftest import printed_scores
from tests.test_training import TINY

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "training" / "configs" / "minilm_quora.yaml"
RULE_SECTION = "## What the recipe ships"
RARE_KEPT_AT_LEAST, BLEU4_AT_LEAST = 55.0, 28.0  # the rule of docs/benchmarks.md, as its text states it


def squeezed(text: str) -> str:
    """A text without its spaces: the Trainer's batch_decode and the pipeline clean up spaces differently."""
    return "".join(text.split())


@pytest.fixture
def paraphrase_calls(monkeypatch) -> list[dict]:
    """Every call of paraphrase() by the Trainer's prediction step, recorded, the real function still run."""
    calls, real = [], trainer_module.paraphrase

    def spy(model, tokenizer, inputs, **kwargs):
        calls.append({"rows": inputs["input_ids"].shape[0], **kwargs})
        return real(model, tokenizer, inputs, **kwargs)

    monkeypatch.setattr(trainer_module, "paraphrase", spy)
    return calls


def test_a_default_novelty_decodes_the_test_split_as_the_pipeline_called_without_arguments(tmp_path, paraphrase_calls):
    output = tmp_path / "out"
    flags = ["--generation_novelty", "0.5", "--generation_keep_details", "0.25", "--generation_num_beams", "2"]
    main(["--output_dir", str(output), *TINY, "--max_steps", "6", "--do_train", "--do_predict", *flags])
    generation = json.loads((output / "generation_config.json").read_text())
    assert generation["novelty"] == 0.5 and generation["keep_details"] == 0.25 and generation["num_beams"] == 2
    assert sum(call["rows"] for call in paraphrase_calls) == 16  # every test pair, through paraphrase()
    assert all(call["num_beams"] == 2 for call in paraphrase_calls)  # with the run's decoding settings

    from transformers import pipeline

    paraphraser = pipeline("text2text-generation", model=str(output), trust_remote_code=True)
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    # run.py cuts sources at --max_source_length (20 tokens), the pipeline only at the model's limit
    rows = [row for row in rows if len(paraphraser.tokenizer(row["source"])["input_ids"]) <= 20]
    assert len(rows) >= 8
    unasked = paraphraser([row["source"] for row in rows], batch_size=len(rows))
    assert [squeezed(row["prediction"]) for row in rows] == [squeezed(c[0]["generated_text"]) for c in unasked]
    assert all(set(candidate[0]) > {"generated_text", "score"} for candidate in unasked)  # paraphrase()'s output

    card = (output / "README.md").read_text()
    assert "Default decoding" in card and "`novelty=0.5, keep_details=0.25`" in card


def test_without_a_default_the_test_split_is_plain_beam_search_and_the_card_names_no_rule(tmp_path, paraphrase_calls):
    output = tmp_path / "out"
    main(["--output_dir", str(output), *TINY, "--max_steps", "4", "--do_train", "--do_predict",
          "--generation_num_beams", "2"])  # fmt: skip
    generation = json.loads((output / "generation_config.json").read_text())
    assert "novelty" not in generation and "keep_details" not in generation
    assert paraphrase_calls == []
    assert "Default decoding" not in (output / "README.md").read_text()


@pytest.mark.parametrize("flag", ["--generation_novelty", "--generation_keep_details"])
@pytest.mark.parametrize("value", ["1.5", "-0.1"])
def test_a_default_strength_outside_0_to_1_is_one_error_naming_the_flag(tmp_path, flag, value):
    with pytest.raises(UsageError, match=f"{flag} must be between 0 and 1, got {value}"):
        parse_args(["--output_dir", str(tmp_path), *TINY, "--do_train", flag, value])


def measured_rows() -> list[dict]:
    """The table of docs/benchmarks.md's section that states the rule: settings (run.py flags), and the figures."""
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = text.split(RULE_SECTION, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| settings")]
    rows = []
    for line in lines:
        settings, bleu4, ibleu, rare, _copies = [cell.strip() for cell in line.strip("|").split("|")]
        flags = {} if settings.startswith("(") else dict(item.split("=") for item in settings.split(", "))
        rows.append({"flags": flags, "bleu4": float(bleu4), "ibleu": float(ibleu), "rare": float(rare)})
    return rows


def test_the_shipped_warm_recipe_is_what_the_stated_rule_picks_from_the_measured_table():
    rows = measured_rows()
    assert len(rows) >= 10
    eligible = [row for row in rows if row["rare"] >= RARE_KEPT_AT_LEAST and row["bleu4"] >= BLEU4_AT_LEAST]
    chosen = max(eligible, key=lambda row: row["ibleu"])
    recipe = yaml.safe_load(RECIPE.read_text())
    every_flag = {flag for row in rows for flag in row["flags"]}
    shipped = {flag: str(recipe[flag]).lower() for flag in every_flag if flag in recipe}
    assert shipped == chosen["flags"]
    # and run.py reads the recipe so: every key a flag, the chosen values in the parsed arguments
    parsed = {}
    for arguments in parse_args([str(RECIPE), "--output_dir", "runs/unused", "--quora_file", "quora.tsv"]):
        parsed |= vars(arguments)
    assert {flag: str(parsed[flag]).lower() for flag in chosen["flags"]} == chosen["flags"]
    # the docs name the same choice in words, and the recipe's comment gives its figures
    named = ", ".join(f"{flag}={value}" for flag, value in chosen["flags"].items())
    assert f"**`{named}`**" in (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert re.search(rf"\b{chosen['ibleu']}\b true iBLEU", RECIPE.read_text())


@pytest.mark.filterwarnings("ignore:novelty. this checkpoint's granularity is not calibrated")
def test_the_cli_called_without_decoding_flags_prints_the_checkpoints_default_paraphrases(tmp_path):
    """`cdnpg paraphrase` on a checkpoint with a default novelty decodes as the pipeline called without arguments,
    candidates and scores, and asks for no more beams than the checkpoint's (novelty decodes one search each)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig

    from modeling_cdnpg import CDNPGText2TextPipeline
    from tests.test_cli import SENTENCE, run_cli, save_tiny, train_tokenizer

    folder = save_tiny(tmp_path / "tiny", train_tokenizer())
    config = GenerationConfig.from_pretrained(folder)
    config.num_beams, config.max_new_tokens, config.novelty = (
        2,
        20,
        0.5,
    )  # the CLI stretches a shorter limit to the input
    config._from_model_config = False  # else from_pretrained makes the config anew from config.json, as run.py saves
    config.save_pretrained(folder)
    printed = run_cli("paraphrase", "--model", str(folder), "-n", "3", SENTENCE)
    assert printed.returncode == 0, printed.stderr[-3000:]
    assert "beams to return" not in printed.stderr  # the checkpoint's 2 beams kept: novelty needs no more
    fields = printed.stdout.strip().split("\t")
    texts, scores = fields[0::2], fields[1::2]

    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    paraphraser = CDNPGText2TextPipeline(model=model, tokenizer=AutoTokenizer.from_pretrained(folder), device="cpu")
    unasked = paraphraser(SENTENCE, num_return_sequences=3)
    assert texts == [" ".join(c["generated_text"].split()) for c in unasked]
    assert len(scores) == len(unasked)
    assert all(score in printed_scores(c["score"]) for score, c in zip(scores, unasked))  # computed in another process


ALONE = {  # each paraphrasing default a generation config may hold, set alone
    "novelty": 0.5,
    "keep_details": 0.5,
    "rank_by": "score+reverse_likelihood",
    "num_candidates": 3,
}


@pytest.mark.filterwarnings("ignore:novelty. this checkpoint's granularity is not calibrated")
@pytest.mark.parametrize("name", list(ALONE))
def test_each_paraphrasing_default_alone_is_decoded_and_described_alike_by_pipeline_cli_run_py_and_card(
    tmp_path, name, paraphrase_calls, capsys
):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig

    from cdnpg.cli import main as cli
    from cdnpg.training.arguments import without_flags
    from modeling_cdnpg import CDNPGText2TextPipeline
    from modeling_cdnpg.generation_cdnpg import paraphrasing_defaults
    from tests.test_cli import save_tiny, train_tokenizer
    from tests.test_distributed import ARCHITECTURE

    folder = save_tiny(tmp_path / "tiny", train_tokenizer())
    config = GenerationConfig.from_pretrained(folder)
    config.num_beams, config.max_new_tokens = 3, 20
    setattr(config, name, ALONE[name])
    config._from_model_config = False  # else from_pretrained makes the config anew from config.json
    config.save_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    assert paraphrasing_defaults(model.generation_config) == {name: ALONE[name]}

    # run.py's test predictions, from the checkpoint: through paraphrase(), which ranks and scores
    output = tmp_path / "predicted"
    kept = without_flags(TINY, [flag.removeprefix("--") for flag in ARCHITECTURE])  # the checkpoint brings them
    main(["--output_dir", str(output), *kept, "--model_name_or_path", str(folder), "--do_predict",
          "--do_train", "false", "--do_eval", "false", "--max_predict_samples", "6", "--generation_num_beams", "3",
          "--max_source_length", "62"])  # fmt: skip  # no source cut: the pipeline cuts only at the model's limit
    assert sum(call["rows"] for call in paraphrase_calls) == 6
    assert json.loads((output / "generation_config.json").read_text())[name] == ALONE[name]  # kept by the save
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]

    # the pipeline called without settings: the same candidates, scored
    paraphraser = CDNPGText2TextPipeline(model=model, tokenizer=AutoTokenizer.from_pretrained(folder), device="cpu")
    unasked = paraphraser([row["source"] for row in rows], batch_size=len(rows))
    assert [squeezed(row["prediction"]) for row in rows] == [squeezed(c[0]["generated_text"]) for c in unasked]
    assert all("score" in candidates[0] for candidates in unasked)

    # the command line, called without decoding flags (its length the checkpoint's: the CLI stretches it to a longer
    # input, which the tiny vocabulary makes of every sentence): the pipeline's first candidate and score
    capsys.readouterr()
    assert cli(["paraphrase", "--model", str(folder), "--max-new-tokens", "20", rows[0]["source"]]) == 0
    text, score = capsys.readouterr().out.strip().split("\t")
    assert text == " ".join(unasked[0][0]["generated_text"].split())
    assert score in printed_scores(unasked[0][0]["score"])  # decoded alone here, in a batch of 6 there

    # the card names it
    value = repr(ALONE[name]) if isinstance(ALONE[name], str) else ALONE[name]
    assert f"`{name}={value}`" in (output / "README.md").read_text()
