"""Issue 24, items 7 and 10: names that become folders stay inside `--out`, and the YAML the
package reads refuses aliases (a 466-byte "billion laughs" chain).

Each name test gives a real spec file or a real campaign a tier called like a path
(`../../escaped-run`) and checks, on the disk, that nothing was written next to `--out`.
The live campaigns are stopped before any process starts (a port held by the test, a tier
that does not exist), so no server is launched, on this code or on the old one.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import yaml

from kvrepro import cli
from kvrepro._paths import data_dir
from kvrepro.engines.sim import sim_profile
from kvrepro.engines.sim.campaign import campaign
from kvrepro.fleet_spec import load_fleet, shipped_fleet
from kvrepro.tier_spec import load_server, shipped_server
from kvrepro.workload import AgenticSpec, generate_agentic

ESCAPING = "../../escaped-run"
STUDY_A = data_dir() / "servers" / "study_a.yaml"


def _layout(tmp_path: Path) -> tuple[Path, Path]:
    """(`--out` two levels below tmp_path, where ESCAPING from it would land)."""
    out = tmp_path / "a" / "b" / "out"
    return out, tmp_path / "a" / "escaped-run"


def _written_outside(tmp_path: Path, out: Path, *keep: Path) -> list[str]:
    """Every file or folder under tmp_path that is not `out`, inside it, a folder above
    it, or one of `keep` (the test's own inputs)."""
    allowed = {out, *out.parents, *keep}
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                  if p not in allowed and not p.is_relative_to(out))


def _spec_with_escaping_tier(path: Path) -> Path:
    """study_a's server spec with its `dram` tier renamed to ESCAPING, written to `path`."""
    raw = yaml.safe_load(STUDY_A.read_text())
    raw["tiers"] = {"baseline": raw["tiers"]["baseline"], ESCAPING: raw["tiers"]["dram"]}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# --------------------------------------------------------------- item 7: names become paths


def test_spec_file_with_a_path_as_tier_name_fails_at_load(tmp_path: Path) -> None:
    spec = _spec_with_escaping_tier(tmp_path / "escaping.yaml")
    with pytest.raises(ValueError) as err:
        load_server(spec)
    message = str(err.value)
    assert message.startswith(f"{spec}: invalid server spec: key tiers.{ESCAPING}: ")
    assert "cannot name a folder" in message


def test_fleet_file_with_a_path_as_tier_name_fails_at_load(tmp_path: Path) -> None:
    raw = yaml.safe_load((data_dir() / "fleets" / "cpu_tiny_2x.yaml").read_text())
    spec = tmp_path / "fleet.yaml"
    spec.write_text(yaml.safe_dump({**raw, "tier": ESCAPING}))
    with pytest.raises(ValueError, match=rf"^{spec}: invalid fleet spec: key tier: .*"
                                         "cannot name a folder"):
        load_fleet(spec)
    with pytest.raises(ValueError, match="shipped server '..' cannot name a folder"):
        shipped_server("..")


def test_cli_run_sim_with_a_path_as_tier_name_writes_nothing(tmp_path: Path, capsys) -> None:
    out, escaped = _layout(tmp_path)
    spec = _spec_with_escaping_tier(tmp_path / "escaping.yaml")
    code = cli.main(["run", "sim", "--profile", str(spec), "--tier", ESCAPING,
                     "-w", "duration_s=60", "--out", str(out)])
    err = capsys.readouterr().err
    assert not escaped.exists()
    assert _written_outside(tmp_path, out, spec) == []
    assert not out.exists()  # refused before anything was written
    assert code == 2
    assert str(spec) in err and f"key tiers.{ESCAPING}" in err


def test_sim_campaign_keeps_every_tier_folder_inside_out(tmp_path: Path) -> None:
    """A profile built in code (not from a spec file) reaches the campaign unchecked: the
    campaign itself refuses a tier folder outside `out_dir`, also through a symlink."""
    out, escaped = _layout(tmp_path)
    profile = sim_profile(load_server(STUDY_A))
    tier = profile.tiers["dram"]
    renamed = profile.model_copy(update={"tiers": {
        "baseline": profile.tiers["baseline"],
        ESCAPING: tier.model_copy(update={"name": ESCAPING})}})
    workload = generate_agentic(AgenticSpec(duration_s=60, seed=1))
    with pytest.raises(ValueError, match="cannot name a folder"):
        campaign(workload, renamed, out_dir=out, duration_s=60, progress=False)
    assert not escaped.exists() and _written_outside(tmp_path, out) == []
    assert not (out / "baseline").exists()  # checked before the first tier ran

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out.mkdir(parents=True)
    (out / "dram").symlink_to(elsewhere)
    with pytest.raises(ValueError, match="resolves outside"):
        campaign(workload, profile, ["dram"], out_dir=out, duration_s=60, progress=False)
    assert list(elsewhere.iterdir()) == []


