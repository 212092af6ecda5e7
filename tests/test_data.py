"""Tests for cdnpg.data: the template corpus, local pair files, the paper's corpora and the tokenizer."""

from __future__ import annotations

import csv
import hashlib
import json
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from cdnpg.data import (
    MODEL_INPUT_NAMES,
    PORTABLE_TOKENIZER_CLASS,
    SLOT_FILLERS,
    TEMPLATE_FAMILIES,
    UnknownWordMapper,
    load_pair_files,
    load_tokenizer,
    normalize_text,
    prepare_quora,
    prepare_twitter_url,
    save_tokenizer,
    template_corpus,
    template_slots,
    train_wordpiece_tokenizer,
    write_template_corpus,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
RAW_SAMPLES = SHARED / "data" / "raw_samples"
BERT_TOKENIZER = SHARED / "tokenizers" / "bert-base-uncased"


def contains_phrase(sentence: str, phrase: str) -> bool:
    """Whole-token match, so that "9" is not found inside "2019"."""
    return f" {phrase} " in f" {sentence} "


@pytest.fixture(scope="module")
def corpus():
    return template_corpus(num_train=3000, num_valid=300, num_test=300, seed=0, with_metadata=True)


# --------------------------------------------------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("What's the weight?", "what ' s the weight ?"),
        ("  Drug-resistant   superbug , CRE ", "drug - resistant superbug , cre"),
        ("Which café is best?", "which cafe is best ?"),
        ("facebook lets you cast videos to your&nbsp;tv", "facebook lets you cast videos to your & nbsp ; tv"),
    ],
)
def test_normalize_text_matches_the_papers_bert_basic_format(raw, expected):
    assert normalize_text(raw) == expected


def test_normalize_text_maps_words_outside_the_bert_vocabulary_to_unk_like_the_papers_data():
    if not BERT_TOKENIZER.is_dir():
        pytest.skip(f"shared tokenizer not found at {BERT_TOKENIZER}")
    unknown_words = UnknownWordMapper(BERT_TOKENIZER)
    assert normalize_text("What is Kaizen (改善)? 😀", unknown_words) == "what is kaizen ( [UNK] [UNK] ) ? [UNK]"
    assert normalize_text("What is Kaizen (改善)?") == "what is kaizen ( 改 善 ) ?"


def test_normalize_text_leaves_the_papers_released_sentences_unchanged():
    files = [SHARED / "data" / name for name in ("quora/valid.jsonl", "twitterurl/valid.jsonl")]
    if not all(path.is_file() for path in files):
        pytest.skip(f"shared data not found at {SHARED}")
    sentences = [
        record[column]
        for path in files
        for record in map(json.loads, path.read_text(encoding="utf-8").splitlines())
        for column in ("source", "target")
    ]
    changed = [s for s in sentences if "[UNK]" not in s and normalize_text(s) != s]  # "[UNK]" re-splits to "[ unk ]"
    assert not changed


# --------------------------------------------------------------------------------------------------------------------
# Template corpus
# --------------------------------------------------------------------------------------------------------------------


def test_template_corpus_is_deterministic_for_a_seed_and_changes_with_the_seed():
    first = template_corpus(num_train=200, num_valid=20, num_test=20, seed=3)
    again = template_corpus(num_train=200, num_valid=20, num_test=20, seed=3)
    other = template_corpus(num_train=200, num_valid=20, num_test=20, seed=4)
    for split in ("train", "valid", "test"):
        assert first[split].to_dict() == again[split].to_dict()
        assert first[split]["source"] != other[split]["source"]
    assert first.column_names == {split: ["source", "target"] for split in ("train", "valid", "test")}


# sha256 of template_corpus(seed=0) with the default sizes, recorded before the word lists moved from Python to
# template_corpus.json: the README's results were trained on this corpus and must stay reproducible.
TEMPLATE_CORPUS_SEED_0_SHA256 = "cd9267b71c9875eaa298482ab272943bb2f167e3af6c8bf08c45d9615e390dc7"


