"""`kvrepro run live|fleet --dry-run`: every command line, environment and config file written
and printed, nothing started; what it writes passes the pinned vLLM's own argument parser and
the pinned LMCache's own config loader and server parser (installed here by `make live-cpu`)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import psutil
import pytest

from kvrepro.cli import main
from kvrepro.engines.live.lmcache_keys import check_lmcache_server_args, load_lmcache_config_file
from kvrepro.engines.live.tiers import API_SERVER_MODULE
from kvrepro.tier_spec import shipped_server
from tests.engines.live.conftest import require_vllm

ROOT = Path(__file__).resolve().parents[3]
GIB = 2**30


@pytest.fixture(scope="module")
def vllm_parser():
    require_vllm()
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def _command(path: Path) -> list[str]:
    return shlex.split(path.read_text())


def _vllm_args(folder: Path, parser):
    command = _command(folder / "command.txt")
    module = command.index("-m") + 1
    assert command[module] == API_SERVER_MODULE
    return parser.parse_args(command[module + 1:])


def _dry_run(argv: list[str], capsys) -> str:
    before = set(psutil.Process().children(recursive=True))
    assert main(argv) == 0
    assert set(psutil.Process().children(recursive=True)) == before  # nothing started
    return capsys.readouterr().out


def test_study_a_three_tiers_pass_vllms_parser_and_lmcaches_loader(tmp_path, capsys,
                                                                   vllm_parser) -> None:
    out = tmp_path / "a"
    printed = _dry_run(["run", "live", "--server", str(ROOT / "data/servers/study_a.yaml"),
                        "--dry-run", "--out", str(out)], capsys)
    assert printed.startswith("== baseline\nvLLM: ") and "dry run: nothing started" in printed
    assert (out / "dry_run.txt").read_text() in printed
    for tier in ("baseline", "dram", "flash"):
        args = _vllm_args(out / tier, vllm_parser)
        assert args.tensor_parallel_size == 4 and args.kv_cache_memory_bytes == 20_000_000_000
        assert args.model == "MiniMaxAI/MiniMax-M2.7" and args.trust_remote_code
        assert args.enable_prefix_caching and args.port == 8000
        env = json.loads((out / tier / "env.json").read_text())
        if tier == "baseline":
            assert args.kv_transfer_config is None and env == {}
            assert not (out / tier / "lmcache.yaml").exists()
            continue
        assert args.kv_transfer_config.kv_connector == "LMCacheConnectorV1"
        assert env == {"LMCACHE_CONFIG_FILE": str((out / tier / "lmcache.yaml").resolve())}
        config = load_lmcache_config_file(env["LMCACHE_CONFIG_FILE"])
        flag = shipped_server("study_a").tiers[tier].lmcache.enable_async_loading
        assert config.chunk_size == 256 and config.enable_async_loading is flag
        if tier == "dram":
            assert config.max_local_cpu_size * GIB == pytest.approx(512e9)
            assert config.local_disk is None
        else:
            assert config.max_local_cpu_size * GIB == pytest.approx(64e9)
            assert config.local_disk == "/mnt/raid10/kvrepro-lmcache/"
            assert config.max_local_disk_size * GIB == pytest.approx(40_000e9)


def test_the_loader_check_refuses_a_key_lmcache_would_drop(tmp_path) -> None:
    require_vllm()
    bad = tmp_path / "lmcache.yaml"
    bad.write_text("chunk_size: 256\nmax_local_cpu_sise: 5.0\n")
    with pytest.raises(ValueError, match="max_local_cpu_sise.*did you mean 'max_local_cpu_size'"):
        load_lmcache_config_file(bad)


def test_cpu_tiny_multi_process_tiers_pass_both_parsers(tmp_path, capsys, vllm_parser) -> None:
    out = tmp_path / "c"
    _dry_run(["run", "live", "--server", str(ROOT / "data/servers/cpu_tiny.yaml"), "--dry-run",
              "--tier", "small-kv", "--tier", "flash", "--out", str(out)], capsys)
    assert _vllm_args(out / "small-kv", vllm_parser).kv_transfer_config is None
    flash = _vllm_args(out / "flash", vllm_parser)
    server = check_lmcache_server_args(_command(out / "flash" / "lmcache_command.txt")[1:])
    assert flash.kv_transfer_config.kv_connector == "LMCacheMPConnector"
    assert flash.kv_transfer_config.kv_connector_extra_config["lmcache.mp.port"] == server.port
    adapter = json.loads(server.l2_adapter[0])
    assert adapter["base_path"] == str((out / "flash" / "lmcache-l2").resolve())
    assert not Path(adapter["base_path"]).exists()  # the flash folder is made at start only
    env = json.loads((out / "flash" / "env.json").read_text())
    assert env == {"VLLM_USE_AOT_COMPILE": "0", "VLLM_CPU_OMP_THREADS_BIND": "0"}  # BUILD_ENV


def test_fleet_dry_run_writes_pool_instances_and_router(tmp_path, capsys, vllm_parser) -> None:
    out = tmp_path / "f"
    printed = _dry_run(["run", "fleet", "--fleet", str(ROOT / "data/fleets/cpu_tiny_2x.yaml"),
                        "--dry-run", "--out", str(out)], capsys)
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    pool = check_lmcache_server_args(_command(run / "pool" / "lmcache_command.txt")[1:])
    ports = []
    for i in (0, 1):
        args = _vllm_args(run / f"i{i}", vllm_parser)
        assert args.kv_transfer_config.kv_connector_extra_config["lmcache.mp.port"] == pool.port
        ports.append(args.port)
    router = _command(run / "router_command.txt")
    assert Path(router[0]).name == "vllm-router"
    urls = router[router.index("--worker-urls") + 1:router.index("--policy")]
    assert urls == [f"http://127.0.0.1:{port}" for port in ports]
    assert f"== {run.name}/router\nvllm-router: " in printed


def test_dry_run_refuses_a_folder_that_holds_files(tmp_path, capsys) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    (out / "records.jsonl").write_text("{}\n")
    assert main(["run", "live", "--server", str(ROOT / "data/servers/cpu_tiny.yaml"),
                 "--dry-run", "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["records.jsonl"]
