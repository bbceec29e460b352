"""A fleet: N copies of one server tier behind a router, with private or shared KV stores.

Both engines are built from this one description, as a single server is from its tier spec
(`kvrepro.tier_spec`): the live engine starts N vLLM instances, one LMCache server per
instance (`kv_pool: private`) or one for all (`kv_pool: shared`) and the router; the twin
simulates N servers whose offload stores are private, or one store object they all use, with
the shared pool's own bandwidth and a network latency per transfer.

Routing policies (`routing`), named for what they do; the live router's name for each is in
`LIVE_ROUTER_POLICY` (vllm-router's `--policy`):

* `round_robin`: turn i goes to instance i mod N, whatever its session;
* `session_affinity`: every turn of a session goes to one instance (a hash of the session);
* `prefix_aware`: the instance whose cache most likely holds the prompt's prefix, unless
  the load is too uneven (vllm-router's `cache_aware`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvrepro._checks import load_yaml_model
from kvrepro._paths import safe_name
from kvrepro.tier_spec import ServerSpec, TierName, server_named

SESSION_HEADER = "X-Session-ID"
"""The header the live load client sends each turn's session id in: the first key
vllm-router's `consistent_hash` looks at (`engines.live.fleet_deploy`), hence the key the
twin's session-affinity router hashes (`engines.sim.consistent_hash`)."""

Routing = Literal["round_robin", "session_affinity", "prefix_aware"]
ROUTINGS: tuple[str, ...] = ("round_robin", "session_affinity", "prefix_aware")

LIVE_ROUTER_POLICY: dict[str, str] = {"round_robin": "round_robin",
                                      "session_affinity": "consistent_hash",
                                      "prefix_aware": "cache_aware"}
"""vllm-router's `--policy` for each routing policy."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SharedPool(_Strict):
    """The shared KV service as the twin sees it: its own channels and a network hop."""

    read_bw_bytes_s: float | None = Field(
        None, gt=0, description="the pool's read bandwidth shared by all servers (None: the "
                                "tier's stores' own)")
    write_bw_bytes_s: float | None = Field(
        None, gt=0, description="the pool's write bandwidth shared by all servers (None: the "
                                "tier's stores' own)")
    network_latency_s: float = Field(0.0, ge=0, description="added to every transfer "
                                                            "between a server and the pool")
    capacity_scale: float = Field(1.0, gt=0, description="the pool's stores hold this many "
                                                         "times the tier's capacity")


class PrefixAware(_Strict):
    """The `prefix_aware` router's settings: vllm-router's cache_aware flags, with its
    defaults (vllm-router 0.1.17 `--help`), so that live and twin route alike unless told
    otherwise."""

    cache_threshold: float = Field(
        0.3, ge=0, le=1, description="route to the instance with the longest prefix match "
                                     "when matched / prompt length exceeds this "
                                     "(--cache-threshold)")
    balance_abs_threshold: int = Field(
        64, ge=0, description="the load is imbalanced when max - min requests in flight "
                              "exceeds this (--balance-abs-threshold) ...")
    balance_rel_threshold: float = Field(
        1.5, ge=0, description="... and max > min x this (--balance-rel-threshold); then the "
                               "least-loaded instance gets the request")
    max_tree_tokens: int = Field(
        8_388_608, gt=0, description="per-instance budget of the router's prefix tree, tokens "
                                     "(the twin's; vllm-router's --max-tree-size is 33,554,432 "
                                     "characters per worker: at ~4 characters per token, an "
                                     "ESTIMATE)")


class FleetSpec(_Strict):
    """N servers of one tier, a router and where their KV stores live."""

    description: str = ""
    server: str = Field(description="server spec: a path, or a shipped name (cpu_tiny, "
                                    "study_a, study_b)")
    tier: TierName = Field(description="the tier every instance serves (it names the run "
                                       "folder, `run_name`)")
    n_servers: int = Field(2, gt=0, description="vLLM instances")
    routing: Routing = "session_affinity"
    kv_pool: Literal["private", "shared"] = Field(
        "shared", description="private: one set of stores per instance; shared: one set for "
                              "all (one LMCache server live)")
    shared_pool: SharedPool = Field(default_factory=SharedPool,
                                    description="the shared pool's channels, network hop and "
                                                "size (kv_pool: shared)")
    prefix_aware: PrefixAware = Field(default_factory=PrefixAware,
                                      description="the prefix_aware router's settings")
    router_port: int = Field(8500, gt=0, lt=65536, description="the live router's port")
    base_port: int = Field(8510, gt=0, lt=65536,
                           description="instance i's vLLM listens on base_port + i (live)")

    def server_spec(self) -> ServerSpec:
        """The server spec every instance runs (a shipped name or a path)."""
        return server_named(self.server)

    def worker_urls(self) -> list[str]:
        """The instances' URLs as the live router is given them (`base_port + i` on the
        server spec's live host). The twin's session-affinity router hashes them, as
        vllm-router's ring does (`engines.sim.consistent_hash`)."""
        host = self.server_spec().live.host
        return [f"http://{host}:{self.base_port + i}" for i in range(self.n_servers)]


def load_fleet(path: str | Path) -> FleetSpec:
    """Read a fleet spec from YAML; errors name the file and each bad key. The tier must be
    one of the server's (checked here, so a typo fails before anything starts)."""
    fleet = load_yaml_model(path, FleetSpec, "fleet spec")
    try:
        fleet.server_spec().tier(fleet.tier)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err
    return fleet


def shipped_fleet(name: str) -> FleetSpec:
    """A fleet spec shipped in `data/fleets/` (e.g. `cpu_tiny_2x`, `study_a_8x`)."""
    from kvrepro._paths import data_file

    return load_fleet(data_file("fleets", f"{safe_name(name, 'shipped fleet')}.yaml"))
