"""The file-backed math domain: JSONL and Parquet, levels, a held-out slice, clear errors."""
from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from domains import registry
from domains.api import Status
from domains.math.dataset import MATH_DATASET, DatasetError, MathDataset, is_heldout


def _rows(n: int = 60) -> list[dict]:
    return [{"id": f"q{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i), "level": 1 + i % 3} for i in range(n)]


def _jsonl(path: Path, rows: list, raw_lines: dict[int, str] | None = None) -> Path:
    lines = [json.dumps(row) for row in rows]
    for index, text in (raw_lines or {}).items():
        lines.insert(index, text)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _load(path: Path, **options) -> MathDataset:
    return MATH_DATASET.configure({"path": str(path), **options})  # type: ignore[return-value]


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    return _jsonl(tmp_path / "math.jsonl", _rows())


def test_jsonl_levels_and_tasks(jsonl: Path) -> None:
    domain = _load(jsonl)
    assert domain.name == "math_dataset" and domain.levels == (1, 2, 3)
    tasks = domain.sample(2, 5, random.Random(0))
    assert len(tasks) == 5 and all(t.level == 2 and t.domain == "math_dataset" for t in tasks)
    for task in tasks:
        i = int(task.meta["row_id"][1:])
        assert task.prompt == [{"role": "user", "content": f"{i}+{i}="}]
        assert task.payload == {"answer": str(2 * i)}
        assert domain.verify(task, domain.reference(task)).status == Status.OK
        assert domain.verify(task, r"\boxed{-1}").status == Status.WRONG


def test_parquet_reads_like_jsonl(tmp_path: Path, jsonl: Path) -> None:
    from_parquet = _load(_parquet(tmp_path / "math.parquet", _rows()))
    from_jsonl = _load(jsonl)
    assert from_parquet.levels == from_jsonl.levels
    for level in from_jsonl.levels:
        a = from_parquet.sample(level, 4, random.Random(level))
        b = from_jsonl.sample(level, 4, random.Random(level))
        assert [(t.id, t.prompt, t.payload) for t in a] == [(t.id, t.prompt, t.payload) for t in b]


def test_sample_is_deterministic_and_ids_stable(jsonl: Path) -> None:
    domain = _load(jsonl)
    first = [t.id for t in domain.sample(1, 6, random.Random(3))]
    assert first == [t.id for t in _load(jsonl).sample(1, 6, random.Random(3))]
    assert len(set(first)) == 6  # no repeats while the level has enough rows


def test_rows_without_level_use_default_level(tmp_path: Path) -> None:
    rows = [{"prompt": f"{i}*2=", "answer": 2 * i} for i in range(10)]  # numeric answers, no level
    domain = _load(_jsonl(tmp_path / "plain.jsonl", rows), default_level=4, heldout_fraction=0.0)
    assert domain.levels == (4,)
    task = domain.sample(4, 1, random.Random(0))[0]
    assert isinstance(task.payload["answer"], str)
    with pytest.raises(ValueError, match="no level 1"):
        domain.sample(1, 1, random.Random(0))


def test_chat_message_prompts_and_field_names(tmp_path: Path) -> None:
    rows = [{"question": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="}],
             "solution": "2"}]
    domain = _load(_jsonl(tmp_path / "chat.jsonl", rows), prompt_field="question", answer_field="solution",
                   heldout_fraction=0.0)
    task = domain.sample(1, 1, random.Random(0))[0]
    assert task.prompt[0] == {"role": "system", "content": "Be brief."} and task.payload["answer"] == "2"


def test_reference_field_gives_worked_solutions_for_sft(tmp_path: Path) -> None:
    """MATH-style rows: ``solution`` holds the worked solution and the box; rows without one fall
    back to the bare box, and a solution that is not text is named with its line."""
    rows = [{"id": 1, "problem": "2+3*4=", "answer": "14", "solution": "3*4=12, so 2+12=\\boxed{14}"},
            {"id": 2, "problem": "1+1=", "answer": "2"}]
    domain = _load(_jsonl(tmp_path / "math.jsonl", rows), prompt_field="problem", reference_field="solution",
                   heldout_fraction=0.0)
    by_id = {t.meta["row_id"]: t for t in domain.sample(1, 2, random.Random(0))}
    assert domain.reference(by_id["1"]) == "3*4=12, so 2+12=\\boxed{14}"
    assert domain.verify(by_id["1"], domain.reference(by_id["1"])).reward == 1.0
    assert domain.reference(by_id["2"]) == "\\boxed{2}"
    for bad, message in [(7, "must be a worked solution"), ("  ", "must be a worked solution"),
                         ("1+1 is 2", r"has no final \\boxed")]:
        rows[1]["solution"] = bad
        with pytest.raises(DatasetError, match=rf"math.jsonl:2: solution {message}"):
            _load(_jsonl(tmp_path / "math.jsonl", rows), prompt_field="problem", reference_field="solution")
    with pytest.raises(DatasetError, match="no row has the reference field 'soluton'"):
        _load(_jsonl(tmp_path / "math.jsonl", rows[:1]), prompt_field="problem", reference_field="soluton")


def test_heldout_is_disjoint_from_sample_and_fixed(tmp_path: Path) -> None:
    rows = [{"id": i, "prompt": f"p{i}", "answer": str(i)} for i in range(400)]
    domain = _load(_jsonl(tmp_path / "big.jsonl", rows), heldout_fraction=0.2)
    heldout = domain.heldout(1, 1000, seed=0)
    held_ids = {t.id for t in heldout}
    assert 40 <= len(held_ids) <= 120  # about a fifth of 400
    sampled = {t.id for t in domain.sample(1, 400 - len(held_ids), random.Random(0))}  # every training row
    assert sampled and not (sampled & held_ids)
    assert len(sampled | held_ids) == 400  # every row is on exactly one side
    assert [t.id for t in domain.heldout(1, 10, seed=5)] == [t.id for t in domain.heldout(1, 10, seed=5)]
    # the split depends on the row, not on the file order
    reversed_domain = _load(_jsonl(tmp_path / "rev.jsonl", rows[::-1]), heldout_fraction=0.2)
    assert {t.id for t in reversed_domain.heldout(1, 1000, seed=0)} == held_ids


def test_heldout_fraction_zero_and_split_function() -> None:
    assert not any(is_heldout(str(i), 0.0) for i in range(100))
    share = sum(is_heldout(str(i), 0.1) for i in range(5000)) / 5000
    assert 0.08 < share < 0.12


def test_sampling_more_than_a_level_holds_repeats_rows(tmp_path: Path) -> None:
    rows = [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(3)]
    domain = _load(_jsonl(tmp_path / "tiny.jsonl", rows), heldout_fraction=0.0)
    tasks = domain.sample(1, 10, random.Random(0))
    assert len(tasks) == 10 and len({t.id for t in tasks}) <= 3


def test_name_override_and_registry_load(jsonl: Path) -> None:
    domain = registry.load("math_dataset", {"path": str(jsonl), "name": "gsm_tiny"})
    assert isinstance(domain, MathDataset) and domain.name == "gsm_tiny"
    assert all(t.domain == "gsm_tiny" for t in domain.sample(1, 3, random.Random(0)))
    direct = MathDataset(path=str(jsonl), name="other")
    assert direct.name == "other" and direct.levels == (1, 2, 3)


def test_pickles_with_its_rows(jsonl: Path) -> None:
    domain = pickle.loads(pickle.dumps(_load(jsonl)))
    assert domain.levels == (1, 2, 3) and len(domain.sample(1, 3, random.Random(0))) == 3


# -- errors: one clear line naming the problem --------------------------------------------------------
def test_missing_path_option() -> None:
    with pytest.raises(DatasetError, match="needs the option 'path'"):
        MATH_DATASET.configure({})
    with pytest.raises(registry.DomainError, match="needs the option 'path'"):
        registry.load("math_dataset")


def test_unconfigured_domain_cannot_sample() -> None:
    with pytest.raises(DatasetError, match="has no data"):
        MATH_DATASET.sample(1, 1, random.Random(0))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="dataset file not found: .*nope.jsonl"):
        _load(tmp_path / "nope.jsonl")


def test_unknown_suffix(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("prompt,answer\n1+1=,2\n")
    with pytest.raises(DatasetError, match="unknown dataset format '.csv'"):
        _load(path)


def test_malformed_line_names_its_number(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", _rows(5), raw_lines={3: '{"prompt": "1+1=", "answer": '})
    with pytest.raises(DatasetError, match=r"bad.jsonl:4: not valid JSON"):
        _load(path)


@pytest.mark.parametrize("row,message", [
    ({"answer": "2"}, r":2: missing field\(s\) 'prompt'"),
    ({"prompt": "1+1="}, r":2: missing field\(s\) 'answer'"),
    ({"prompt": "1+1=", "answer": ""}, ":2: answer must be a non-empty string"),
    ({"prompt": "", "answer": "2"}, ":2: prompt must be a non-empty string"),
    ({"prompt": [{"role": "user"}], "answer": "2"}, ":2: prompt must be"),
    ({"prompt": "1+1=", "answer": "2", "level": "hard"}, ":2: level must be an integer"),
    ({"prompt": "1+1=", "answer": "2", "id": "q0"}, ":2: duplicate id 'q0' \\(first on line 1\\)"),
    ([1, 2], ":2: expected an object"),
])
def test_bad_rows(tmp_path: Path, row, message: str) -> None:
    path = _jsonl(tmp_path / "rows.jsonl", [{"id": "q0", "prompt": "0+0=", "answer": "0"}, row])
    with pytest.raises(DatasetError, match=message):
        _load(path)


def test_missing_field_in_parquet(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "noanswer.parquet", [{"prompt": "1+1=", "other": "x"}])
    with pytest.raises(DatasetError, match=r"noanswer.parquet:1: missing field\(s\) 'answer'"):
        _load(path)


def test_corrupt_parquet(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        _load(path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(DatasetError, match="no rows"):
        _load(path)


def test_a_level_entirely_held_out_fails_at_load_not_when_the_curriculum_reaches_it(tmp_path: Path) -> None:
    held = next(f"r{i}" for i in range(1000) if is_heldout(f"r{i}", 0.1))
    kept = [f"r{i}" for i in range(1000) if not is_heldout(f"r{i}", 0.1)][:20]
    rows = [{"id": key, "prompt": f"{key}=", "answer": "1", "level": 1} for key in kept]
    rows.append({"id": held, "prompt": "x=", "answer": "2", "level": 2})  # the only row of level 2
    with pytest.raises(DatasetError, match=r"every row of level 2 \(1\) is held out; add rows at that level"):
        _load(_jsonl(tmp_path / "levels.jsonl", rows))
    assert _load(_jsonl(tmp_path / "levels.jsonl", rows), heldout_fraction=0.0).levels == (1, 2)


def test_unknown_option_is_rejected(jsonl: Path) -> None:
    with pytest.raises(registry.DomainError, match="heldout_fracton"):
        registry.load("math_dataset", {"path": str(jsonl), "heldout_fracton": 0.2})


def test_json_array_file(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(_rows(9), indent=2))
    domain = _load(path, heldout_fraction=0.0)
    assert domain.levels == (1, 2, 3) and len(domain.sample(1, 3, random.Random(0))) == 3


def test_parquet_levels_written_as_floats(tmp_path: Path) -> None:
    """pandas stores an integer column with gaps as floats, the gaps as NaN."""
    rows = [{"prompt": "1+1=", "answer": "2", "level": 2.0}, {"prompt": "2+2=", "answer": "4", "level": float("nan")}]
    domain = _load(_parquet(tmp_path / "floats.parquet", rows), default_level=5, heldout_fraction=0.0)
    assert domain.levels == (2, 5)
    bad = _parquet(tmp_path / "half.parquet", [{"prompt": "1+1=", "answer": "2", "level": 1.5}])
    with pytest.raises(DatasetError, match="half.parquet:1: level must be an integer"):
        _load(bad)


def test_two_files_side_by_side_as_named_instances_of_a_user_module(tmp_path: Path, monkeypatch) -> None:
    first = _jsonl(tmp_path / "a.jsonl", [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(20)])
    second = _jsonl(tmp_path / "b.jsonl", [{"prompt": f"{i}*2=", "answer": str(2 * i), "level": 2} for i in range(20)])
    (tmp_path / "mysets.py").write_text(
        "from domains.math.dataset import MathDataset\n"
        f"GSM = MathDataset(path={str(first)!r}, name='gsm')\n"
        f"EXTRA = MathDataset(path={str(second)!r}, name='extra')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = registry.load_all(["mysets:GSM", "mysets:EXTRA"], {"extra": {"heldout_fraction": 0.0}})
    assert {name: d.levels for name, d in loaded.items()} == {"gsm": (1,), "extra": (2,)}
    assert all("+" in t.prompt[-1]["content"] for t in loaded["gsm"].sample(1, 5, random.Random(0)))
    assert len(loaded["extra"].heldout(2, 50, seed=0)) == 0  # its own options, not gsm's
