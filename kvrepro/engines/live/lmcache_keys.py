"""The LMCache configuration keys that exist, so the live engine writes no key LMCache ignores.

Why: LMCache reads its YAML config (`LMCACHE_CONFIG_FILE`) leniently. In 0.5.0 and 0.5.6 an unknown
key is only *logged* ("Unknown configuration key: ...") and dropped, so a misspelled
`max_local_cpu_sise: 512` would serve the DRAM tier with the default 5 GB and nothing would
fail. The live engine therefore checks every config it writes with `validate_lmcache_config`
against the keys LMCache itself defines, pinned here from the release the live stack pins
(`kvrepro.engines.live.pins`: `make live-gpu` and `make live-cpu` install it; study A ran
0.5.0, whose 103 keys 0.5.6 all keeps, adding 5 and changing one default). On a machine with
lmcache installed, `installed_lmcache_keys` reads its own definitions, so the two can be
compared (`tests/engines/live/test_pins.py`). Multi-process commands are checked with
LMCache's own argument parser (`check_lmcache_server_args`).

How `LMCACHE_KEYS` was extracted (redo it this way for another release):

    repository  LMCache/LMCache (https://github.com/LMCache/LMCache), release 0.5.6, the
                pinned one; its wheel names its commit as 3e11e108
                (`lmcache/_version.py`: __commit_id__ = 'g3e11e108')
    obtained    from PyPI, as `make live-cpu` installs it (pip install lmcache==0.5.6)
    file        lmcache/v1/config.py (md5 aab59135e9c6203234e057b49cdaba6e in that wheel)
    object      the module-level dict `_CONFIG_DEFINITIONS` ("Single configuration definition
                center"): its keys are the config keys, each value's "type" and "default"
                entries are copied below as source text. Also `_CONFIG_ALIASES` and
                `_DEPRECATED_CONFIGS` (old names) for error messages.
    method      without importing lmcache (it may need torch/CUDA), with the standard
                library's ast: `python scripts/extract_lmcache_keys.py <that config.py>`
                prints both dicts below, 108 keys in the order of the source.

Study A's release, 0.5.0 (commit 389b9cfc, from PyPI's
lmcache-0.5.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl, md5 of its config.py
887db39a425c465c8a1893356505619c), read the same way, gives 103 keys: 0.5.6 adds
run_script_api_enabled, enable_hidden_state_cache, max_hidden_state_cpu_size,
hidden_state_layers and hidden_states_retrieve_mode, and moves internal_api_server_host's
default from "0.0.0.0" to "127.0.0.1".

Older v1 sources (e.g. lmcache/v1/config.py at commit 3ecd72f84ee028571d17a9694d910b5339d33874
of LMCache/LMCache) use the same dict with fewer, partly different keys (nixl_* where
0.5.0 has pd_*); the five keys the DRAM and flash tiers use (chunk_size, local_cpu,
max_local_cpu_size, local_disk, max_local_disk_size) have the same types there. The oldest
releases define a dataclass `LMCacheEngineConfig` instead. Nested `ec:` / `ec_`-prefixed keys
(encoder-cache overrides, read separately by LMCache) are not covered.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kvrepro.engines.live.pins import LMCACHE_VERSION

# LMCACHE_VERSION (imported above) is the pinned release, the one these keys were read from;
# kvrepro.engines.live.pins is its one Python source
LMCACHE_COMMIT = "3e11e108"  # abbreviated, as the release wheel records it
LMCACHE_REPOSITORY = "LMCache/LMCache"
LMCACHE_SOURCE_PATH = "lmcache/v1/config.py"
LMCACHE_SOURCE_OBJECT = "_CONFIG_DEFINITIONS"

# key -> (type, default), both as written in LMCache 0.5.6's _CONFIG_DEFINITIONS.
LMCACHE_KEYS: dict[str, tuple[str, str]] = {
    "chunk_size": ("int", '256'),
    "local_cpu": ("bool", 'True'),
    "max_local_cpu_size": ("float", '5.0'),
    "local_cpu_use_hugepages": ("bool", 'False'),
    "reserve_local_cpu_size": ("float", '0.0'),
    "local_disk": ("Optional[str]", 'None'),
    "local_disk_path_sharding": ("str", '"by_gpu"'),
    "max_local_disk_size": ("float", '0.0'),
    "remote_url": ("Optional[str]", 'None'),
    "remote_serde": ("Optional[str]", '"naive"'),
    "use_layerwise": ("bool", 'False'),
    "save_decode_cache": ("bool", 'False'),
    "pre_caching_hash_algorithm": ("str", '"builtin"'),
    "enable_blending": ("bool", 'False'),
    "blend_recompute_ratios": ("Optional[list[float]]", 'None'),
    "blend_thresholds": ("Optional[list[float]]", 'None'),
    "blend_check_layers": ("list[int]", 'None'),
    "blend_min_tokens": ("int", '256'),
    "blend_special_str": ("str", '" # # "'),
    "retrieve_locations": ("Optional[list[str]]", 'None'),
    "store_location": ("Optional[str]", 'None'),
    "enable_p2p": ("bool", 'False'),
    "p2p_host": ("Optional[str]", 'None'),
    "p2p_init_ports": ("Optional[list[int]]", 'None'),
    "p2p_lookup_ports": ("Optional[list[int]]", 'None'),
    "mp_host": ("Optional[str]", 'None'),
    "mp_port": ("int", '5555'),
    "enable_controller": ("bool", 'False'),
    "lmcache_instance_id": ("Optional[str]", 'None'),
    "controller_pull_url": ("Optional[str]", 'None'),
    "controller_reply_url": ("Optional[str]", 'None'),
    "lmcache_worker_ports": ("Optional[list[int]]", 'None'),
    "lmcache_worker_ids": ("Optional[list[int]]", 'None'),
    "lmcache_worker_heartbeat_delay_time": ("int", '10'),
    "lmcache_worker_heartbeat_time": ("Optional[int]", 'None'),
    "enable_pd": ("bool", 'False'),
    "pd_role": ("Optional[str]", 'None'),
    "pd_buffer_size": ("Optional[int]", 'None'),
    "pd_buffer_device": ("Optional[str]", 'None'),
    "pd_peer_host": ("Optional[str]", 'None'),
    "pd_peer_init_port": ("Optional[list[int]]", 'None'),
    "pd_peer_alloc_port": ("Optional[list[int]]", 'None'),
    "pd_peer_query_port": ("Optional[list[int]]", 'None'),
    "pd_proxy_host": ("Optional[str]", 'None'),
    "pd_proxy_port": ("Optional[int]", 'None'),
    "pd_allocation_timeout_sec": ("float", 'float("inf")'),
    "pd_shutdown_timeout_sec": ("float", '5.0'),
    "pd_condition_poll_interval_sec": ("float", '0.005'),
    "pd_max_prefill_len": ("int", '0'),
    "pd_backend_mode": ("Optional[str]", '"async"'),
    "pd_skip_proxy_notification": ("bool", 'False'),
    "pd_bidirectional": ("bool", 'False'),
    "transfer_channel": ("Optional[str]", 'None'),
    "nixl_backends": ("Optional[list[str]]", 'None'),
    "nixl_buffer_size": ("Optional[int]", 'None'),
    "nixl_buffer_device": ("Optional[str]", 'None'),
    "gds_path": ("Optional[str]", 'None'),
    "gds_path_sharding": ("str", '"by_gpu"'),
    "gds_buffer_size": ("Optional[int]", 'None'),
    "maru_path": ("Optional[str]", 'None'),
    "maru_pool_size": ("float", '4.0'),
    "use_gds": ("bool", 'True'),
    "gds_backend": ("str", '"cufile"'),
    "audit_actual_remote_url": ("Optional[str]", 'None'),
    "internal_api_server_host": ("str", '"127.0.0.1"'),
    "extra_config": ("Optional[dict]", 'None'),
    "save_unfull_chunk": ("bool", 'False'),
    "blocking_timeout_secs": ("int", '10'),
    "external_lookup_client": ("Optional[str]", 'None'),
    "py_enable_gc": ("bool", 'True'),
    "cache_policy": ("str", '"LRU"'),
    "numa_mode": ("Optional[str]", 'None'),
    "enable_async_loading": ("bool", 'False'),
    "internal_api_server_enabled": ("bool", 'False'),
    "internal_api_server_port_start": ("int", '6999'),
    "priority_limit": ("Optional[int]", 'None'),
    "internal_api_server_include_index_list": ("Optional[list[int]]", 'None'),
    "internal_api_server_socket_path_prefix": ("Optional[str]", 'None'),
    "runtime_plugin_locations": ("Optional[list[str]]", 'None'),
    "storage_plugins": ("Optional[list[str]]", 'None'),
    "remote_storage_plugins": ("Optional[list[str]]", 'None'),
    "lookup_timeout_ms": ("int", '3000'),
    "min_retrieve_tokens": ("int", '0'),
    "hit_miss_ratio": ("Optional[float]", 'None'),
    "lookup_server_worker_ids": ("Optional[list[int]]", 'None'),
    "enable_scheduler_bypass_lookup": ("bool", 'False'),
    "script_allowed_imports": ("Optional[list[str]]", 'None'),
    "run_script_api_enabled": ("bool", 'False'),
    "enable_lazy_memory_allocator": ("bool", 'False'),
    "lazy_memory_initial_ratio": ("float", '0.2'),
    "lazy_memory_expand_trigger_ratio": ("float", '0.5'),
    "lazy_memory_step_ratio": ("float", '0.1'),
    "lazy_memory_safe_size": ("float", '0.0'),
    "enable_chunk_statistics": ("bool", 'False'),
    "chunk_statistics_auto_start_statistics": ("bool", 'False'),
    "chunk_statistics_auto_exit_timeout_hours": ("float", '0.0'),
    "chunk_statistics_auto_exit_target_unique_chunks": ("int", '0'),
    "chunk_statistics_strategy": ("str", '"memory_bloom_filter"'),
    "enable_kv_events": ("bool", 'False'),
    "use_gpu_connector_v3": ("bool", 'False'),
    "pin_timeout_sec": ("int", '300'),
    "pin_check_interval_sec": ("int", '30'),
    "remote_config_url": ("Optional[str]", 'None'),
    "app_id": ("Optional[str]", 'None'),
    "enable_hidden_state_cache": ("bool", 'False'),
    "max_hidden_state_cpu_size": ("float", '2.0'),
    "hidden_state_layers": ("Optional[list[int]]", 'None'),
    "hidden_states_retrieve_mode": ("str", '"prefix_strict"'),
}
# Old names LMCache 0.5.6 still mentions (_CONFIG_ALIASES, _DEPRECATED_CONFIGS): old -> new,
# None when the key is gone.
LMCACHE_OLD_NAMES: dict[str, str | None] = {
    "enable_xpyd": "enable_pd",
    "nixl_peer_host": "pd_peer_host",
    "nixl_peer_init_port": "pd_peer_init_port",
    "nixl_peer_alloc_port": "pd_peer_alloc_port",
    "nixl_proxy_host": "pd_proxy_host",
    "nixl_proxy_port": "pd_proxy_port",
    "nixl_buffer_size": "pd_buffer_size",
    "nixl_role": "pd_role",
    "controller_url": "controller_pull_url",
    "lmcache_worker_port": "lmcache_worker_ports",
    "plugin_locations": "runtime_plugin_locations",
    "external_backends": "storage_plugins",
    "nixl_peer_port": None,
}

_SCALARS: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "dict": (dict,),
}


def _matches(value: Any, type_text: str) -> bool:
    """Whether `value` has the type LMCache declares, e.g. "Optional[list[int]]".

    Stricter than LMCache's converters (which also take "1,2" for a list or "true" for a
    bool, as environment variables need): the configs checked here are written by this
    package, so they should carry native values. A bool is not accepted as an int.
    """
    if type_text.startswith("Optional[") and type_text.endswith("]"):
        return value is None or _matches(value, type_text[len("Optional["):-1])
    if type_text.startswith("list[") and type_text.endswith("]"):
        inner = type_text[len("list["):-1]
        return isinstance(value, list) and all(_matches(v, inner) for v in value)
    allowed = _SCALARS.get(type_text)
    if allowed is None:
        return True  # a type this checker does not know: do not guess
    if isinstance(value, bool) and bool not in allowed:
        return False
    return isinstance(value, allowed)


def _unknown_key_message(key: str, known: Iterable[str]) -> str:
    if key in LMCACHE_OLD_NAMES:
        new = LMCACHE_OLD_NAMES[key]
        return f"{key!r} (an old name; " + (f"now {new!r})" if new else "no longer defined)")
    close = difflib.get_close_matches(key, list(known), n=1)
    return f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


def validate_lmcache_config(cfg: dict[str, Any], known_keys: Iterable[str] | None = None) -> None:
    """Raise ValueError naming every key LMCache does not define and every value of the
    wrong type (for keys whose type is pinned in `LMCACHE_KEYS`).

    `known_keys` replaces the pinned key list, e.g. with `installed_lmcache_keys()` on a
    machine where lmcache is installed; types are still checked from `LMCACHE_KEYS`.
    A key whose default is None may be None.
    """
    known = set(LMCACHE_KEYS if known_keys is None else known_keys)
    problems = [f"unknown key {_unknown_key_message(str(k), known)}"
                for k in cfg if k not in known]
    for key, value in cfg.items():
        if key in known and key in LMCACHE_KEYS:
            type_text, default_text = LMCACHE_KEYS[key]
            if value is None and default_text == "None":
                continue
            if not _matches(value, type_text):
                problems.append(f"{key!r} must be {type_text}, got {value!r} "
                                f"({type(value).__name__})")
    if problems:
        source = (f"LMCache {LMCACHE_VERSION} ({LMCACHE_SOURCE_PATH})" if known_keys is None
                  else "the given key list (e.g. the installed lmcache)")
        raise ValueError(f"LMCache config not valid for {source}: " + "; ".join(problems))


def installed_lmcache_keys() -> set[str] | None:
    """The config keys of the installed lmcache, read from its own definitions; None when
    lmcache is not installed.

    Recent releases keep them in `lmcache.v1.config._CONFIG_DEFINITIONS`; the oldest v1
    releases only have the dataclass `LMCacheEngineConfig`, whose fields are the keys.
    Imported lazily: importing lmcache may pull in torch and CUDA.
    """
    if importlib.util.find_spec("lmcache") is None:
        return None
    config = importlib.import_module("lmcache.v1.config")
    definitions = getattr(config, LMCACHE_SOURCE_OBJECT, None)
    if isinstance(definitions, dict):
        return set(definitions)
    config_class = getattr(config, "LMCacheEngineConfig", None)
    if config_class is not None and dataclasses.is_dataclass(config_class):
        return {field.name for field in dataclasses.fields(config_class)}
    raise RuntimeError(f"lmcache is installed but {config.__name__} has neither "
                       f"{LMCACHE_SOURCE_OBJECT} nor a dataclass LMCacheEngineConfig")


def check_lmcache_server_args(args: list[str]) -> Any:
    """Parse `lmcache server ...` arguments with LMCache's own parser (and its L2 adapter
    parser), so a generated multi-process command fails here rather than at deploy time.

    Needs the lmcache package (installed by `make live-cpu`); returns the parsed namespace.
    """
    import argparse

    from lmcache.cli.commands.server import ServerCommand
    from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config

    if not args or args[0] != "server":
        raise ValueError(f"not an `lmcache server` command: {args[:2]}")
    parser = argparse.ArgumentParser(prog="lmcache server", exit_on_error=False)
    ServerCommand().add_arguments(parser)
    namespace = parser.parse_args(args[1:])
    parse_args_to_l2_adapters_config(namespace)
    return namespace


def load_lmcache_config_file(path: str | Path) -> Any:
    """Load an LMCache YAML with the installed LMCache's own loader
    (`LMCacheEngineConfig.from_file`, what `LMCACHE_CONFIG_FILE` goes through), after checking
    its keys against the installed release's definitions (the loader only logs unknown keys).
    Needs the lmcache package (`make live-cpu`, `make live-gpu`); returns LMCache's config."""
    import yaml
    from lmcache.v1.config import LMCacheEngineConfig

    validate_lmcache_config(yaml.safe_load(Path(path).read_text()), installed_lmcache_keys())
    return LMCacheEngineConfig.from_file(str(path))
