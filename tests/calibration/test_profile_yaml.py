"""The tiny server's spec has one source for what is stated, not fitted: `profile_yaml` reads
the LMCache tiers' sizes, write rates and flags from the spec it regenerates and writes over
the fitted numbers only, so a hand edit of the YAML survives the next regeneration."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvrepro._paths import data_dir, data_file
from kvrepro.calibration import preregister, profile_yaml, validate
from kvrepro.calibration.fit_host import demand_path
from kvrepro.engines.sim import load_profile

SHIPPED = data_file("servers", "cpu_tiny.yaml")
FIT_RUN = data_file("live", validate.FIT_RUN)
FLASH_4GIB = "capacity_bytes: 4294967296  # 4 GiB = 16,384 chunks"
STAGING_RATE = ("read_bw_bytes_s: 3.0e+08  # estimate: LMCACHE_CPU.md's single-prompt timings "
                "(not fitted: see above)")


def _hand_edited(tmp_path: Path) -> Path:
    """A copy of the shipped spec with the flash store at 2 GiB and the staging store's
    (never fitted) read rate at 250 MB/s, edited by hand."""
    path = tmp_path / "cpu_tiny.yaml"
    text = SHIPPED.read_text()
    assert text.count(FLASH_4GIB) == 1 and text.count(STAGING_RATE) == 1
    path.write_text(text.replace(FLASH_4GIB, "capacity_bytes: 2147483648")
                    .replace(STAGING_RATE, "read_bw_bytes_s: 2.5e+08"))
    return path


def _stores(path: Path) -> dict[str, tuple[float, float]]:
    """(capacity, read rate) of each store of the flash tier."""
    return {s.name: (s.capacity_bytes, s.read_bw_bytes_s)
            for s in load_profile(path).tiers["flash"].stores}


def _written_specs() -> list:
    """Every shipped spec the fit routine wrote, with its campaign (relative to the
    checkout): the package's, on the fit run, and each pre-registered draw's own, on its
    plan's `fitted_on`."""
    root = data_dir().parent
    specs = [pytest.param(FIT_RUN.relative_to(root), SHIPPED, [], id=SHIPPED.stem)]
    for folder, _ in validate.DRAWS:
        plan = preregister.load_plan(preregister.plan_path(data_file("live", folder)))
        if plan.fitted_on:
            specs.append(pytest.param(Path(plan.fitted_on), root / plan.server,
                                      plan.fit_options, id=folder))
    return specs