def test_template_corpus_of_seed_0_is_the_one_the_published_results_were_trained_on():
    corpus = template_corpus(seed=0)
    digest = hashlib.sha256()
    for split in ("train", "valid", "test"):
        for source, target in zip(corpus[split]["source"], corpus[split]["target"]):
            digest.update(json.dumps([split, source, target]).encode() + b"\n")
    assert digest.hexdigest() == TEMPLATE_CORPUS_SEED_0_SHA256


def test_template_corpus_has_requested_sizes_and_unique_pairs(corpus):
    assert {split: len(data) for split, data in corpus.items()} == {"train": 3000, "valid": 300, "test": 300}
    for data in corpus.values():
        pairs = list(zip(data["source"], data["target"]))
        assert len(set(pairs)) == len(pairs)


def test_template_targets_paraphrase_rather_than_copy_the_source(corpus):
    for data in corpus.values():
        pairs = list(zip(data["source"], data["target"]))
        assert all(source != target for source, target in pairs)
        reordered_or_reworded = sum(source.split() != target.split() for source, target in pairs)
        assert reordered_or_reworded == len(pairs)


def test_every_slot_filler_of_the_source_is_copied_into_the_target(corpus):
    for data in corpus.values():
        for source, target, fillers in zip(data["source"], data["target"], data["fillers"]):
            assert fillers
            for filler in fillers:
                assert contains_phrase(source, filler), (source, filler)
                assert contains_phrase(target, filler), (target, filler)


def test_held_out_fillers_never_occur_in_train_but_fill_most_test_pairs(corpus):
    held_out = [filler for pool in SLOT_FILLERS.values() for filler in pool.held_out]
    train_sentences = list(corpus["train"]["source"]) + list(corpus["train"]["target"])
    leaked = {filler for filler in held_out for sentence in train_sentences if contains_phrase(sentence, filler)}
    assert not leaked
    for split in ("valid", "test"):
        with_held_out = sum(any(f in held_out for f in fillers) for fillers in corpus[split]["fillers"])
        assert with_held_out > 0.5 * len(corpus[split])


def test_valid_and_test_sources_are_never_seen_in_earlier_splits(corpus):
    train, valid, test = (set(corpus[split]["source"]) for split in ("train", "valid", "test"))
    assert not train & valid
    assert not (train | valid) & test


def test_template_families_share_slots_and_use_known_disjoint_filler_pools():
    assert 30 <= len(TEMPLATE_FAMILIES) <= 60
    for family in TEMPLATE_FAMILIES:
        assert 2 <= len(family) <= 4
        assert len(set(family)) == len(family)
        slot_sets = {frozenset(template_slots(template)) for template in family}
        assert len(slot_sets) == 1, family
        assert all(slot_type in SLOT_FILLERS for _, slot_type in template_slots(family[0]))
    for slot_type, pool in SLOT_FILLERS.items():
        assert not set(pool.seen) & set(pool.held_out), slot_type
        assert len(pool.held_out) >= 2, slot_type  # two slots of one type need two different fillers


def test_template_text_is_lowercased_pretokenized_and_short(corpus):
    sentences = [s for data in corpus.values() for column in ("source", "target") for s in data[column]]
    assert all(normalize_text(sentence) == sentence for sentence in sentences)
    assert max(len(sentence.split()) for sentence in sentences) <= 20


def test_write_template_corpus_round_trips_through_load_pair_files(tmp_path):
    paths = write_template_corpus(tmp_path, num_train=50, num_valid=10, num_test=10, seed=1)
    assert sorted(path.name for path in paths.values()) == ["test.jsonl", "train.jsonl", "valid.jsonl"]
    loaded, report = load_pair_files({split: str(path) for split, path in paths.items()})
    expected = template_corpus(num_train=50, num_valid=10, num_test=10, seed=1)
    assert report.malformed == 0
    for split in ("train", "valid", "test"):
        assert loaded[split].to_dict() == expected[split].to_dict()


