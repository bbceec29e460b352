"""The run folder: records appended as they finish, read back with schema checks."""

import json
import math

import pandas as pd
import pytest

from kvrepro.engines.sim.outputs import OutputSink
from kvrepro.records import (
    RECORD_COLUMNS,
    RunWriter,
    read_jsonl,
    read_run,
    read_runs,
    typed_records,
)


def _record(i: int, tier: str = "dram", **extra) -> dict:
    return {"session_id": i, "turn": 0, "tier": tier, "engine": "sim", "send_s": float(i),
            "first_token_s": i + 0.5, "finish_s": i + 1.0, "prompt_tokens": 1000,
            "cached_prompt_tokens": 800, "output_tokens": 50, **extra}


def test_round_trip_with_samples_and_meta(tmp_path) -> None:
    with RunWriter(tmp_path / "run", {"tier": "dram", "workload": {"seed": 0}}) as w:
        for i in range(3):
            w.write_record(_record(i, loaded_dram_tokens=800))
        w.write_sample({"time_s": 1.0, "kv_usage": 0.25})
    run = read_run(tmp_path / "run")
    assert list(run.records.columns[: len(RECORD_COLUMNS)]) == list(RECORD_COLUMNS)
    assert run.records.ttft_s.tolist() == [0.5, 0.5, 0.5]
    assert run.records.loaded_dram_tokens.tolist() == [800] * 3  # extra fields kept
    assert run.samples.kv_usage.tolist() == [0.25]
    assert run.meta["status"] == "finished" and run.meta["n_records"] == 3
    assert run.meta["host"]["packages"]["kvrepro"] == "0.1.0"


def test_records_are_on_disk_before_close(tmp_path) -> None:
    w = RunWriter(tmp_path, {"tier": "baseline"})
    w.write_record(_record(0))
    # the process could die here: the finished request is already readable
    assert len(read_run(tmp_path).records) == 1
    assert json.loads((tmp_path / "meta.json").read_text())["status"] == "running"
    w.close()


def test_failure_status_recorded(tmp_path) -> None:
    with pytest.raises(RuntimeError), RunWriter(tmp_path, {}) as w:
        w.write_record(_record(0))
        raise RuntimeError("server died")
    run = read_run(tmp_path)
    assert run.meta["status"].startswith("failed: RuntimeError: server died")
    assert len(run.records) == 1


def test_missing_field_is_named(tmp_path) -> None:
    with RunWriter(tmp_path, {}) as w, pytest.raises(ValueError, match="prompt_tokens"):
        bad = _record(0)
        del bad["prompt_tokens"]
        w.write_record(bad)
    (tmp_path / "records.jsonl").write_text(json.dumps({"session_id": 1}) + "\n")
    with pytest.raises(ValueError, match=r"records.jsonl:1: request record lacks field\(s\)"):
        read_run(tmp_path)


def test_optional_fields_default(tmp_path) -> None:
    minimal = {k: v for k, v in _record(0).items() if k != "cached_prompt_tokens"}
    with RunWriter(tmp_path, {}) as w:
        w.write_record(minimal)
    rec = read_run(tmp_path).records.iloc[0]
    assert math.isnan(rec.cached_prompt_tokens) and rec.error == "" and not rec.is_resume


def test_truncated_last_line_is_skipped(tmp_path) -> None:
    with RunWriter(tmp_path, {}) as w:
        w.write_record(_record(0))
        w.write_record(_record(1))
    path = tmp_path / "records.jsonl"
    path.write_text(path.read_text() + '{"session_id": 2, "tu')  # killed mid-write
    with pytest.warns(UserWarning, match=r"records.jsonl:3: malformed line.*truncated"):
        run = read_run(tmp_path)
    assert len(run.records) == 2


def test_malformed_middle_line_names_file_and_line(tmp_path) -> None:
    path = tmp_path / "records.jsonl"
    lines = [json.dumps(_record(0)), "{not json", json.dumps(_record(2))]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"records.jsonl:2: malformed line"):
        read_run(tmp_path)
    run = read_run(tmp_path, strict=False)
    assert len(run.records) == 2 and len(run.problems) == 1
    rows, problems = read_jsonl(path, strict=False)
    assert [r["session_id"] for r in rows] == [0, 2] and "records.jsonl:2" in problems[0]


