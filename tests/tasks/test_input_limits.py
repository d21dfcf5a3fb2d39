"""Bad files: encodings, oversized records and files, config syntax errors (file, line, column, fix)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_textgrad import cli
from dp_textgrad.settings import EngineSection, TaskSection, build_settings, read_config_file
from dp_textgrad.tasks.loaders import MAX_RECORD_CHARS, load_classification_file

runner = CliRunner()


def test_latin1_file_names_the_file_and_the_encoding_flag(tmp_path) -> None:
    path = tmp_path / "train.csv"
    path.write_bytes("text,label\ncafé crème au lait,bill\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"train\.csv: line 2 is not valid utf-8-sig.*--encoding latin-1"):
        load_classification_file(path)
    assert load_classification_file(path, encoding="latin-1")[0].text == "café crème au lait"


def test_cli_bad_encoding_is_exit_2_before_any_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(EngineSection, "build", lambda section: pytest.fail("no engine for bad input"))
    train = tmp_path / "train.csv"
    train.write_bytes("text,label\nd\xe9j\xe0 vu,bill\n".encode("latin-1"))
    (tmp_path / "test.csv").write_text("text,label\nhello,bill\n", encoding="utf-8")
    args = ["optimize", "--train", str(train), "--test", str(tmp_path / "test.csv"), "--runs-root",
            str(tmp_path / "runs")]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 2 and "train.csv" in result.stderr and "--encoding" in result.stderr
    unknown = runner.invoke(cli.app, args + ["--encoding", "no-such-codec"])
    assert unknown.exit_code == 2 and "task.encoding" in unknown.stderr and "unknown encoding" in unknown.stderr
    assert not list((tmp_path / "runs").glob("run-*/ledger.jsonl"))


def test_huge_csv_cell_names_file_line_and_limit(tmp_path) -> None:
    path = tmp_path / "train.csv"
    path.write_text("text,label\nshort,bill\n\"" + "x" * (MAX_RECORD_CHARS * 3) + "\",bill\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"train\.csv.*line 3.*131,072"):
        load_classification_file(path)


def test_huge_jsonl_line_is_never_read_whole(tmp_path) -> None:
    path = tmp_path / "train.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        handle.write(json.dumps({"text": "fine", "label": "bill"}) + "\n")
        handle.write(json.dumps({"text": "y" * 20_000_000, "label": "bill"}) + "\n")
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"train\.jsonl: line 2 is longer than the limit"):
            load_classification_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000, peak  # the 20 MB line was not loaded


def test_file_size_limit(tmp_path) -> None:
    path = tmp_path / "train.csv"
    path.write_text("text,label\n" + "hello,bill\n" * 100, encoding="utf-8")
    with pytest.raises(ValueError, match=r"train\.csv: 1,111 bytes, over the limit of 1,000 bytes"):
        load_classification_file(path, max_file_bytes=1000)


def test_jsonl_streams_records_with_problems_reported_at_the_end(tmp_path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a", "label": "bill"}\nnot json\n{"text": "b"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"line\(s\) 2 are not JSON objects"):
        load_classification_file(path)


@pytest.mark.parametrize("name, text, where", [
    ("bad.toml", '[dp]\nepsilon = 4\ngenerations = = 3\n', "line 3, column 15"),
    ("bad.yaml", "dp:\n  epsilon: 4\n   generations: 3\n", "line 3, column 15"),
])
def test_config_syntax_errors_name_file_line_and_column(tmp_path, name, text, where) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as info:
        read_config_file(path)
    message = str(info.value)
    assert name in message and "line 3" in message and "fix the syntax" in message, message


def test_config_value_errors_name_the_key_and_its_line(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[task]\nname = "support"\n\n[dp]\nepsilon = -1\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"dp\.epsilon: .* \(run\.toml line 5\)"):
        build_settings(read_config_file(path), {}, source=path)


def test_task_section_rejects_unknown_encodings() -> None:
    with pytest.raises(ValueError, match="unknown encoding"):
        TaskSection(train=Path("a.csv"), test=Path("b.csv"), encoding="klingon")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_bad_encoding_names_the_physical_line_and_task_encoding(tmp_path, suffix) -> None:
    # 2,500 clean lines, then a latin-1 byte on line 2,501 (the trial's case): the error names that
    # line, not a byte offset inside the decoder's buffer.
    def line(i: int, text: str) -> str:
        return f'{{"text": "{text}", "label": "bill"}}\n' if suffix == ".jsonl" else f"{text},bill\n"

    header = "" if suffix == ".jsonl" else "text,label\n"
    first = 1 if suffix == ".jsonl" else 2
    clean = "".join(line(i, f"record number {i} with some words") for i in range(first, 2501))
    path = tmp_path / f"train{suffix}"
    path.write_bytes((header + clean).encode("utf-8") + line(2501, "caf\xe9").encode("latin-1")
                     + line(2502, "fine").encode("utf-8"))
    with pytest.raises(ValueError) as error:
        load_classification_file(path)
    message = str(error.value)
    assert f"train{suffix}: line 2501 is not valid utf-8-sig text" in message
    assert "task.encoding" in message and "latin-1" in message and "byte" not in message


@pytest.mark.parametrize("body", [
    'text,label\nhello,bill\nlast words,"fraud\nthird,tech\nfourth,bill\n',  # the quote opens the last field
    'text,label\nhello,bill\n"never closed,tech\nthird,fraud\n',  # and the first
])
def test_an_unterminated_quote_is_refused_naming_the_line_where_its_record_starts(tmp_path, body) -> None:
    # Without strict quoting the rest of the file became one record, silently (issue 47).
    path = tmp_path / "train.csv"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(ValueError, match=r"train\.csv: the record starting at line 3 opens a quote that is never "
                                         r"closed") as caught:
        load_classification_file(path)
    assert "third" not in str(caught.value) and "fraud" not in str(caught.value)  # names the line, quotes nothing


def test_an_unterminated_quote_in_a_generation_file_is_refused(tmp_path) -> None:
    from dp_textgrad.tasks.generation_files import load_generation_file

    path = tmp_path / "train.csv"
    path.write_text('input,target\nfly to Rome,Rome\n"fly to Oslo,Oslo\nfly to Lima,Lima\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 3 opens a quote that is never closed"):
        load_generation_file(path)


def test_a_quote_inside_an_unquoted_field_stays_text(tmp_path) -> None:
    path = tmp_path / "train.csv"
    path.write_text('text,label\nhe said "hi" to me,bill\n"a, quoted ""field""",tech\nplain,bill\n', encoding="utf-8")
    rows = load_classification_file(path)
    assert [r.text for r in rows] == ['he said "hi" to me', 'a, quoted "field"', "plain"]