# --------------------------------------------------------------------------------------------------------------------
# Local pair files
# --------------------------------------------------------------------------------------------------------------------

PAIRS = [
    ("how do i learn python ?", "what is the best way to learn python ?"),
    ("is it safe , really ?", 'yes, "it" is'),
]


def write_pairs(path: Path, columns: tuple[str, str]) -> None:
    """Write PAIRS with an extra "id" column in front and "label" between the two text columns."""
    first, second = columns
    if path.suffix == ".jsonl":
        lines = [json.dumps({"id": i, first: s, "label": 1, second: t}) for i, (s, t) in enumerate(PAIRS)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return
    rows = [["id", first, "label", second]] + [[str(i), s, "1", t] for i, (s, t) in enumerate(PAIRS)]
    if path.suffix == ".tsv":  # plain TSV: no quoting, quote characters are text
        path.write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")
        return
    with path.open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows(rows)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".tsv"])
@pytest.mark.parametrize("columns", [("source", "target"), ("sentence1", "sentence2")])
def test_load_pair_files_reads_each_format_with_configurable_columns(tmp_path, suffix, columns):
    path = tmp_path / f"train{suffix}"
    write_pairs(path, columns)
    loaded, report = load_pair_files({"train": str(path)}, source_column=columns[0], target_column=columns[1])
    assert loaded["train"].column_names == ["source", "target"]
    assert list(zip(loaded["train"]["source"], loaded["train"]["target"])) == PAIRS
    assert report.split_sizes == {"train": 2}
    assert report.malformed == 0


def test_malformed_jsonl_lines_are_counted_with_line_numbers(tmp_path, caplog):
    path = tmp_path / "valid.jsonl"
    lines = [
        '{"source": "a ?", "target": "b ?"}',
        '{"source": "broken", "target": ',  # line 2: bad JSON
        "",  # blank lines are ignored, not malformed
        '{"source": "c ?"}',  # line 4: missing target
        '{"source": "   ", "target": "d ?"}',  # line 5: empty source
        '["e", "f"]',  # line 6: not an object
        '{"source": "g ?", "target": 7}',  # line 7: not a string
        '{"source": "h ?", "target": "i ?"}',
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="cdnpg.data"):
        loaded, report = load_pair_files({"valid": str(path)})
    assert list(zip(loaded["valid"]["source"], loaded["valid"]["target"])) == [("a ?", "b ?"), ("h ?", "i ?")]
    file_report = report.files["valid"]
    assert (file_report.records, file_report.kept, file_report.malformed) == (7, 2, 5)
    assert [line for line, _ in file_report.malformed_lines] == [2, 4, 5, 6, 7]
    assert "5 malformed" in caplog.text and "line 2" in caplog.text
    assert report.to_dict()["files"]["valid"]["malformed"] == 5


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_rows_with_a_wrong_field_count_are_reported_and_never_shift_columns(tmp_path, suffix):
    sep = "," if suffix == ".csv" else "\t"
    rows = [
        ["source", "target"],
        ["one ?", "uno ?"],
        ["two ?", "dos ?", "extra"],  # line 3: three fields
        ["three ?"],  # line 4: one field
        ["four ?", ""],  # line 5: empty target
        ["five ?", "cinco ?"],
    ]
    path = tmp_path / f"test{suffix}"
    path.write_text("\n".join(sep.join(row) for row in rows) + "\n", encoding="utf-8")
    loaded, report = load_pair_files({"test": str(path)})
    assert list(zip(loaded["test"]["source"], loaded["test"]["target"])) == [("one ?", "uno ?"), ("five ?", "cinco ?")]
    assert [line for line, _ in report.files["test"].malformed_lines] == [3, 4, 5]
    assert "expected 2 fields, got 3" in report.files["test"].malformed_lines[0][1]