def test_line_that_is_not_utf8_is_one_malformed_line(tmp_path) -> None:
    """read_run raised a bare UnicodeDecodeError, with strict=False too (which promises to
    keep the valid part)."""
    path = tmp_path / "records.jsonl"
    lines = [json.dumps(_record(i)).encode() for i in range(3)]
    lines[1] = lines[1].replace(b'"dram"', b'"dr\xc3m"')  # a lead byte without its tail
    path.write_bytes(b"\n".join(lines) + b"\n")
    column = lines[1].index(b"\xc3") + 1
    with pytest.raises(ValueError, match=rf"^{path}:2: malformed line \(not UTF-8 text \(byte "
                                         rf"0xc3 at column {column}: invalid continuation"):
        read_run(tmp_path)
    run = read_run(tmp_path, strict=False)
    assert run.records.session_id.tolist() == [0, 2]
    assert len(run.problems) == 1 and run.problems[0].startswith(f"{path}:2: malformed line")
    path.write_bytes(b"\n".join(lines[:1] + [lines[1][:column]]))  # cut inside a character
    with pytest.warns(UserWarning, match=r"records.jsonl:2: malformed line.*truncated"):
        assert len(read_run(tmp_path).records) == 1


def test_wrongly_typed_field_names_the_line(tmp_path) -> None:
    """A value no dtype cast can take (a corrupted number, a list) was a pandas error
    naming no file; it is the line's error, and strict=False skips the line."""
    path = tmp_path / "records.jsonl"
    lines = [_record(0), {**_record(1), "turn": "x"}, {**_record(2), "send_s": [1]},
             {**_record(3), "prompt_tokens": 1e300}, {**_record(4), "is_resume": "no"},
             _record(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(ValueError, match=rf"^{path}:2: field 'turn' must be an integer"):
        read_run(tmp_path)
    run = read_run(tmp_path, strict=False)
    assert run.records.session_id.tolist() == [0, 5]
    assert [p.split(": ", 1)[1] for p in run.problems] == [
        "field 'turn' must be an integer, got x", "field 'send_s' must be a number or null, "
        "got [1]", "field 'prompt_tokens' must be an integer, got 1e+300",
        "field 'is_resume' must be true or false, got no"]


def test_unreadable_meta_names_the_file(tmp_path) -> None:
    with RunWriter(tmp_path, {"tier": "dram"}) as w:
        w.write_record(_record(0))
    meta = tmp_path / "meta.json"
    meta.write_bytes(meta.read_bytes().replace(b"dram", b"dr\xffm"))
    with pytest.raises(ValueError, match=rf"^{meta}:\d+: unreadable run metadata \(not UTF-8"):
        read_run(tmp_path)
    run = read_run(tmp_path, strict=False)
    assert run.meta == {} and len(run.records) == 1 and "meta.json" in run.problems[0]


def test_read_runs_concatenates_tiers(tmp_path) -> None:
    for tier in ("baseline", "dram"):
        with RunWriter(tmp_path / tier, {"tier": tier}) as w:
            w.write_record(_record(0, tier=tier))
            w.write_sample({"time_s": 0.0, "hits": 1})
    records, samples = read_runs([tmp_path / "baseline", tmp_path / "dram"])
    assert sorted(records.tier) == ["baseline", "dram"]
    assert sorted(samples.tier) == ["baseline", "dram"]


def test_not_a_run_folder(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no records.jsonl"):
        read_run(tmp_path)


def test_typed_records_casts_fills_error_and_adds_ttft() -> None:
    raw = pd.DataFrame([{**_record(1), "cached_prompt_tokens": 800, "is_resume": 0,
                         "is_warmup": 1, "error": None, "gpu_hit_tokens": 7},
                        {**_record(2), "cached_prompt_tokens": None, "is_resume": 1,
                         "is_warmup": 0, "error": "timeout", "gpu_hit_tokens": 3}],
                       dtype=object)
    df = typed_records(raw)
    assert {c: str(df[c].dtype) for c in df.columns} == {
        "session_id": "int64", "turn": "int64", "tier": "object", "engine": "object",
        "send_s": "float64", "first_token_s": "float64", "finish_s": "float64",
        "prompt_tokens": "int64", "cached_prompt_tokens": "float64", "output_tokens": "int64",
        "is_resume": "bool", "is_warmup": "bool", "error": "object",
        "gpu_hit_tokens": "object", "ttft_s": "float64"}
    assert df.error.tolist() == ["", "timeout"]
    assert df.ttft_s.tolist() == [0.5, 0.5]
    assert df.cached_prompt_tokens.iloc[0] == 800.0 and math.isnan(df.cached_prompt_tokens[1])
    assert df.is_resume.tolist() == [False, True]
    assert raw.error.iloc[0] is None  # the input is left as it was


def test_simulated_records_are_typed_as_a_run_folder_reads_back(tmp_path) -> None:
    with OutputSink(tmp_path / "run", {"engine": "sim"}) as sink:
        for i in range(3):
            sink.add_record({**_record(i), "is_resume": i == 1, "is_warmup": False,
                             "error": "", "gpu_hit_tokens": 100 * i})
        in_memory = sink.records_frame()
        sink.finish({})
    pd.testing.assert_frame_equal(in_memory, read_run(tmp_path / "run").records)
