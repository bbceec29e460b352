"""fio for real on a temporary file (seconds), and the driver's refusals and error messages."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from kvrepro.storage import fio, parse
from kvrepro.storage.fio import FioBench, FioError, FioNotFoundError, FioPoint, FioTargetError

SIZE = 16 * fio.MIB
CI_POINTS = [
    FioPoint(rw="randread", block_size_bytes=4096, iodepth=4, runtime_s=0.3),
    FioPoint(rw="write", block_size_bytes=65536, iodepth=2, runtime_s=0.3),
    FioPoint(rw="read", block_size_bytes=65536, iodepth=4, numjobs=2, runtime_s=0.3,
             lat_log=True),
]


@pytest.fixture(scope="module")
def ci_sweep(tmp_path_factory):
    """A short real sweep: (sweep table, run dir, data file, lat log of the last point)."""
    root = tmp_path_factory.mktemp("fio")
    with FioBench([root], root / "run", SIZE) as bench:
        [data_file] = bench.paths
        assert data_file.stat().st_size == SIZE  # written in full before any point
        sweep = bench.sweep(CI_POINTS, progress=False)
        lat = bench.run(CI_POINTS[-1], name="again").lat_log()
        again = json.loads((root / "run" / "again.json").read_text())
    return sweep, root / "run", data_file, lat, again


def test_sweep_numbers_match_fio_own_report(ci_sweep) -> None:
    sweep, run_dir, _, _, _ = ci_sweep
    assert len(sweep) == len(CI_POINTS) and (sweep.error == 0).all()
    assert list(sweep.direction) == ["read", "write", "read"]
    for _, row in sweep.iterrows():
        report = parse.load_fio_json(run_dir / f"{row['name']}.json")
        [job] = report["jobs"]  # group_reporting: one entry per point
        stats = job[row.direction]
        assert row.io_bytes == stats["io_bytes"] > 0
        assert row.runtime_ms == stats["runtime"]
        assert row.bw_bytes_s == pytest.approx(stats["io_bytes"] / (stats["runtime"] / 1e3))
        assert abs(row.bw_bytes_s - stats["bw_bytes"]) < 1.0  # fio truncates to an integer
        assert row.total_ios == stats["total_ios"]
        assert row.io_bytes == row.total_ios * row.block_size_bytes


def test_latency_percentiles_are_ordered(ci_sweep) -> None:
    sweep = ci_sweep[0]
    for _, row in sweep.iterrows():
        values = [row.lat_p50_ns, row.lat_p90_ns, row.lat_p99_ns, row.lat_p99_9_ns]
        assert not np.isnan(values).any() and parse.percentiles_ordered(values)
        assert row.lat_min_ns <= row.lat_mean_ns <= row.lat_max_ns


def test_lat_logs_one_line_per_io_and_in_flight(ci_sweep) -> None:
    _, _, _, lat, again = ci_sweep
    total_ios = sum(job["read"]["total_ios"] for job in again["jobs"])
    assert len(lat) == total_ios and set(lat.job) == {1, 2}
    assert (lat.block_size_bytes == 65536).all() and (lat.direction == "read").all()
    mean_ns = again["jobs"][0]["read"]["lat_ns"]["mean"]
    assert lat.value_ns.mean() == pytest.approx(mean_ns, rel=0.01)
    flight = parse.in_flight(parse.io_events(lat))
    assert (flight.in_flight >= 0).all() and flight.in_flight.iloc[-1] == 0
    assert flight.in_flight.max() >= 2 and flight.submitted.iloc[-1] == total_ios


def test_raw_output_kept_and_only_own_file_removed(ci_sweep) -> None:
    sweep, run_dir, data_file, _, _ = ci_sweep
    assert not data_file.exists() and data_file.parent.exists()
    for name in sweep["name"]:
        for suffix in (".fio", ".json", ".stderr"):
            assert (run_dir / f"{name}{suffix}").is_file()
    assert len(parse.lat_log_files(run_dir / f"{sweep['name'].iloc[-1]}-log")) == 2
    lines = (run_dir / "sweep.jsonl").read_text().splitlines()
    assert [json.loads(line)["name"] for line in lines] == list(sweep["name"])
    assert (run_dir / "fill-target0.json").is_file()
    assert json.loads((run_dir / fio.MANIFEST).read_text()) == {"created": []}


def test_job_file_numjobs_get_their_own_slices(tmp_path) -> None:
    point = FioPoint(block_size_bytes=fio.MIB, iodepth=8, numjobs=4, n_targets=2,
                     runtime_s=None, io_size_bytes=8 * fio.MIB)
    text = fio.build_job_file(point, [tmp_path / "a:b.dat", tmp_path / "c.dat"], 10 * fio.MIB)
    assert "size=2097152" in text and "offset_increment=2097152" in text
    assert "io_size=8388608" in text and "time_based" not in text
    assert "[target0]" in text and "[target1]" in text and "a\\:b.dat" in text
    with pytest.raises(ValueError, match="targets"):
        fio.build_job_file(point, [tmp_path / "c.dat"], 10 * fio.MIB)
    with pytest.raises(ValueError, match="multiple of 4096"):
        FioPoint(block_size_bytes=1000)


def test_several_targets_one_group(tmp_path) -> None:
    with FioBench([tmp_path / "a.dat", tmp_path / "b.dat"], tmp_path / "run",
                  4 * fio.MIB) as bench:
        row = bench.sweep([FioPoint(block_size_bytes=65536, n_targets=2, runtime_s=0.2)],
                          progress=False).iloc[0]
        report = parse.load_fio_json(tmp_path / "run" / f"{row['name']}.json")
        assert len(report["jobs"]) == 1 and row.io_bytes > 0
    assert not (tmp_path / "a.dat").exists() and not (tmp_path / "b.dat").exists()


def test_b9_b10_measurements(tmp_path) -> None:
    chunk = 2 * fio.MIB
    with FioBench([tmp_path], tmp_path / "run", 8 * fio.MIB) as bench:
        chunks = fio.chunk_read_times(bench, chunk, n_chunks=6)
        events, flight = fio.queue_depth_run(bench, 256 * fio.KIB, 8, 2 * chunk)
    assert list(chunks.chunk_id) == list(range(6)) and (chunks.time_s > 0).all()
    assert (chunks.clat_s <= chunks.time_s).all()
    assert list(chunks.offset_bytes) == [0, chunk, 2 * chunk, 3 * chunk, 0, chunk]  # wraps
    assert len(events) == 16 and (flight.in_flight >= 0).all()
    assert flight.in_flight.iloc[-1] == 0


# --------------------------------------------------------------------------- errors


def test_failed_fio_run_quotes_fio(tmp_path) -> None:
    text = f"[bad]\nfilename={tmp_path / 'x.dat'}\nsize=1m\nioengine=nonexistent\nrw=read\n"
    with pytest.raises(FioError, match="engine nonexistent not loadable") as err:
        fio.run_fio(text, tmp_path, "bad")
    assert "exit code 1" in str(err.value)
    assert "not loadable" in (tmp_path / "bad.stderr").read_text()


def test_io_error_in_a_job_quotes_fio_and_the_errno(tmp_path) -> None:
    target = tmp_path / "x.dat"
    target.write_bytes(b"\0" * 65536)
    text = f"[bad-align]\nfilename={target}\nsize=64k\ndirect=1\nrw=read\nbs=1000\n"
    with pytest.raises(FioError, match="Invalid argument") as err:
        fio.run_fio(text, tmp_path, "bad-align")
    assert "error 22" in str(err.value)


def test_missing_fio_binary_says_how_to_install(tmp_path) -> None:
    with pytest.raises(FioNotFoundError, match="apt-get install fio"):
        FioBench([tmp_path], tmp_path / "run", SIZE, fio_path="/nonexistent/fio").prepare()
    with pytest.raises(FioNotFoundError, match="make fio"):
        fio.fio_version("no-such-fio-binary")


@pytest.mark.parametrize("where", ["/proc/kvrepro-fio-test.dat", "a-file/inside.dat"])
def test_unwritable_target_is_named(tmp_path, where) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    target = Path(where) if where.startswith("/") else tmp_path / where
    with pytest.raises(FioTargetError, match=str(target)):
        FioBench([target], tmp_path / "run", SIZE).prepare()
    assert not target.exists()


def test_existing_file_is_refused_unless_allowed(tmp_path) -> None:
    mine = tmp_path / "mine.dat"
    mine.write_bytes(os.urandom(4096))
    with pytest.raises(FioTargetError, match="existing file"):
        FioBench([mine], tmp_path / "run", fio.MIB).prepare()
    assert mine.stat().st_size == 4096
    with FioBench([mine], tmp_path / "run2", fio.MIB, allow_existing=True) as bench:
        bench.run(FioPoint(block_size_bytes=4096, runtime_s=0.1))
    assert mine.exists()  # not created by the bench, so not removed


def test_block_device_is_refused(tmp_path, monkeypatch) -> None:
    candidates = ["/dev/loop0", "/dev/vda", "/dev/sda", "/dev/nvme0n1"]
    device = next((Path(p) for p in candidates if fio.is_block_device(p)), None)
    if device is None:  # no block device visible: make the stat check say one is
        device = tmp_path / "fake-device"
        device.write_bytes(b"")
        monkeypatch.setattr(fio, "is_block_device", lambda path: Path(path) == device)
    with pytest.raises(FioTargetError, match="block device"):
        FioBench([device], tmp_path / "run", SIZE).prepare()
    assert not fio.is_block_device(tmp_path / "missing")


def test_failed_preparation_removes_what_it_created(tmp_path, monkeypatch) -> None:
    def broken_fill(self, path, index):
        raise FioError("fill failed")

    monkeypatch.setattr(FioBench, "_fill", broken_fill)
    with pytest.raises(FioError, match="fill failed"):
        with FioBench([tmp_path / "a.dat"], tmp_path / "run", fio.MIB):
            pass
    assert not (tmp_path / "a.dat").exists()


def test_too_large_buffers_are_refused(tmp_path) -> None:
    with FioBench([tmp_path], tmp_path / "run", fio.MIB, max_buffer_bytes=fio.MIB) as bench:
        with pytest.raises(ValueError, match="max_buffer_bytes"):
            bench.run(FioPoint(block_size_bytes=fio.MIB, iodepth=2, runtime_s=0.1))
