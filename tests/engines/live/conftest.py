"""Live-engine tests need the CPU build of vLLM (`make live-cpu`; `make test` installs it).

Without vllm they are skipped on a developer's machine, but fail in CI (CI=true), where the
live path must be proven for real.
"""

import importlib.util
import os
from pathlib import Path

import pytest
import yaml

from kvrepro.tier_spec import ServerSpec, override_server, shipped_server

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    """Skip (locally) or fail (in CI) when vllm is not installed."""
    if HAVE_VLLM:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("vllm is not installed in CI: `make test` should have run `make live-cpu`")
    pytest.skip("vllm not installed (run `make live-cpu`)")


EAGER_ARGS = ["--enforce-eager"]
"""vLLM flags of the tests that check processes, ports, shared memory and files, not speed:
no torch.compile warm-up, 5-10 s less per start here (the large-kv tier healthy after
32.2 / 25.6 s compiled, 22.6 / 20.6 s eager, alternating, 2026-12-06). The tests that measure
(the campaign of test_live_e2e.py, the DRAM tier's hits against recompute) serve the spec as
it is."""


def eager(spec: ServerSpec) -> ServerSpec:
    """`spec` with `EAGER_ARGS` added to its vLLM flags."""
    return override_server(spec, {"live.extra_args": [*spec.live.extra_args, *EAGER_ARGS]})


SHARED_TIER = "shared"


def shared_fs_server(share: Path | str, l1_bytes: float = 32 * 2**20) -> ServerSpec:
    """The shipped tiny server (data/servers/cpu_tiny.yaml) with one more tier, `shared`: a
    small LMCache L1 (dram) and a `shared_fs` store in the folder `share`, added here rather
    than in shipped YAML. The share's twin bandwidths are cpu_tiny's flash store's: on this
    machine the share is a local folder. Its eviction is `none`, as LMCache's fs adapter's;
    files already in the share (a note the test leaves there) are allowed and kept."""
    spec = shipped_server("cpu_tiny")
    tree = spec.model_dump(mode="json")
    flash = next(s for s in spec.tier("flash").stores if s.folder() is not None)
    l1 = {**tree["tiers"]["dram"]["stores"][0], "capacity_bytes": l1_bytes}
    share_store = {"name": "share", "kind": "shared_fs", "path": str(share),
                   "capacity_bytes": 2**30, "eviction": "none",
                   "read_bw_bytes_s": flash.read_bw_bytes_s,
                   "write_bw_bytes_s": flash.write_bw_bytes_s, "allow_existing_files": True}
    tree["tiers"][SHARED_TIER] = {**tree["tiers"]["dram"], "name": SHARED_TIER,
                                  "stores": [l1, share_store]}
    return ServerSpec.model_validate(tree)


def write_server(spec: ServerSpec, path: Path) -> Path:
    """`spec` as a server spec file (what a fleet spec's `server` names)."""
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    return path


def free_port_pair() -> int:
    """A port p with p and p + 1 free (a two-instance fleet's ports)."""
    from kvrepro.engines.live.processes import free_port, port_in_use

    for _ in range(50):
        port = free_port()
        if not port_in_use("127.0.0.1", port + 1):
            return port
    raise RuntimeError("no two consecutive free ports")