def test_live_campaign_checks_tier_folders_before_starting(tmp_path: Path) -> None:
    from kvrepro.engines.live.runner import LiveOptions, run_campaign
    from kvrepro.engines.live.tiers import live_tier

    out, escaped = _layout(tmp_path)
    with socket.socket() as held:  # the tier's port is taken: no server could start
        held.bind(("127.0.0.1", 0))
        held.listen()
        tier = live_tier(shipped_server("cpu_tiny"), "small-kv").model_copy(
            update={"name": ESCAPING, "port": held.getsockname()[1],
                    "model": str(tmp_path / "no-model")})
        workload = generate_agentic(AgenticSpec(duration_s=10, seed=1))
        with pytest.raises(ValueError, match="cannot name a folder"):
            run_campaign([tier], workload, out, LiveOptions(python=str(tmp_path / "no-py")))
    assert not escaped.exists() and _written_outside(tmp_path, out) == []


def test_fleet_campaign_checks_run_folders_before_starting(tmp_path: Path) -> None:
    from kvrepro.engines.live.fleet_deploy import FleetOptions, run_fleet_campaign

    out = tmp_path / "a" / "b" / "out"
    fleet = shipped_fleet("cpu_tiny_2x").model_copy(update={"tier": "x/../../../escaped-run"})
    workload = generate_agentic(AgenticSpec(duration_s=10, seed=1))
    options = FleetOptions(router="client", python=str(tmp_path / "no-py"))
    with pytest.raises(ValueError, match="cannot name a folder"):
        run_fleet_campaign([fleet], workload, out, options)
    assert _written_outside(tmp_path, out) == []


# ---------------------------------------------------------- item 10: YAML alias expansion


def _laughs(levels: int = 7, width: int = 10) -> str:
    """The "billion laughs" chain: each level lists the one before `width` times, so
    `levels` levels are width**levels leaves (10 M) in a few hundred bytes."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for level in range(1, levels):
        items = ", ".join([f"*a{level - 1}"] * width)
        lines.append(f"a{level}: &a{level} [{items}]")
    return "\n".join(lines) + "\n"


def _spec_with_extra(path: Path, yaml_lines: str) -> tuple[Path, str]:
    """study_a's spec with a tier `laughs` whose `lmcache.extra` is `yaml_lines`, written
    to `path`; (path, its text)."""
    extra = "".join(f"        {line}\n" for line in yaml_lines.splitlines())
    text = STUDY_A.read_text().replace(
        "tiers:\n", "tiers:\n  laughs:\n    lmcache:\n      extra:\n" + extra, 1)
    path.write_text(text)
    return path, text


def test_billion_laughs_in_a_spec_is_refused_quickly(tmp_path: Path) -> None:
    chain = _laughs()
    assert len(chain.encode()) <= 500  # the 466 bytes, give or take the key names
    spec, text = _spec_with_extra(tmp_path / "laughs.yaml", chain)
    alias_line = next(i for i, line in enumerate(text.splitlines(), 1) if "*a0" in line)
    started = time.perf_counter()
    with pytest.raises(ValueError) as err:
        load_server(spec)
    assert time.perf_counter() - started < 1.0
    message = str(err.value)
    assert message.startswith(f"{spec}: ") and "found alias *a0" in message
    assert f'in "{spec}", line {alias_line},' in message

    # An anchor without an alias repeats nothing: read as yaml.safe_load reads it.
    plain, _ = _spec_with_extra(tmp_path / "anchor.yaml", "a0: &a0 [lol, lol]\na1: [lol]")
    assert load_server(plain).tiers["laughs"].lmcache.extra == {"a0": ["lol", "lol"],
                                                               "a1": ["lol"]}
