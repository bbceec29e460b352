"""fio's JSON report and latency logs, parsed: captured fio 3.33 reports and small logs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvrepro.storage import parse

DATA = Path(__file__).resolve().parents[1] / "data" / "fio"


def _report(name: str) -> dict:
    return parse.load_fio_json(DATA / f"{name}.json")


def test_two_jobs_without_group_reporting_stay_apart() -> None:
    table = parse.parse_fio_json(DATA / "two_jobs.json")
    raw = _report("two_jobs")["jobs"]
    assert len(table) == 2 and set(table.direction) == {"read"}
    assert list(table.groupid) == [0, 0] and set(table.jobname) == {"randread4k"}
    assert list(table.io_bytes) == [job["read"]["io_bytes"] for job in raw]
    assert (table.rw == "randread").all() and (table.iodepth == "4").all()
    assert (table.filename == "/tmp/fiox/t.dat").all()  # from the global section
    group = parse.group_summary(table)
    assert len(group) == 1 and group.n_jobs.iloc[0] == 2
    assert group.io_bytes.iloc[0] == sum(job["read"]["io_bytes"] for job in raw)
    assert group.runtime_ms.iloc[0] == max(job["read"]["runtime"] for job in raw)


def test_bandwidth_is_bytes_over_runtime_like_fio() -> None:
    for name in ("two_jobs", "two_groups"):
        table = parse.parse_fio_json(_report(name))
        expected = table.io_bytes / (table.runtime_ms / 1e3)
        assert np.allclose(table.bw_bytes_s, expected)
        # fio's bw_bytes is the same quotient, truncated to an integer
        assert ((table.bw_bytes_s - table.fio_bw_bytes_s).abs() < 1.0).all()


def test_two_groups_and_directions() -> None:
    table = parse.parse_fio_json(_report("two_groups"))
    assert list(zip(table.jobname, table.groupid, table.direction, strict=True)) == [
        ("seqread", 0, "read"), ("g1-read", 1, "read"), ("g1-write", 1, "write")]
    assert table.set_index("jobname").at["g1-write", "bs"] == "1m"
    assert table.set_index("jobname").at["seqread", "ioengine"] == "libaio"
    group = parse.group_summary(table)
    assert list(zip(group.groupid, group.direction, strict=True)) == [
        (0, "read"), (1, "read"), (1, "write")]
    # lat_percentiles=1 in this job file: total-latency percentiles are there and ordered
    cols = [f"lat_p{t}_ns" for t in ("50", "90", "99", "99_9")]
    assert table[cols].notna().all().all()
    for _, row in table.iterrows():
        assert parse.percentiles_ordered(row[cols])
        assert parse.percentiles_ordered([row.clat_p50_ns, row.clat_p90_ns, row.clat_p99_ns])
        # fio's percentiles are histogram bins (64 per power of two): within 1/64 of min/max
        assert row.lat_min_ns * (1 - 1 / 64) <= row.lat_p50_ns
        assert row.lat_p99_9_ns <= row.lat_max_ns * (1 + 1 / 64)


def test_clat_percentiles_only_without_lat_percentiles() -> None:
    table = parse.parse_fio_json(_report("two_jobs"))
    assert table.clat_p50_ns.notna().all() and table.lat_p50_ns.isna().all()


def test_error_report_keeps_the_job_and_names_the_errno() -> None:
    report = _report("error")
    table = parse.parse_fio_json(report)
    assert len(table) == 1 and table.error.iloc[0] == 22 and table.io_bytes.iloc[0] == 0
    [problem] = parse.fio_errors(report)
    assert "bad-align" in problem and "error 22" in problem and "Invalid argument" in problem


def test_warning_lines_before_the_json_are_skipped(tmp_path) -> None:
    text = "fio: time_based requires a runtime/timeout setting\n" + (DATA / "two_jobs.json"
                                                                   ).read_text()
    path = tmp_path / "out.json"
    path.write_text(text)
    assert parse.load_fio_json(path)["fio version"] == "fio-3.33"
    with pytest.raises(ValueError, match="no JSON object"):
        parse.fio_json_from_text("fio: engine nonexistent not loadable\n")
    with pytest.raises(ValueError, match="no 'jobs' key"):
        parse.parse_fio_json({"fio version": "fio-3.33"})


def test_report_that_is_not_utf8_names_file_and_line(tmp_path) -> None:
    """It raised a bare UnicodeDecodeError naming neither the file nor the line."""
    data = (DATA / "two_jobs.json").read_bytes()
    at = data.index(b'"jobname"')
    path = tmp_path / "bad.json"
    path.write_bytes(data[:at] + b"\xfe" + data[at:])
    line = data.count(b"\n", 0, at) + 1
    column = at - data.rfind(b"\n", 0, at)
    with pytest.raises(ValueError, match=rf"^{path}:{line}: fio output is not UTF-8 text "
                                         rf"\(byte 0xfe at column {column}: invalid start"):
        parse.parse_fio_json(path)


def test_invalid_json_names_the_line_of_the_whole_file(tmp_path) -> None:
    text = (DATA / "two_jobs.json").read_text()
    lines = ["fio: a warning fio wrote first"] + text.split("\n")
    lines[6] = lines[6].replace(":", "", 1)
    path = tmp_path / "bad.json"
    path.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=rf"^{path}:7: fio output is not valid JSON"):
        parse.load_fio_json(path)


def test_report_without_a_needed_field_names_file_and_job(tmp_path) -> None:
    report = _report("two_jobs")
    del report["jobs"][1]["read"]["lat_ns"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    with pytest.raises(ValueError, match=rf"^{path}: job 1 \('randread4k'\): missing or "
                                         r"malformed field \(KeyError: 'lat_ns'\)"):
        parse.parse_fio_json(path)
    report["jobs"] = {"not": "a list"}
    with pytest.raises(ValueError, match=r"^fio report: not a fio JSON report"):
        parse.parse_fio_json(report)


def test_lat_log_that_is_not_a_log_names_the_file(tmp_path) -> None:
    path = tmp_path / "p_lat.1.log"
    path.write_bytes(b"0, 500000, 0, 4096, 0, 0\n1, 12\xff0000, 1, 4096, 4096, 0\n")
    with pytest.raises(ValueError, match=rf"^{path}:2: not a fio latency log: not UTF-8 text"):
        parse.read_lat_log(path)
    path.write_bytes(b"0, 500000, 0, 4096, 0, 0\n1, 12x0000, 1, 4096, 4096, 0\n")
    with pytest.raises(ValueError, match=rf"^{path}: not a fio latency log: row 2 is not all "
                                         "numbers"):
        parse.read_lat_log(path)
    path.write_bytes(b"0, 500000, 0, 4096, 0, 0, 7, 8\n")
    with pytest.raises(ValueError, match=r"expected 4 to 6 columns, got 8"):
        parse.read_lat_log(path)


def _write_log(path: Path, rows: list[tuple[int, int, int, int, int, int]]) -> None:
    path.write_text("".join(", ".join(map(str, r)) + "\n" for r in rows))


def test_lat_log_columns_and_job_numbers(tmp_path) -> None:
    _write_log(tmp_path / "p_lat.1.log", [(0, 500_000, 0, 4096, 0, 0),
                                          (1, 1_200_000, 1, 4096, 4096, 0)])
    _write_log(tmp_path / "p_lat.2.log", [(2, 700_000, 0, 4096, 8192, 0)])
    _write_log(tmp_path / "p_clat.1.log", [(0, 400_000, 0, 4096, 0, 0)])
    logs = parse.read_lat_logs(tmp_path / "p")
    assert list(logs.columns) == ["time_ms", "value_ns", "block_size_bytes", "offset_bytes",
                                  "prio", "direction", "job"]
    assert list(logs.direction) == ["read", "write", "read"] and list(logs.job) == [1, 1, 2]
    assert len(parse.read_lat_logs(tmp_path / "p", "clat")) == 1
    with pytest.raises(FileNotFoundError, match="slat"):
        parse.read_lat_logs(tmp_path / "p", "slat")


def test_in_flight_counts_overlaps_and_returns_to_zero() -> None:
    # three I/Os: [0, 4], [1, 2], [3, 4] ms (submitted at completion - latency)
    events = pd.DataFrame({"submit_ms": [0.0, 1.0, 3.0], "complete_ms": [4.0, 2.0, 4.0]})
    flight = parse.in_flight(events)
    assert list(flight.time_ms) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert list(flight.in_flight) == [1, 2, 1, 2, 0]
    assert list(flight.submitted) == [1, 2, 2, 3, 3] and flight.completed.iloc[-1] == 3


def test_io_events_spread_one_ms_of_completions_in_log_order() -> None:
    log = pd.DataFrame({"time_ms": [5, 5, 5, 6], "value_ns": [5_000_000, 4_000_000,
                                                              3_000_000, 1_000_000],
                        "direction": "read", "block_size_bytes": 4096, "job": 1})
    events = parse.io_events(log)
    assert np.allclose(events.complete_ms, [5 + 1 / 6, 5.5, 5 + 5 / 6, 6.5])
    assert np.allclose(events.submit_ms, events.complete_ms - log.value_ns / 1e6)
    assert (events.submit_ms <= events.complete_ms).all()


def test_captured_reports_are_real_fio_output() -> None:
    for name in ("two_jobs", "two_groups", "error"):
        report = json.loads((DATA / f"{name}.json").read_text())
        assert report["fio version"] == "fio-3.33"
    assert "Invalid argument" in (DATA / "error.stderr").read_text()
