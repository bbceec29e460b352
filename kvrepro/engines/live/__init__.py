"""The live engine: real vLLM servers, one per tier, driven by the workload over HTTP.

* `tiers`: a server spec (`kvrepro.tier_spec`, `data/servers/*.yaml`) rendered to vLLM
  command lines and LMCache YAML;
* `server`: deploy one tier as a process, wait for /health, always tear it down; its
  `DeployPlan` is what `kvrepro run live --dry-run` writes and prints;
* `client`: asynchronous streaming load client for `/v1/completions` (token-id prompts);
* `metrics`: periodic `/metrics` scrapes into server samples;
* `runner`: one tier or a campaign of tiers -> run folders (`kvrepro run live`);
* `lmcache_keys`: the configuration keys LMCache defines, to validate generated YAML;
* `pins`: the vllm / lmcache / vllm-router releases the renderer is tested against;
* `doctor`: the preflight of a server (`kvrepro doctor`); `smoke_summary`: the summary of
  `scripts/gpu_smoke.sh`.

vllm, torch and transformers are imported only inside functions that need them.
"""
