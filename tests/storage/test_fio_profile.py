"""The measured flash profile: from a sweep, to YAML, into the simulator; endurance; figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from kvrepro import cli
from kvrepro.calc import endurance
from kvrepro.engines.sim import load_profile
from kvrepro.engines.sim.config import OffloadTier, tier_record
from kvrepro.engines.sim.offload import Channel, read_channel
from kvrepro.plots import storage_figures as sfigs
from kvrepro.storage import endurance_traffic as et
from kvrepro.storage import fio
from kvrepro.storage import profile as sp
from kvrepro.studies import flash_profile as fp
from kvrepro.studies.study_b import run_b6, study_b_headlines, study_b_profile

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "tests" / "engines" / "sim" / "profile_small.yaml"
STUDY_A = ROOT / "data" / "servers" / "study_a.yaml"
SMALL_CHUNK = 256 * 2048  # profile_small: 2,048 B per token, default 256-token chunks


def _sweep(chunk: int) -> pd.DataFrame:
    rows = []
    for rw, bws in (("read", {1: 1.0e9, 4: 2.0e9, 16: 1.8e9}),
                    ("write", {1: 0.5e9, 4: 0.8e9, 16: 0.9e9})):
        for qd, bw in bws.items():
            rows.append({"rw": rw, "direction": rw, "block_size_bytes": chunk, "iodepth": qd,
                         "numjobs": 1, "n_targets": 1, "engine": "io_uring", "bw_bytes_s": bw,
                         "lat_mean_ns": chunk / bw * 1e9 * (1.5 if qd == 1 else 1.0)})
    rows.append({**rows[1], "numjobs": 4, "bw_bytes_s": 9e9})  # not single-job: ignored
    return pd.DataFrame(rows)


def _measured(chunk: int = SMALL_CHUNK, model: str = "test-tiny") -> sp.MeasuredFlashProfile:
    times = chunk / 2.0e9 + np.array([1e-4, 2e-4, 3e-4, 4e-4, -1e-5])
    reads = pd.DataFrame({"chunk_id": range(5), "time_s": times, "tier": "SSD"})
    return sp.flash_profile_from_measurements(
        _sweep(chunk), reads, model=model, chunk_tokens=256, chunk_bytes=chunk,
        engine="io_uring", fio_version="fio-3.33", targets=["/tmp/x"])


def test_profile_from_measurements() -> None:
    m = _measured()
    assert m.read_bw_bytes_s == 2.0e9 and m.provenance.iodepth == 4  # fastest read depth
    assert m.write_bw_bytes_s == 0.8e9  # writes at the same size and depth
    assert m.chunk_read_latency_samples_s == pytest.approx([1e-4, 2e-4, 3e-4, 4e-4, 0.0])
    assert m.chunk_read_latency_s == pytest.approx(2e-4) and m.provenance.n_clipped == 1
    # depth-1 chunk write took 1.5 x its transfer time at 0.5 GB/s; minus transfer at 0.8
    assert m.chunk_write_latency_s == pytest.approx(SMALL_CHUNK * (1.5 / 0.5e9 - 1 / 0.8e9))
    assert m.chunk_read_time_p50_s == pytest.approx(SMALL_CHUNK / 2e9 + 2e-4)
    fixed = sp.flash_profile_from_measurements(
        _sweep(SMALL_CHUNK), pd.DataFrame({"time_s": [0.01]}), model="test-tiny",
        chunk_tokens=256, chunk_bytes=SMALL_CHUNK, engine="io_uring", fio_version="fio-3.33",
        targets=["/tmp/x"], iodepth=16)
    assert fixed.read_bw_bytes_s == 1.8e9 and fixed.write_bw_bytes_s == 0.9e9
    with pytest.raises(ValueError, match="no read point at block size 4096"):
        sp.flash_profile_from_measurements(
            _sweep(SMALL_CHUNK), pd.DataFrame({"time_s": [0.01]}), model="test-tiny",
            chunk_tokens=256, chunk_bytes=SMALL_CHUNK, engine="io_uring",
            fio_version="fio-3.33", targets=["/tmp/x"], block_size_bytes=4096)


def test_profile_yaml_round_trip(tmp_path) -> None:
    m = _measured()
    path = sp.save_flash_profile(m, tmp_path / "measured.yaml")
    assert path.read_text().startswith("# Flash tier measured with fio")
    back = sp.load_flash_profile(path)
    assert back == m and back.provenance.fio_version == "fio-3.33"
    raw = yaml.safe_load(path.read_text())
    raw["read_bw_bytes_s"] = -1
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="read_bw_bytes_s"):
        sp.load_flash_profile(path)
    (tmp_path / "other.yaml").write_text("server: {}\n")
    with pytest.raises(ValueError, match="not a measured flash profile"):
        sp.load_flash_profile(tmp_path / "other.yaml")


def test_apply_flash_profile_changes_only_the_flash_store() -> None:
    base = load_profile(SMALL)
    m = _measured()
    out = fp.apply_flash_profile(base, m)
    before, after = base.model_dump(), out.model_dump()
    flash_before = before["tiers"]["flash"]["stores"][1]
    flash_after = after["tiers"]["flash"]["stores"].pop(1)
    before["tiers"]["flash"]["stores"].pop(1)
    assert before == after  # every other store, tier and server field unchanged
    changed = {k for k in flash_after if flash_after[k] != flash_before[k]}
    assert changed == set(sp.TIER_FIELDS)
    assert flash_after["read_bw_bytes_s"] == m.read_bw_bytes_s
    assert flash_after["capacity_bytes"] == flash_before["capacity_bytes"]


def test_apply_flash_profile_errors() -> None:
    base = load_profile(SMALL)
    with pytest.raises(ValueError, match="no offload store named \\['nvme'\\]"):
        fp.apply_flash_profile(base, _measured(), store="nvme")
    with pytest.raises(ValueError, match="measure again"):
        fp.apply_flash_profile(base, _measured(chunk=4096 * 256))


def test_latency_samples_drawn_per_chunk_and_seeded() -> None:
    store = OffloadTier(name="flash", capacity_bytes=1e9, read_bw_bytes_s=1e9,
                        write_bw_bytes_s=1e9, chunk_read_latency_s=0.5,
                        chunk_read_latency_samples_s=[0.001, 0.003])
    a, b = read_channel(store), read_channel(store)
    done = [a.submit(0.0, 4, 1000) for _ in range(5)]
    assert done == [b.submit(0.0, 4, 1000) for _ in range(5)]  # same store: same draws
    steps = np.diff([0.0, *done])
    per_chunk = (steps - 4 * 1e-6) / 4  # each read: 4 chunks of 1 us transfer + draws
    assert ((per_chunk >= 0.001 - 1e-12) & (per_chunk <= 0.003 + 1e-12)).all()
    plain = read_channel(store.model_copy(update={"chunk_read_latency_samples_s": []}))
    assert plain == Channel(1e9, 0.5) and plain.submit(0.0, 2, 1000) == 2 * (1e-6 + 0.5)
    with pytest.raises(ValueError):
        OffloadTier(name="x", capacity_bytes=1, read_bw_bytes_s=1, write_bw_bytes_s=1,
                    chunk_read_latency_samples_s=[-1.0])


def test_studyb_measured_profile_and_b6() -> None:
    study = study_b_profile()
    m = _measured(chunk=256 * 163_840, model="Qwen3-14B-BF16")
    prof = fp.studyb_measured_profile(study, m)
    ssd1 = prof.tiers["ssd1"].stores[0]
    assert ssd1.read_bw_bytes_s == pytest.approx(1 / (1 / 2e9 + 1 / 13e9))
    assert ssd1.chunk_read_latency_samples_s == m.chunk_read_latency_samples_s
    assert prof.tiers["ssd4"].stores[0].read_bw_bytes_s > ssd1.read_bw_bytes_s
    assert prof.tiers["opt"].stores[0].read_bw_bytes_s == 8e9  # min(4 x 2, 13) GB/s
    assert prof.tiers["mem"] == study.tiers["mem"]
    with pytest.raises(RuntimeError, match="not fully served"):  # writes at 0.8 GB/s drop
        run_b6(prof)
    ready, spec = fp.b6_for_slow_writes(prof)
    assert spec.gap_s > 5.0 and spec.round_gap_s == spec.gap_s
    assert ready.tiers["ssd1"].stores[0].max_write_backlog_s == pytest.approx(spec.gap_s)
    heads = study_b_headlines(run_b6(ready, spec))
    assert heads["B6.untuned_high"] > heads["B6.untuned_low"] > 1.0
    same, spec = fp.b6_for_slow_writes(study)  # the study's drives keep up: nothing changes
    assert spec.gap_s == 5.0 and same == study


def test_dram_copy_times() -> None:
    times = sp.dram_chunk_copy_times(1 << 20, n_chunks=5)
    assert list(times.chunk_id) == list(range(5)) and (times.time_s > 0).all()
    assert set(times.tier) == {"DRAM"}
    with pytest.raises(ValueError, match="n_chunks"):
        sp.dram_chunk_copy_times(1 << 20, n_chunks=0)


# --------------------------------------------------------------------------- the CLI


def test_cli_flash_profile(tmp_path, capsys) -> None:
    study_a = load_profile(STUDY_A)
    chunk = 256 * study_a.server.model_spec().kv_bytes_per_token
    measured = sp.save_flash_profile(_measured(chunk=chunk, model="MiniMax-M2.7-FP8"),
                                     tmp_path / "measured.yaml")
    code = cli.main(["run", "sim", "--profile", str(STUDY_A), "--tier", "flash",
                     "--flash-profile", str(measured), "-w", "duration_s=120",
                     "--out", str(tmp_path / "run")])
    assert code == 0 and "tier flash:" in capsys.readouterr().out
    meta = json.loads((tmp_path / "run" / "flash" / "meta.json").read_text())
    stores = {s["name"]: s for s in tier_record(meta["tier_config"])["stores"]}
    assert stores["flash"]["read_bw_bytes_s"] == 2.0e9
    assert stores["flash"]["chunk_read_latency_samples_s"] == pytest.approx(
        [1e-4, 2e-4, 3e-4, 4e-4, 0.0])
    staging = {s.name: s for s in study_a.tiers["flash"].stores}["staging"]
    assert stores["staging"] == staging.model_dump(mode="json")  # the other store is kept


def test_cli_flash_profile_errors(tmp_path, capsys) -> None:
    measured = sp.save_flash_profile(_measured(), tmp_path / "measured.yaml")
    assert cli.main(["run", "sim", "--profile", str(STUDY_A), "--flash-profile",
                     str(measured)]) == 2
    assert "measure again" in capsys.readouterr().err
    assert cli.main(["run", "sim", "--profile", str(STUDY_A), "--flash-profile",
                     str(measured), "--flash-store", "nvme"]) == 2
    assert "no offload store named ['nvme']" in capsys.readouterr().err
    assert cli.main(["run", "sim", "--profile", str(STUDY_A), "--flash-profile",
                     str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml" in capsys.readouterr().err


# --------------------------------------------------------------------------- endurance


def test_endurance_from_write_rate_uses_the_foundation() -> None:
    drive = et.DriveModel(capacity_bytes=3.84e12, nand="TLC")
    row = et.endurance_from_write_rate(1.9e9, drive, n_drives=8, raid_level=10)
    assert row["dwpd_used"] == pytest.approx(
        endurance.dwpd_from_write_rate(1.9e9, 8, 3.84e12, "RAID10"))
    tlc = endurance.nand_presets().set_index("name").loc["TLC"]
    assert row["dwpd_rated"] == pytest.approx(tlc.dwpd)
    assert row["tbw_bytes"] == pytest.approx(endurance.tbw_bytes(tlc.pe_cycles, 3.84e12,
                                                                  tlc.waf))
    assert row["years_to_rated_endurance"] == pytest.approx(
        5 * row["dwpd_rated"] / row["dwpd_used"])
    own = et.DriveModel(capacity_bytes=1e12, nand=None, pe_cycles=3000, waf=2,
                        rating_days=1825)
    assert et.endurance_from_write_rate(1e8, own)["dwpd_rated"] == pytest.approx(
        3000 / 2 / 1825)
    with pytest.raises(ValueError, match="pe_cycles, waf and rating_days"):
        et.DriveModel(capacity_bytes=1e12, nand=None).rating()
    with pytest.raises(ValueError, match="unknown NAND preset 'MLC'"):
        et.DriveModel(capacity_bytes=1e12, nand="MLC").rating()


def test_write_rates_from_fio_sim_and_trace() -> None:
    sweep = _sweep(SMALL_CHUNK)
    assert et.write_rate_from_fio(sweep) == 0.9e9
    with pytest.raises(ValueError, match="no write point at block size 4096"):
        et.write_rate_from_fio(sweep, block_size_bytes=4096)
    samples = pd.DataFrame({"time_s": [0.0, 10.0, 20.0, 30.0],
                            "flash_bytes_written": [0, 1e9, 3e9, 5e9]})
    assert et.write_rate_from_samples(samples, "flash") == pytest.approx(5e9 / 30)
    assert et.write_rate_from_samples(samples, "flash", warmup_s=10) == pytest.approx(2e8)
    with pytest.raises(ValueError, match="stores: \\['flash'\\]"):
        et.write_rate_from_samples(samples, "dram")
    assert et.write_rate_from_volume(86_400e9, 86_400) == 1e9


# --------------------------------------------------------------------------- figures


def test_storage_figures() -> None:
    sweep = pd.DataFrame([{"rw": rw, "direction": rw, "block_size_bytes": bs, "iodepth": qd,
                           "numjobs": 1, "n_targets": 1, "bw_bytes_s": bs * qd / 1e3}
                          for rw in ("read", "write") for bs in (4096, 65536) for qd in (1, 4)])
    sweep = pd.concat([sweep, sweep.iloc[[0]].assign(numjobs=2, bw_bytes_s=8192 / 1e3)],
                      ignore_index=True)
    panels = fio.b5_panels(sweep, 4096, 1)
    assert set(panels.panel) == {"request size", "jobs", "targets"}
    assert panels.groupby("direction").norm_throughput.max().eq(1.0).all()
    fig = sfigs.b5_ssd_parallelism(panels)
    request_size, streams = fig.axes
    assert [t.get_text() for t in request_size.get_legend().texts] == [
        "iodepth 1", "read", "iodepth 4", "write"]  # colour = depth, line style = direction
    assert [t.get_text() for t in streams.get_legend().texts] == [
        "jobs (threads)", "targets (drives): only 1 measured"]
    assert not any(t.get_rotation() for t in request_size.get_xticklabels())
    chunks = pd.DataFrame({"chunk_id": [0, 1, 0, 1], "time_s": [1e-3, 2e-3, 1e-4, 1e-4],
                           "tier": ["SSD", "SSD", "DRAM", "DRAM"]})
    assert sfigs.b9_chunk_io_latency(chunks).get_ylabel() == "I/O time per chunk (ms)"
    flight = pd.DataFrame({"time_ms": [0.0, 1.0, 2.0, 3.0], "in_flight": [1, 2, 1, 0],
                           "submitted": [1, 2, 2, 2], "completed": [0, 0, 1, 2]})
    ax = sfigs.b10_io_queue_depth(flight, iodepth=2)
    assert "first completion (2.0 ms)" in [t.get_text() for t in ax.get_legend().texts]
    with pytest.raises(ValueError, match="figure B9"):
        sfigs.b9_chunk_io_latency(chunks.drop(columns="tier"))


def test_b5_points_dedupe_the_base() -> None:
    points = fio.b5_points([4096, 65536], [1, 4], [1, 2], n_targets=2, rws=("read", "write"))
    names = [p.name() for p in points]
    assert len(names) == len(set(names)) == 8 + 1 + 1  # grid, numjobs=2, targets=2
    assert all(p.runtime_s == 1.0 for p in points)
