"""Notebook 11 end to end with small parameters: fio for real, figures, profile, headlines."""

from __future__ import annotations

from kvrepro.plots import MEASURED_HERE
from kvrepro.reproduce import reproduce
from kvrepro.storage.profile import load_flash_profile
from tests.conftest import NOTEBOOKS

SMALL = {"file_size_gib": 0.0625, "point_runtime_s": 0.2, "block_sizes": [65536],
         "iodepths": [1, 4], "numjobs": [1, 2], "n_chunks": 5, "b10_block_size": 262144,
         "b10_iodepth": 8, "b10_chunks": 1}


def test_storage_notebook_small(tmp_path) -> None:
    result = reproduce(NOTEBOOKS, tmp_path / "fig", tmp_path / "runs", ["11_storage"], SMALL)
    assert not result.failures, result.failures
    assert not any((tmp_path / "fig").glob("*.png"))  # measured here: not a tracked figure
    figures = {p.name for p in (tmp_path / "fig" / MEASURED_HERE).iterdir()}
    for name in ("B5-ssd-parallelism", "B9-chunk-io-latency", "B10-io-queue-depth",
                 "B6-measured-flash"):
        assert f"{name}.png" in figures
    ids = set(result.headlines.id)
    assert ids == {"B9.ssd_chunk_ms_low", "B9.ssd_chunk_ms_high"}  # B6.*: notebook 05's
    assert "B6.untuned_low" in result.executed[0].read_text()  # B6 here: shown as a table
    raw = result.run_dir / "11_storage_fio"
    measured = load_flash_profile(raw / "measured_flash_profile.yaml")
    assert measured.chunk_bytes == 256 * 163_840 and measured.provenance.chunk_reads == 5
    assert (raw / "sweep.jsonl").read_text().count("\n") == 2 * 2 * 2 + 1
    assert (raw / "created_files.json").read_text() == '{"created": []}'  # all removed


def test_storage_notebook_for_another_model_skips_study_b(tmp_path) -> None:
    """Study A's chunk (MiniMax, BF16 KV) is measured; B6 needs study B's chunk, so it is
    skipped with a message instead of failing, and the profile fits study A's flash store."""
    params = {**SMALL, "model": "MiniMax-M2.7-FP8-KV-BF16", "n_chunks": 3}
    result = reproduce(NOTEBOOKS, tmp_path / "fig", tmp_path / "runs", ["11_storage"], params)
    assert not result.failures, result.failures
    here = {p.name for p in (tmp_path / "fig" / MEASURED_HERE).iterdir()}
    assert "B6-measured-flash.png" not in here
    assert set(result.headlines.id) == {"B9.ssd_chunk_ms_low", "B9.ssd_chunk_ms_high"}
    measured = load_flash_profile(result.run_dir / "11_storage_fio" / "measured_flash_profile.yaml")
    assert measured.chunk_bytes == 256 * 253_952
