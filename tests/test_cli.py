"""Command-line errors are clear and name the bad input (no server is started for them)."""

from pathlib import Path

from kvrepro import cli

TIERS = str(Path(__file__).resolve().parents[1] / "data" / "servers" / "cpu_tiny.yaml")


def test_unknown_tier_is_named(capsys) -> None:
    assert cli.main(["run", "live", "--tiers", TIERS, "--tier", "nope"]) == 2
    assert "--tier ['nope'] not in" in capsys.readouterr().err


def test_misspelled_workload_parameter_is_named(capsys) -> None:
    assert cli.main(["run", "live", "--tiers", TIERS, "-w", "sesion_rate_per_min=3"]) == 2
    assert "sesion_rate_per_min" in capsys.readouterr().err


def test_unknown_workload_kind(capsys) -> None:
    assert cli.main(["run", "live", "--tiers", TIERS, "--workload", "chat"]) == 2
    assert "unknown workload kind 'chat'" in capsys.readouterr().err


def test_missing_tier_file(capsys, tmp_path) -> None:
    assert cli.main(["run", "live", "--tiers", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml" in capsys.readouterr().err


PROFILE = str(Path(__file__).resolve().parents[1] / "data" / "servers" / "study_a.yaml")


def test_run_sim_writes_run_folders(tmp_path, capsys) -> None:
    from kvrepro.records import read_run

    code = cli.main(["run", "sim", "--profile", PROFILE, "--tier", "dram", "-p", "dram_gb=64",
                     "-w", "duration_s=300", "--out", str(tmp_path)])
    assert code == 0
    assert "tier dram:" in capsys.readouterr().out
    run = read_run(tmp_path / "dram")
    assert run.meta["engine"] == "sim" and len(run.records) > 0
    assert run.samples.dram_capacity_bytes.max() <= 64e9


def test_run_sim_errors_name_the_input(capsys) -> None:
    assert cli.main(["run", "sim", "--profile", PROFILE, "--tier", "nope"]) == 2
    assert "--tier ['nope'] not in" in capsys.readouterr().err
    assert cli.main(["run", "sim", "--profile", PROFILE, "-p", "nvme_gb=1"]) == 2
    assert "nvme_gb" in capsys.readouterr().err
