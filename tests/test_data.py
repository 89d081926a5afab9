"""Tests for course_utils.data and the shipped instruction data set (offline, fast)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import datasets
import pytest

from course_utils import data

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "data" / "make_instructions.py"
DOLLY_CATEGORIES = {
    "open_qa",
    "closed_qa",
    "information_extraction",
    "summarization",
    "classification",
    "brainstorming",
    "creative_writing",
    "general_qa",
}


@pytest.fixture(scope="module")
def records() -> list[dict[str, str]]:
    """The shipped records, read straight from the file."""
    lines = data.SHIPPED_PATH.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make sure nothing tries the network, whatever the machine."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args, **kwargs):
        raise AssertionError("the tests must not touch the network")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(data.datasets, "load_dataset", no_network)


# --- the shipped file --------------------------------------------------------


def test_schema_and_size(records):
    assert len(records) >= 1000
    for r in records:
        assert set(r) == set(data.FIELDS)
        assert all(isinstance(r[f], str) for f in data.FIELDS)
        assert r["instruction"].strip() and r["response"].strip()
    categories = Counter(r["category"] for r in records)
    assert set(categories) <= DOLLY_CATEGORIES
    assert len(categories) >= 6


def test_file_format(records):
    raw = data.SHIPPED_PATH.read_bytes()
    assert raw.endswith(b"\n") and not raw.endswith(b"\n\n")
    for line, r in zip(raw.decode("utf-8").splitlines(), records, strict=True):
        assert line == json.dumps(r, sort_keys=True, ensure_ascii=False)


def test_few_duplicates(records):
    pairs = Counter((r["instruction"], r["context"]) for r in records)
    assert sum(count - 1 for count in pairs.values()) <= 5


def test_mostly_short(records):
    words = [
        len(" ".join((r["instruction"], r["context"], r["response"])).split()) for r in records
    ]
    assert sum(w <= 60 for w in words) / len(words) > 0.9
    assert max(words) <= 160
    assert any(w > 60 for w in words)  # a few long ones for packing


def test_generator_check_passes():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_generator_check_fails_on_a_changed_file(tmp_path):
    path = tmp_path / "instructions.jsonl"
    path.write_bytes(data.SHIPPED_PATH.read_bytes() + b"\n")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--output", str(path)], capture_output=True
    )
    assert result.returncode == 1


# --- the tasks are correct (so a model can learn them) -------------------------


def test_arithmetic_is_correct(records):
    ops = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}
    checked = 0
    for r in records:
        m = re.fullmatch(r"What is (\d+) (plus|minus|times) (\d+)\?", r["instruction"])
        if m:
            a, op, b = int(m[1]), m[2], int(m[3])
            assert r["response"] == f"{a} {op} {b} is {ops[op](a, b)}."
            checked += 1
    assert checked >= 50


def test_word_list_tasks_are_correct(records):
    checked = 0
    for r in records:
        instruction, response = r["instruction"], r["response"]
        if instruction.startswith("Reverse the order of these words: "):
            words = instruction.split(": ", 1)[1].split(", ")
            assert response.split(", ") == words[::-1]
            checked += 1
        elif instruction.startswith("Sort these words in alphabetical order: "):
            words = instruction.split(": ", 1)[1].split(", ")
            assert response.split(", ") == sorted(words)
            checked += 1
        elif instruction.startswith("How many words are in this phrase: "):
            n = len(instruction.split(": ", 1)[1].split())
            assert response == f"There are {n} words."
            checked += 1
        elif instruction.startswith("Write this phrase in capital letters: "):
            assert response == instruction.split(": ", 1)[1].upper()
            checked += 1
    assert checked >= 50


def test_closed_qa_answers_come_from_the_context(records):
    for r in records:
        if r["category"] == "closed_qa" and r["instruction"].startswith("Where does "):
            name = r["instruction"].removeprefix("Where does ").removesuffix(" live?")
            city = re.search(rf"{name} lives in (\w+)", r["context"])[1]
            assert r["response"] == f"{name} lives in {city}."


# --- format_prompt and friends -----------------------------------------------------


def test_format_prompt_with_context():
    record = {
        "instruction": "Where does Mara live?",
        "context": "Mara lives in Oslo.",
        "response": "In Oslo.",
    }
    assert data.format_prompt(record) == (
        "### Instruction:\nWhere does Mara live?\n\n"
        "### Context:\nMara lives in Oslo.\n\n"
        "### Response:\nIn Oslo."
    )


@pytest.mark.parametrize("context", ["", "   \n", None])
def test_format_prompt_without_context(context):
    record = {"instruction": "What is 2 plus 3?", "context": context, "response": "2 plus 3 is 5."}
    text = data.format_prompt(record)
    assert text == "### Instruction:\nWhat is 2 plus 3?\n\n### Response:\n2 plus 3 is 5."
    assert "Context" not in text
    assert (
        data.format_prompt({"instruction": "Hi", "response": "Hello"})
        == "### Instruction:\nHi\n\n### Response:\nHello"
    )


def test_format_prompt_missing_field_message():
    with pytest.raises((KeyError, ValueError)) as info:
        data.format_prompt({"instruction": "Say hi", "text": "hi"})
    message = str(info.value)
    assert "response" in message  # the missing field
    assert "instruction" in message and "text" in message  # the fields present
    assert 'dataset_text_field="text"' in message


def test_to_text_dataset():
    ds = data.to_text_dataset(data.load_shipped(5))
    assert ds.column_names == ["text"]
    assert ds[0]["text"].startswith("### Instruction:\n")
    assert "### Response:\n" in ds[0]["text"]


def test_corpus_text():
    texts = data.corpus_text(10)
    assert len(texts) == 10
    assert texts[0] == data.format_prompt(data.load_shipped(1)[0])
    assert len(data.corpus_text()) == len(data.load_shipped())


# --- loading -------------------------------------------------------------------------


def test_load_shipped():
    ds = data.load_shipped(7)
    assert isinstance(ds, datasets.Dataset)
    assert len(ds) == 7
    assert ds.column_names == list(data.FIELDS)
    assert ds.info.description == "source: shipped"


def test_hub_reachable_false_when_offline(offline):
    assert data.hub_reachable() is False


@pytest.mark.parametrize("value", ["1", "true", "YES", "On"])
def test_hub_reachable_truthy_values(offline, monkeypatch, value):
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert data.hub_reachable() is False


def test_hub_reachable_never_raises(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)

    def refuse(*args, **kwargs):
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", refuse)
    assert data.hub_reachable(timeout=0.01) is False


def test_auto_falls_back_with_warning(offline, capsys):
    with pytest.warns(UserWarning, match="shipped"):
        ds = data.load_instructions("dolly", n=20)
    assert len(ds) == 20
    assert ds.column_names == list(data.FIELDS)
    assert ds.info.description == "source: shipped"
    printed = capsys.readouterr()
    assert "shipped" in printed.out and not printed.err  # offline was chosen: a note, not an error
    assert ds[0] == data.load_shipped(1)[0]


def test_auto_falls_back_when_hub_load_fails(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise ConnectionError("hub is down")

    monkeypatch.setattr(data, "hub_reachable", lambda timeout=2.0: True)
    monkeypatch.setattr(data.datasets, "load_dataset", broken)
    with pytest.warns(UserWarning, match="ConnectionError"):
        ds = data.load_instructions(n=3)
    assert ds.info.description == "source: shipped"
    assert "ConnectionError" in capsys.readouterr().err


def test_hub_path_selects_and_keeps_fields(monkeypatch):
    fake = datasets.Dataset.from_dict(
        {
            "instruction": [f"q{i}" for i in range(10)],
            "context": [""] * 10,
            "response": [f"a{i}" for i in range(10)],
            "category": ["open_qa"] * 10,
            "extra": [0] * 10,
        }
    )
    monkeypatch.setattr(data, "hub_reachable", lambda timeout=2.0: True)
    monkeypatch.setattr(data.datasets, "load_dataset", lambda *args, **kwargs: fake)
    ds = data.load_instructions("dolly", n=4, source="hub")
    assert len(ds) == 4
    assert ds.column_names == list(data.FIELDS)
    assert ds.info.description == "source: hub"


def test_source_hub_offline_raises(offline):
    with pytest.raises(RuntimeError, match="shipped"):
        data.load_instructions("dolly", source="hub")


def test_source_shipped(offline):
    ds = data.load_instructions("dolly", n=5, source="shipped")
    assert len(ds) == 5
    assert ds.info.description == "source: shipped"


def test_bad_name():
    with pytest.raises(ValueError, match="alpaca") as info:
        data.load_instructions("alpaca", source="shipped")
    assert "dolly" in str(info.value)


def test_bad_source():
    with pytest.raises(ValueError, match="source"):
        data.load_instructions("dolly", source="internet")


@pytest.mark.parametrize("n", [0, -3, 2.5, "10", True])
def test_bad_n(n):
    with pytest.raises(ValueError, match="n must be"):
        data.load_instructions("dolly", n=n, source="shipped")


def test_n_selection(offline):
    all_records = data.load_shipped()
    assert len(all_records) == len(data.SHIPPED_PATH.read_text(encoding="utf-8").splitlines())
    assert data.load_shipped(3)["instruction"] == all_records["instruction"][:3]
    assert len(data.load_shipped(10**6)) == len(all_records)