@pytest.mark.parametrize(("run", "shipped", "options"), _written_specs())
def test_the_shipped_spec_is_byte_for_byte_what_the_routine_writes(
        run: Path, shipped: Path, options: list[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As its header says it was written: `python -m kvrepro.calibration [options]
    <campaign> <out>` from the checkout (the run's path is in the header, the options in the
    draw's plan); nothing of it was typed in."""
    monkeypatch.chdir(data_dir().parent)
    fresh = tmp_path / shipped.name  # no spec there: the package's is the stated one
    profile_yaml.main([*options, str(run), str(fresh)])
    assert fresh.read_bytes() == shipped.read_bytes()
    demand = demand_path(shipped)  # the measured demand next to it, the same too
    assert (tmp_path / demand.name).read_bytes() == demand.read_bytes()


def test_the_package_spec_regenerated_in_place_is_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regenerated in place, a spec reads its own stated values: the same bytes. (Once, on
    the package's spec: the draws' specs are written by the same code path.)"""
    monkeypatch.chdir(data_dir().parent)  # the header names the run as the command did
    again = tmp_path / SHIPPED.name
    shutil.copyfile(SHIPPED, again)
    profile_yaml.fit_and_write(FIT_RUN.relative_to(data_dir().parent), again)
    assert again.read_bytes() == SHIPPED.read_bytes()


@pytest.mark.parametrize(("options", "named"), [
    (["--prefill-request-from", "data/live/cpu_tiny_fit_one_session"],
     "--prefill-request-from needs --attention-rate"),
    (["--attention-rate", "--prefill-request-from", "no/such/run"],
     "--prefill-request-from: no such folder: no/such/run"),
])
def test_the_routine_refuses_a_bad_option_naming_it(
        options: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad input: one line naming the option, exit 2, nothing written."""
    monkeypatch.chdir(data_dir().parent)
    out = tmp_path / "spec.yaml"
    with pytest.raises(SystemExit) as stop:
        profile_yaml.main([*options, str(FIT_RUN), str(out)])
    assert stop.value.code == 2
    assert named in capsys.readouterr().err
    assert not out.exists()


def test_a_recording_too_few_lone_requests_for_the_intake_is_refused_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--engine-intake on a campaign whose baseline has 2 lone requests: one line naming the
    recording, exit 2, nothing written."""
    monkeypatch.chdir(data_dir().parent)
    out = tmp_path / "spec.yaml"
    with pytest.raises(SystemExit) as stop:
        profile_yaml.main([profile_yaml.ENGINE_INTAKE_FLAG, "data/live/cpu_tiny_fit_seventh",
                           str(out)])
    assert stop.value.code == 2
    assert "cpu_tiny_fit_seventh/small-kv: only 2 lone requests" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_hand_edit_of_a_stated_value_survives_regeneration(tmp_path: Path) -> None:
    path = _hand_edited(tmp_path)
    profile_yaml.fit_and_write(FIT_RUN, path)  # regenerated into the edited spec
    text = path.read_text()
    assert _stores(path) == {"staging": (52428800, 2.5e8),
                             "flash": (2 * 2**30, pytest.approx(_stores(SHIPPED)["flash"][1],
                                                                rel=0.05))}
    assert "capacity_bytes: 2147483648  # 2 GiB = 8,192 chunks" in text
    assert "4 GiB" not in text  # the comments say the stated size too
    assert "read_bw_bytes_s: 2.5e+08  # estimate" in text


def test_a_baseline_tier_the_fit_run_did_not_serve_keeps_its_stated_budget(
        tmp_path: Path) -> None:
    """`large-kv` (no stores, not in the fit run) is stated in the spec only: a hand edit of
    its budget survives (it was a constant in the writer, and came back as 256 MiB)."""
    path = tmp_path / "cpu_tiny.yaml"
    text = SHIPPED.read_text()
    assert text.count("kv_cache_bytes: 268435456") == 1
    path.write_text(text.replace("kv_cache_bytes: 268435456", "kv_cache_bytes: 134217728"))
    profile_yaml.fit_and_write(FIT_RUN, path)
    assert load_profile(path).tiers["large-kv"].kv_cache_bytes == 134217728


def test_the_stated_spec_can_be_passed_explicitly(tmp_path: Path) -> None:
    stated = _hand_edited(tmp_path)
    out = tmp_path / "out.yaml"
    shutil.copyfile(SHIPPED, out)  # passed explicitly, the stated spec wins over OUT's own
    profile_yaml.fit_and_write(FIT_RUN, out, stated_spec=stated)
    assert _stores(out)["flash"][0] == 2 * 2**30
    assert _stores(out)["staging"] == (52428800, 2.5e8)


@pytest.fixture(scope="module")
def fresh_fit(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The fit routine on the fit run into a folder without a spec (the package's is the
    stated one): (fit, offload fits, profile, path), shared by the tests that only read it."""
    return profile_yaml.fit_and_write(FIT_RUN, tmp_path_factory.mktemp("fit") / "fresh.yaml")


def test_fitted_parameters_follow_the_fit(fresh_fit: tuple) -> None:
    """Read rates and connector costs are `fitted` (the lookups `measured`) where the fit
    gave them, and those are `validate.FITTED_PARAMETERS`, the kinds of a profile read from
    a file."""
    _, fits, fresh, _ = fresh_fit
    table = profile_yaml.fitted_parameters(fresh, offload_fits=fits)
    given = table[table.kind.isin(profile_yaml.FIT_KINDS)]
    assert set(given.parameter) == set(validate.FITTED_PARAMETERS)
    assert set(table[table.kind == "measured"].parameter) == {"dram.twin_lookup_s",
                                                              "flash.twin_lookup_s"}
    from_file = profile_yaml.fitted_parameters(load_profile(SHIPPED))
    assert from_file.kind.tolist() == table.kind.tolist()
    no_fit = profile_yaml.fitted_parameters(fresh, offload_fits={})
    assert set(no_fit[no_fit.parameter.str.startswith("flash.")].kind) == {"estimate"}


def test_a_fitted_tier_the_stated_spec_lacks_is_refused(fresh_fit: tuple) -> None:
    fit, fits, fresh, _ = fresh_fit
    stated = profile_yaml.read_stated(SHIPPED)
    del stated["tiers"]["flash"]
    with pytest.raises(ValueError, match=r"fitted tiers \['flash'\] are not LMCache tiers"):
        profile_yaml.spec_text(fit, fresh, offload_fits=fits, lmcache_tiers=True,
                               stated_spec=stated)


def test_replicate_fits_refit_every_full_recording_of_the_fit_command(tmp_path: Path) -> None:
    """The fit run's column is the shipped spec's fitted values (the routine on the same
    folder); a recording without all its tiers is left out; another recording's fit is its
    own (the same command a few hours later gives another step overhead)."""
    live = tmp_path / "live"
    live.mkdir()
    for name in (validate.FIT_RUN, validate.DRIFT_ROOT, validate.REPLICATES[-1]):
        (live / name).symlink_to(data_file("live", name))
    table, profiles = profile_yaml.replicate_fits(tmp_path / "fits", live, stated_spec=data_file(
        "servers", "cpu_tiny.yaml"))
    assert list(profiles) == [validate.FIT_RUN, validate.REPLICATES[-1]]  # the probe: 1 tier
    shipped = profile_yaml.fitted_parameters(load_profile(data_file("servers", "cpu_tiny.yaml")))
    shipped = shipped[shipped.kind.isin(profile_yaml.FIT_KINDS)].set_index("parameter").value
    values = table.set_index("parameter")
    assert set(values.index) == set(validate.FITTED_PARAMETERS)
    assert values[validate.FIT_RUN].to_dict() == pytest.approx(shipped.to_dict())
    assert (tmp_path / "fits" / validate.FIT_RUN / "spec.yaml").exists()
    step = values.loc["step_overhead_s"]
    assert step[validate.REPLICATES[-1]] != pytest.approx(step[validate.FIT_RUN], rel=0.05)
