"""Command-line errors are clear and name the bad input (no server is started for them)."""

from pathlib import Path

from kvrepro import cli

TIERS = str(Path(__file__).resolve().parents[1] / "data" / "tiers" / "cpu_tiny.yaml")


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