def test_csv_fields_may_hold_quoted_commas_and_newlines_and_keep_line_numbers(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text(
        'source,target\n"a, b ?","c\nd ?"\n"only one field"\n"e ?","f ?"\n',
        encoding="utf-8",
    )
    loaded, report = load_pair_files({"train": str(path)})
    assert list(zip(loaded["train"]["source"], loaded["train"]["target"])) == [("a, b ?", "c\nd ?"), ("e ?", "f ?")]
    assert report.files["train"].malformed_lines[0][0] == 4  # the record after the two-line one starts on line 4


def test_jsonl_records_end_only_at_line_breaks_and_an_empty_file_is_an_empty_split(tmp_path):
    path = tmp_path / "train[v2]*.jsonl"  # a file name, not a glob pattern
    records = [{"source": "a\u2028b ?", "target": "c\x0cd ?"}, {"source": "e ?", "target": "f ?"}]
    path.write_bytes(b"\r\n".join(json.dumps(r, ensure_ascii=False).encode() for r in records) + b"\r\n")
    empty = tmp_path / "valid.jsonl"
    empty.write_text("", encoding="utf-8")
    loaded, report = load_pair_files({"train": str(path), "valid": str(empty)})
    assert loaded["train"].to_list() == records  # U+2028 and form feeds are text inside a line, CRLF ends it
    assert report.split_sizes == {"train": 2, "valid": 0}
    assert loaded["valid"].column_names == ["source", "target"]


def test_a_file_with_no_usable_record_is_a_format_error_not_an_empty_split(tmp_path):
    path = tmp_path / "train.json"
    records = [{"source": "a ?", "target": "b ?"}, {"source": "c ?", "target": "d ?"}]
    path.write_text(json.dumps(records, indent=2), encoding="utf-8")  # a JSON array, not JSON lines
    with pytest.raises(ValueError, match="no usable pair"):
        load_pair_files({"train": str(path)})


def test_load_pair_files_errors_name_the_problem(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        load_pair_files({"train": str(missing)})
    odd = tmp_path / "train.parquet"
    odd.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\.parquet.*\.jsonl, \.json, \.csv, \.tsv"):
        load_pair_files({"train": str(odd)})
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text('{"question": "a ?", "target": "b ?"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"'source'.*\['question', 'target'\]"):
        load_pair_files({"train": str(jsonl)})
    tsv = tmp_path / "train.tsv"
    tsv.write_text("q1\tq2\na ?\tb ?\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"'source'.*\['q1', 'q2'\]"):
        load_pair_files({"train": str(tsv)})


# --------------------------------------------------------------------------------------------------------------------
# Quora Question Pairs
# --------------------------------------------------------------------------------------------------------------------

QUORA_HEADER = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]


def write_quora(path: Path, n_generated: int = 40) -> None:
    """Kaggle-format Quora file: quoted fields with delimiters and a newline inside, a non-duplicate, bad rows."""
    delimiter = "," if path.suffix == ".csv" else "\t"
    rows = [
        [0, 1, 2, "How do I lose weight, fast?", "What is the fastest way to lose weight?", 1],
        [1, 3, 4, "Is this\ta question?", "What's the weight?", 1],  # a tab inside a quoted field
        [2, 5, 6, "What is the step by step guide to invest in share market?", "How do I invest?", 0],
        [3, 7, 8, "Why is the sky\nblue?", "What makes the sky blue?", 1],  # a newline inside a quoted field
    ]
    rows += [
        [10 + i, 100 + 2 * i, 101 + 2 * i, f"Question {i}?", f"Same question {i}?", 1] for i in range(n_generated)
    ]
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter=delimiter, quoting=csv.QUOTE_ALL)
        writer.writerow(QUORA_HEADER)
        writer.writerows(rows[:4])
        handle.write(delimiter.join(['"4"', '"9"', '"only four fields?"', '"1"']) + "\n")  # malformed row, line 7
        writer.writerow([5, 11, 12, "A?", "B?", "maybe"])  # malformed label, line 8
        writer.writerows(rows[4:])


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_prepare_quora_keeps_duplicates_normalises_and_splits_by_seed(tmp_path, suffix):
    path = tmp_path / f"quora_duplicate_questions{suffix}"
    write_quora(path)
    splits, report = prepare_quora(path, seed=7, train_size=None, valid_size=5, test_size=10)
    assert report.split_sizes == {"train": 28, "valid": 5, "test": 10}  # 3 + 40 duplicates
    pairs = {pair for data in splits.values() for pair in zip(data["source"], data["target"])}
    assert ("how do i lose weight , fast ?", "what is the fastest way to lose weight ?") in pairs
    assert ("is this a question ?", "what ' s the weight ?") in pairs
    assert ("why is the sky blue ?", "what makes the sky blue ?") in pairs
    assert not any("invest" in source for source, _ in pairs)
    file_report = report.files["quora"]
    assert (file_report.kept, file_report.filtered, file_report.malformed) == (43, 1, 2)
    assert [line for line, _ in file_report.malformed_lines] == [7, 8]  # the newline row spans lines 5-6
    again, _ = prepare_quora(path, seed=7, train_size=None, valid_size=5, test_size=10)
    other, _ = prepare_quora(path, seed=8, train_size=None, valid_size=5, test_size=10)
    assert again["test"].to_dict() == splits["test"].to_dict()
    assert other["test"]["source"] != splits["test"]["source"]


def test_prepare_quora_keeps_raw_text_when_normalisation_is_off(tmp_path):
    path = tmp_path / "train.csv"
    write_quora(path, n_generated=0)
    splits, _ = prepare_quora(path, train_size=1, valid_size=1, test_size=1, normalize=False)
    sources = {source for data in splits.values() for source in data["source"]}
    assert "How do I lose weight, fast?" in sources
    assert "Why is the sky blue?" in sources  # whitespace (the embedded newline) is still collapsed


def test_prepare_quora_can_map_unknown_words_to_unk_like_the_paper(tmp_path):
    if not BERT_TOKENIZER.is_dir():
        pytest.skip(f"shared tokenizer not found at {BERT_TOKENIZER}")
    path = tmp_path / "train.csv"
    with path.open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows([QUORA_HEADER, [0, 1, 2, "What is Kaizen (改善)?", "Define kaizen?", 1]])
    splits, _ = prepare_quora(path, train_size=1, valid_size=0, test_size=0, unk_vocab=BERT_TOKENIZER)
    assert splits["train"][0] == {"source": "what is kaizen ( [UNK] [UNK] ) ?", "target": "define kaizen ?"}


def test_prepare_quora_refuses_or_scales_a_file_smaller_than_the_papers_split(tmp_path):
    path = tmp_path / "train.csv"
    write_quora(path, n_generated=97)  # 100 duplicates
    with pytest.raises(ValueError, match="100 pairs available but 124000 requested"):
        prepare_quora(path)
    _, report = prepare_quora(path, scale_if_short=True)
    assert report.split_sizes == {"train": 80, "valid": 3, "test": 16}
    assert any("scaled" in note for note in report.notes)


def test_prepare_quora_can_drop_train_pairs_that_share_a_sentence_with_test(tmp_path):
    path = tmp_path / "train.csv"
    rows = [[i, 2 * i, 2 * i + 1, f"Shared {i % 5}?", f"Other {i}?", 1] for i in range(40)]
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(QUORA_HEADER)
        writer.writerows(rows)
    splits, report = prepare_quora(path, train_size=None, valid_size=5, test_size=5, drop_overlap=True)
    later = {
        s
        for split in ("valid", "test")
        for pair in zip(splits[split]["source"], splits[split]["target"])
        for s in pair
    }
    assert not later & set(splits["train"]["source"])
    assert report.split_sizes["train"] < 30


# --------------------------------------------------------------------------------------------------------------------
# Twitter URL corpus
# --------------------------------------------------------------------------------------------------------------------


def positive_count(path: Path) -> int:
    """Independent count of raw lines whose first rating number is above 3."""
    count = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        first_rating = re.search(r"\t\((\d+),\d+\)\t", line)
        count += first_rating is not None and int(first_rating.group(1)) > 3
    return count


@pytest.fixture
def twitter_files(tmp_path):
    if not RAW_SAMPLES.is_dir():
        pytest.skip(f"shared raw samples not found at {RAW_SAMPLES}")
    labelled = tmp_path / "Twitter_URL_Corpus_test.txt"
    raw = (RAW_SAMPLES / "twitter_url_corpus_test_sample.txt").read_text(encoding="utf-8")
    bad_lines = "a lonely sentence\tand its friend\n" + "x y\tz w\t(high,6)\thttps://t.co/x\n"
    labelled.write_text(raw + bad_lines, encoding="utf-8")
    auto = tmp_path / "auto_train.txt"
    train_raw = (RAW_SAMPLES / "twitter_url_corpus_train_sample.txt").read_text(encoding="utf-8")
    two_columns = ["\t".join(line.split("\t")[:2]) for line in train_raw.splitlines()]
    auto.write_text("\n".join([*two_columns, "one\ttwo\tthree"]) + "\n", encoding="utf-8")
    return labelled, auto, raw.count("\n")


def test_prepare_twitter_url_keeps_exactly_the_labelled_pairs_rated_above_3(twitter_files):
    labelled, auto, n_raw = twitter_files
    expected = positive_count(RAW_SAMPLES / "twitter_url_corpus_test_sample.txt")
    assert 0 < expected < n_raw
    splits, report = prepare_twitter_url(auto, labelled, seed=0, train_size=None, valid_size=5, test_size=None)
    assert len(splits["valid"]) + len(splits["test"]) == expected
    assert len(splits["valid"]) == 5
    labelled_report = report.files["labelled:Twitter_URL_Corpus_test.txt"]
    assert (labelled_report.kept, labelled_report.filtered, labelled_report.malformed) == (
        expected,
        n_raw - expected,
        2,
    )
    assert [line for line, _ in labelled_report.malformed_lines] == [n_raw + 1, n_raw + 2]
    assert len(splits["train"]) == n_raw  # the two-column file has no ratings, so every well-formed pair is kept
    assert report.files["train"].malformed_lines[0][0] == n_raw + 1
    first = splits["train"][0]
    assert first["source"] == normalize_text(first["source"]) and not first["source"].endswith(" ")


def test_prepare_twitter_url_reproduces_a_pair_of_the_papers_validation_set():
    if not RAW_SAMPLES.is_dir():
        pytest.skip(f"shared data not found at {SHARED}")
    labelled_train = RAW_SAMPLES / "twitter_url_corpus_train_sample.txt"
    splits, _ = prepare_twitter_url(labelled_train, labelled_train, train_size=None, valid_size=0, test_size=None)
    ours = set(zip(splits["test"]["source"], splits["test"]["target"]))
    paper_lines = (SHARED / "data" / "twitterurl" / "valid.jsonl").read_text(encoding="utf-8").splitlines()
    paper = {(record["source"], record["target"]) for record in map(json.loads, paper_lines)}
    assert ours & paper  # e.g. "winnie - the - pooh is back with a new friend a penguin named penguin"


# --------------------------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(corpus):
    texts = list(corpus["train"]["source"]) + list(corpus["train"]["target"]) + ["what ' s the weight ?"] * 5
    return train_wordpiece_tokenizer(texts, vocab_size=2000, min_frequency=2)


def test_trained_tokenizer_encodes_cls_text_sep_with_pad_id_0(tokenizer):
    encoded = tokenizer("What's the weight?")
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert tokens == ["[CLS]", "what", "'", "s", "the", "weight", "?", "[SEP]"]
    assert list(encoded) == ["input_ids", "attention_mask"]
    assert tokenizer.pad_token_id == 0
    assert tokenizer.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) == [0, 1, 2, 3, 4]
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("[CLS]", "[SEP]")
    assert tokenizer.model_max_length == 128


def test_trained_tokenizer_decodes_word_pieces_back_to_readable_text(tokenizer):
    for sentence in ["what ' s the weight ?", "how can i get from reykjavik to nairobi by helicopter ?"]:
        ids = tokenizer(sentence)["input_ids"]
        assert tokenizer.decode(ids, skip_special_tokens=True) == sentence
    assert len(tokenizer.tokenize("reykjavik")) > 1  # unseen in train: split into ## pieces, decoded as one word


def test_saved_tokenizer_names_a_class_transformers_457_knows_and_reloads_identically(tokenizer, tmp_path):
    out_dir = save_tokenizer(tokenizer, tmp_path / "tok")
    config = json.loads((out_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == PORTABLE_TOKENIZER_CLASS == "PreTrainedTokenizerFast"
    sentences = ["what ' s the weight ?", "is lima safe for tourists ?"]
    for reloaded in (AutoTokenizer.from_pretrained(str(out_dir)), load_tokenizer(out_dir)):
        assert reloaded(sentences)["input_ids"] == tokenizer(sentences)["input_ids"]
        assert reloaded.pad_token_id == 0 and reloaded.eos_token == "[SEP]"


def test_load_tokenizer_reads_the_papers_bert_base_uncased():
    if not BERT_TOKENIZER.is_dir():
        pytest.skip(f"shared tokenizer not found at {BERT_TOKENIZER}")
    bert = load_tokenizer(BERT_TOKENIZER)
    ids = bert("What's the weight?")["input_ids"]
    assert bert.convert_ids_to_tokens(ids) == ["[CLS]", "what", "'", "s", "the", "weight", "?", "[SEP]"]
    assert (bert.pad_token_id, bert.bos_token_id, bert.eos_token_id) == (0, 101, 102)
    assert len(bert) == 30522


def test_the_papers_bert_tokenizer_returns_no_token_type_ids_loaded_saved_and_reloaded(tmp_path):
    """The model has no segment embeddings, and generate() refuses token_type_ids: bert-base-uncased adds them."""
    if not BERT_TOKENIZER.is_dir():
        pytest.skip(f"shared tokenizer not found at {BERT_TOKENIZER}")
    assert "token_type_ids" in AutoTokenizer.from_pretrained(BERT_TOKENIZER)("why ?")  # what this guards against
    bert = load_tokenizer(BERT_TOKENIZER)
    assert list(bert("why ?")) == list(MODEL_INPUT_NAMES)
    bert.save_pretrained(tmp_path / "plain")  # as Trainer checkpoints save it
    save_tokenizer(bert, tmp_path / "saved")
    for directory in (tmp_path / "plain", tmp_path / "saved"):
        assert list(AutoTokenizer.from_pretrained(directory)(["why ?", "how so ?"], padding=True)) == list(
            MODEL_INPUT_NAMES
        )
    config = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["model_input_names"] == list(MODEL_INPUT_NAMES)


def test_load_tokenizer_fails_clearly_on_a_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-tokenizer"):
        load_tokenizer(tmp_path / "no-such-tokenizer")


def test_both_directions_adds_each_pair_reversed_once():
    from datasets import Dataset

    from cdnpg.data import both_directions

    pairs = Dataset.from_dict({"source": ["a", "c", "d", "e"], "target": ["b", "d", "c", "e"]})
    doubled = both_directions(pairs)
    assert list(zip(doubled["source"], doubled["target"])) == [
        ("a", "b"), ("c", "d"), ("d", "c"), ("e", "e"), ("b", "a"),  # (d, c), (c, d) and (e, e) were there already
    ]  # fmt: skip


def test_near_copy_bleu_is_sacrebleus_sentence_bleu_of_target_against_source():
    """100 for a copy (case aside), 0 for no shared word, and by hand in between: 5 of 7 unigrams, 2 of 6 bigrams,
    1 of 5 trigrams and no 4-gram of 4 shared, which sacreBLEU's exp smoothing counts as 1 / (2 * 4), and no brevity
    penalty: (5/7 * 2/6 * 1/5 * 1/8) ** (1/4) = 27.78."""
    import sacrebleu
    from datasets import Dataset

    from cdnpg.data import near_copy_bleu

    pairs = Dataset.from_dict(
        {
            "source": ["how do i learn python ?", "why is the sky blue ?", "how do i learn python fast ?"],
            "target": ["How do I learn Python ?", "what makes water wet", "how do i study python quickly ?"],
        }
    )
    scores = near_copy_bleu(pairs)
    assert scores[:2] == [pytest.approx(100.0), 0.0]
    stats = sacrebleu.BLEU(lowercase=True, effective_order=True).sentence_score(
        pairs["target"][2], [pairs["source"][2]]
    )
    assert scores[2] == pytest.approx(stats.score) and scores[2] == pytest.approx(
        100 * (5 / 7 * 2 / 6 * 1 / 5 * 1 / 8) ** 0.25
    )


def test_drop_near_copies_keeps_the_pairs_below_the_bleu_and_refuses_a_bleu_outside_0_100():
    from datasets import Dataset

    from cdnpg.data import drop_near_copies, near_copy_bleu

    pairs = Dataset.from_dict(
        {
            "source": ["how do i learn python ?", "why is the sky blue ?", "how do i learn python fast ?"],
            "target": ["how do i learn python ?", "what makes water wet", "how do i study python quickly ?"],
        }
    )
    middle = near_copy_bleu(pairs)[2]
    assert drop_near_copies(pairs, 100)["target"] == pairs["target"][1:]  # only the copy reaches 100
    assert drop_near_copies(pairs, middle)["target"] == ["what makes water wet"]  # at the BLEU is dropped
    assert drop_near_copies(pairs, middle + 0.01)["target"] == pairs["target"][1:]
    for wrong in (0, -5, 100.5):
        with pytest.raises(ValueError, match=rf"max_bleu must be in \(0, 100\], got {wrong}"):
            drop_near_copies(pairs, wrong)


def test_the_drop_near_copies_flag_filters_the_training_split_only_before_both_directions(tmp_path):
    from cdnpg.training import UsageError, load_pairs, parse_args

    train, other = tmp_path / "train.jsonl", tmp_path / "other.jsonl"
    rows = [("how do i learn python ?", "how do i learn python ?"), ("why is the sky blue ?", "what makes it blue")]
    train.write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in rows))
    other.write_text(train.read_text())
    flags = ["--output_dir", "unused", "--do_train", "--train_file", str(train), "--validation_file", str(other)]
    corpus, _ = load_pairs(parse_args([*flags, "--drop_near_copies", "90", "--both_directions", "True"])[1])
    assert list(zip(corpus["train"]["source"], corpus["train"]["target"])) == [rows[1], rows[1][::-1]]
    assert len(corpus["validation"]) == 2  # evaluation data is never filtered
    with pytest.raises(UsageError, match=r"--drop_near_copies 5\.0 leaves no training pair"):
        load_pairs(parse_args([*flags, "--drop_near_copies", "5"])[1])
    for wrong in ("0", "101"):
        with pytest.raises(UsageError, match=rf"--drop_near_copies takes a BLEU in \(0, 100\], got {float(wrong)}"):
            parse_args([*flags, "--drop_near_copies", wrong])


def test_the_both_directions_flag_doubles_the_training_split_only():
    from cdnpg.training import load_pairs, parse_args

    flags = ["--output_dir", "unused", "--do_train", "--template_sizes", "64", "8", "8"]
    plain, _ = load_pairs(parse_args(flags)[1])
    doubled, _ = load_pairs(parse_args([*flags, "--both_directions", "True"])[1])
    assert len(doubled["train"]) == 2 * len(plain["train"])
    assert doubled["train"][len(plain["train"])] == {
        "source": plain["train"][0]["target"],
        "target": plain["train"][0]["source"],
    }
    assert doubled["validation"][:] == plain["validation"][:] and doubled["test"][:] == plain["test"][:]
