"""Loaders (CSV, TSV, JSONL), their error paths, the data-dir resolution and the registry."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.base import ClassificationTask, Example
from dp_textgrad.tasks.loaders import (
    DATA_ENV_VAR,
    build_task_from_files,
    load_classification_file,
    resolve_data_dir,
    subsample,
)
from dp_textgrad.tasks.registry import (
    BANKING77_INTENTS,
    BANKING77_PUBLIC_EXAMPLES,
    SST2_PUBLIC_EXAMPLES,
    available_tasks,
    get_task,
)

SECRET = "Ophelia Quarrington 0771234"  # stands for private text: must never appear in errors


def write(path: Path, content: str) -> Path:
    path.write_text(content, encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[object]) -> Path:
    return write(path, "".join(json.dumps(r) + "\n" for r in rows))


# -- happy paths --------------------------------------------------------------------------
def test_csv_with_quoted_comma_and_bom(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes("\ufefftext,label\n\"hello, world\",a\n  spaced  ,b\n".encode("utf-8"))
    assert load_classification_file(path) == [Example("hello, world", "a"), Example("spaced", "b")]


def test_tsv_with_quoted_multiline_field(tmp_path: Path) -> None:
    path = write(tmp_path / "d.tsv", 'id\ttext\tlabel\n1\t"first line\nsecond line"\tx\n2\tplain\ty\n')
    examples = load_classification_file(path)
    assert examples == [Example("first line\nsecond line", "x"), Example("plain", "y")]


def test_jsonl_with_numeric_labels_and_label_names(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"sentence": "good", "y": 1}, {"sentence": "bad", "y": 0},
                                              {"sentence": "ok", "y": 1.0}])
    examples = load_classification_file(path, text_column="sentence", label_column="y",
                                        label_names={"0": "negative", "1": "positive"},
                                        labels=["negative", "positive"])
    assert [e.label for e in examples] == ["positive", "negative", "positive"]


def test_explicit_format_overrides_extension(tmp_path: Path) -> None:
    path = write(tmp_path / "d.txt", "text\tlabel\nhi\ta\nyo\tb\n")
    assert load_classification_file(path, format="tsv") == [Example("hi", "a"), Example("yo", "b")]


def test_blank_lines_between_records_are_skipped(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", "text,label\nhi,a\n\nyo,b\n")
    assert len(load_classification_file(path)) == 2


# -- error paths ----------------------------------------------------------------------------
def test_missing_column_names_it_and_lists_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", "sentence,label\nhi,a\n")
    with pytest.raises(ValueError, match=r"text_column: column 'text' not found.*\['sentence', 'label'\]"):
        load_classification_file(path)
    with pytest.raises(ValueError, match=r"label_column: column 'y'"):
        load_classification_file(path, text_column="sentence", label_column="y")


def test_jsonl_missing_key(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "a", "label": "x"}, {"text": "b"}])
    with pytest.raises(ValueError, match=r"label_column: key 'label' missing .* line\(s\) 2"):
        load_classification_file(path)


def test_jsonl_invalid_json_and_non_objects(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", f'{{"text": "a", "label": "x"}}\n{{"text": "{SECRET}",\n["list"]\n')
    with pytest.raises(ValueError, match=r"line\(s\) 2, 3 are not JSON objects") as info:
        load_classification_file(path)
    assert SECRET not in str(info.value)


def test_empty_text_rows_reported_by_line_without_text(tmp_path: Path) -> None:
    # Record 2 spans lines 2-3, so the empty record after it starts on line 4.
    path = write(tmp_path / "d.csv", f'text,label\n"{SECRET}\nmore",a\n   ,b\n{SECRET},a\n"",b\n')
    with pytest.raises(ValueError, match=r"text: 2 record\(s\).*line\(s\) 4, 6") as info:
        load_classification_file(path)
    assert SECRET not in str(info.value)


def test_jsonl_non_string_text_is_rejected(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": 5, "label": "a"}, {"text": "ok", "label": "a"}])
    with pytest.raises(ValueError, match=r"line\(s\) 1"):
        load_classification_file(path)


def test_empty_label_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", "text,label\nhi,\nyo,b\n")
    with pytest.raises(ValueError, match=r"label: 1 record\(s\).*empty or non-scalar label.*line\(s\) 2"):
        load_classification_file(path)


def test_unknown_labels_are_rejected_without_quoting_them(tmp_path: Path) -> None:
    # A swapped label column would turn private text into "labels": they must not be echoed.
    path = write(tmp_path / "d.csv", f"text,label\nhi,a\nyo,{SECRET}\n")
    with pytest.raises(ValueError, match=r"labels: 1 record\(s\).*outside \['a', 'b'\].*line\(s\) 3") as info:
        load_classification_file(path, labels=["a", "b"])
    assert SECRET not in str(info.value)


def test_unmapped_raw_label(tmp_path: Path) -> None:
    path = write(tmp_path / "d.tsv", "text\tlabel\nhi\t0\nyo\t2\n")
    with pytest.raises(ValueError, match=r"label_names: 1 record\(s\).*outside \['0', '1'\].*line\(s\) 3"):
        load_classification_file(path, label_names={"0": "neg", "1": "pos"})


def test_drop_other_labels_keeps_a_subset(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", "text,label\nhi,a\nyo,c\nhey,b\n")
    examples = load_classification_file(path, labels=["a", "b"], drop_other_labels=True)
    assert [e.label for e in examples] == ["a", "b"]
    with pytest.raises(ValueError, match="no records after the header with a label in the labels list"):
        load_classification_file(path, labels=["z", "y"], drop_other_labels=True)


def test_short_rows_are_reported(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", "text,label\nhi,a\nonly-one-field\n")
    with pytest.raises(ValueError, match=r"1 record\(s\) have fewer fields.*line\(s\) 3"):
        load_classification_file(path)


def test_many_bad_lines_are_truncated(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", "text,label\n" + ",a\n" * 15)
    with pytest.raises(ValueError, match=r"line\(s\) 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and 5 more"):
        load_classification_file(path)


def test_empty_file_header_only_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="the file is empty"):
        load_classification_file(write(tmp_path / "e.csv", ""))
    with pytest.raises(ValueError, match="no records after the header"):
        load_classification_file(write(tmp_path / "h.csv", "text,label\n"))
    with pytest.raises(FileNotFoundError, match="path: no file at"):
        load_classification_file(tmp_path / "absent.csv")


def test_unknown_extension_and_bad_format(tmp_path: Path) -> None:
    path = write(tmp_path / "d.parquet", "x")
    with pytest.raises(ValueError, match=r"format: cannot infer .*d\.parquet"):
        load_classification_file(path)
    with pytest.raises(ValueError, match="format: use 'csv', 'tsv' or 'jsonl', got 'xml'"):
        load_classification_file(path, format="xml")  # type: ignore[arg-type]


def test_imbalance_warnings(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", "text,label\n" + "t,a\n" * 20 + "u,b\n")
    with pytest.warns(UserWarning, match=r"heavily imbalanced \('a' has at least 10x the records of 'b'\)"):
        load_classification_file(path)
    with pytest.warns(UserWarning, match="every record has the same label"):
        load_classification_file(write(tmp_path / "s.csv", "text,label\nt,a\nu,a\n"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_classification_file(write(tmp_path / "ok.csv", "text,label\n" + "t,a\n" * 9 + "u,b\n"))


# -- subsample and task building ------------------------------------------------------------
def test_subsample_is_seeded_uniform_and_ordered() -> None:
    examples = [Example(str(i), "a") for i in range(100)]
    first = subsample(examples, 10, seed=3)
    assert first == subsample(examples, 10, seed=3)
    assert first != subsample(examples, 10, seed=4)
    assert [int(e.text) for e in first] == sorted(int(e.text) for e in first)
    assert subsample(examples, None, seed=0) == examples
    assert subsample(examples, 500, seed=0) == examples
    with pytest.raises(ValueError, match="n: must be >= 1"):
        subsample(examples, 0, seed=0)


def test_build_task_from_files(tmp_path: Path) -> None:
    train = write(tmp_path / "train.csv", "text,label\n" + "".join(f"t{i},{'ab'[i % 2]}\n" for i in range(30)))
    test = write(tmp_path / "test.csv", "text,label\nx,a\ny,b\n")
    public = write_jsonl(tmp_path / "pub.jsonl", [{"text": "p", "label": "b"}])
    task = build_task_from_files("toy", train, test, public=public, n_private=12, seed=1,
                                 record_template="Q: {text}\nA:")
    assert isinstance(task, ClassificationTask)
    assert isinstance(task.private_train, PrivateDataset) and len(task.private_train) == 12
    assert task.labels == ["a", "b"]  # inferred from the test file
    assert task.public_examples == [Example("p", "b")]
    assert task.verbalizers == {"a": " a", "b": " b"}
    with pytest.raises(ValueError, match=r"labels: 1 record\(s\) of test.csv"):
        build_task_from_files("toy", train, test, labels=["a"])
    train3 = write(tmp_path / "train3.csv", "text,label\n" + "".join(f"t{i},{'abc'[i % 3]}\n" for i in range(30)))
    test3 = write(tmp_path / "test3.csv", "text,label\nx,a\ny,b\nz,c\n")
    subset = build_task_from_files("toy", train3, test3, labels=["a", "b"], drop_other_labels=True)
    assert len(subset.private_train) == 20 and [e.label for e in subset.test] == ["a", "b"]


def test_build_task_rejects_train_labels_missing_from_test(tmp_path: Path) -> None:
    train = write(tmp_path / "train.csv", "text,label\nt,a\nu,c\n")
    test = write(tmp_path / "test.csv", "text,label\nx,a\ny,b\n")
    with pytest.raises(ValueError, match=r"labels: 1 record\(s\) of train.csv"):
        build_task_from_files("toy", train, test)


# -- data dir and registry -------------------------------------------------------------------
def test_resolve_data_dir_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit, env = tmp_path / "explicit", tmp_path / "env"
    explicit.mkdir()
    env.mkdir()
    monkeypatch.setenv(DATA_ENV_VAR, str(env))
    assert resolve_data_dir(explicit) == explicit
    assert resolve_data_dir() == env
    monkeypatch.delenv(DATA_ENV_VAR)
    work = tmp_path / "repo"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(FileNotFoundError, match=r"the default \.\./shared/data.*DP_TEXTGRAD_DATA"):
        resolve_data_dir()
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert resolve_data_dir().resolve() == (tmp_path / "shared" / "data").resolve()
    with pytest.raises(FileNotFoundError, match=r"from the data_dir argument"):
        resolve_data_dir(tmp_path / "nope")


def test_registry_names_and_unknown_task() -> None:
    assert {"banking77", "sst2", "support", "snips", "gsm8k"} <= set(available_tasks())
    assert available_tasks() == sorted(available_tasks())
    with pytest.raises(ValueError, match=r"task: unknown task 'imdb'; available tasks are \['banking77'"):
        get_task("imdb")
    task = get_task("support", seed=2, n_private=20, n_public=5, n_test=10)
    assert task.name == "support" and len(task.private_train) == 20


def test_registry_public_examples_are_valid() -> None:
    assert {e.label for e in SST2_PUBLIC_EXAMPLES} == {"negative", "positive"}
    assert {e.label for e in BANKING77_PUBLIC_EXAMPLES} == set(BANKING77_INTENTS)
    verbalizers = list(BANKING77_INTENTS.values())
    assert len(set(verbalizers)) == len(verbalizers) and all(v.startswith(" ") for v in verbalizers)


def test_registry_reports_missing_data_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data_dir"):
        get_task("sst2", data_dir=tmp_path / "absent")


def _shared_data() -> Path | None:
    try:
        return resolve_data_dir()
    except FileNotFoundError:
        return None


def _shared_data_or_skip(*parts: str) -> Path:
    root = _shared_data()
    if root is None or not (root.joinpath(*parts)).exists():
        pytest.skip("benchmark data not found (set DP_TEXTGRAD_DATA)")
    return root


def test_real_sst2_loads() -> None:
    root = _shared_data_or_skip("sst2", "dev.tsv")
    task = get_task("sst2", data_dir=root, n_private=300, seed=5)
    assert len(task.private_train) == 300 and len(task.test) == 872
    assert task.labels == ["negative", "positive"]
    assert {e.label for e in task.test} == {"negative", "positive"}
    assert len({r.unwrap().text for r in task.private_train}) > 250  # a spread-out sample, not one block


def test_real_banking77_loads_ten_intents() -> None:
    root = _shared_data_or_skip("banking77", "train.tsv")
    task = get_task("banking77", data_dir=root)
    assert task.labels == list(BANKING77_INTENTS)
    assert {r.unwrap().label for r in task.private_train} == set(BANKING77_INTENTS)
    assert {e.label for e in task.test} == set(BANKING77_INTENTS)
    # The 10 intents are the most frequent ones of train.tsv.
    counts = {}
    for ex in load_classification_file(root / "banking77" / "train.tsv"):
        counts[ex.label] = counts.get(ex.label, 0) + 1
    top10 = sorted(counts, key=lambda k: -counts[k])[:10]
    assert set(top10) == set(BANKING77_INTENTS)
    assert len(task.private_train) == sum(counts[k] for k in BANKING77_INTENTS)
    with pytest.raises(ValueError, match="split: use 'test' or 'dev'"):
        get_task("banking77", data_dir=root, split="train")
    assert len(get_task("banking77", data_dir=root, split="dev", n_test=50).test) == 50


def test_a_listed_class_missing_from_the_test_file_is_warned_about(tmp_path: Path) -> None:
    test = write(tmp_path / "test.csv", "text,label\nx,a\ny,b\n")
    with_c = write(tmp_path / "train_c.csv", "text,label\n" + "".join(f"t{i},{'abc'[i % 3]}\n" for i in range(9)))
    without_c = write(tmp_path / "train.csv", "text,label\n" + "".join(f"t{i},{'ab'[i % 2]}\n" for i in range(8)))
    messages = []
    for train in (with_c, without_c):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            build_task_from_files("toy", train, test, labels=["a", "b", "c"])
        messages.append([str(w.message) for w in caught])
    assert any("'c'" in m and "task.labels" in m and "never occurs in the test file test.csv" in m
               and "cannot be measured" in m for m in messages[0]), messages[0]
    # Computed from the public test file only: the private train file changes nothing in it.
    assert messages[0] == messages[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_task_from_files("toy", with_c, write(tmp_path / "test3.csv", "text,label\nx,a\ny,b\nz,c\n"),
                              labels=["a", "b", "c"])
