"""The live engine: real vLLM servers, one per tier, driven by the workload over HTTP.

* `tiers`: a server spec (`kvrepro.tier_spec`, `data/servers/*.yaml`) rendered to vLLM
  command lines and LMCache settings, through each store kind's own renderings
  (`kvrepro.stores`);
* `server`: deploy one tier as processes (vLLM, its `lmcache server`), wait for /health,
  always tear it down; its `DeployPlan` is what `kvrepro run live --dry-run` writes and prints;
* `processes`: a managed process group, its health, its end (`ManagedProcess`), free ports;
* `ownership`: what a run can prove it created (shared-memory segments, the chunk files in
  its store folders) and the clean-up of exactly that; `shm_ledger/` is the `sitecustomize`
  that lets the servers' Python record the segments it creates;
* `placement`: the CPUs of each process (render, pin, record);
* `client`: asynchronous streaming load client for `/v1/completions` (token-id prompts);
* `metrics`: periodic `/metrics` scrapes into server samples;
* `runner`: one tier or a campaign of tiers -> run folders (`kvrepro run live`);
* `fleet_deploy`: N instances of one tier behind vllm-router, with private or shared KV
  pools and shared stores (`kvrepro run fleet`);
* `probe`: a direct probe of a deployed tier (is an evicted prompt served from LMCache);
* `front_end`: the API server's per-prompt work, measured;
* `lmcache_keys`: the configuration keys LMCache defines, to validate generated YAML;
* `pins`: the vllm / lmcache / vllm-router releases the renderer is tested against (the one
  Python source of those versions);
* `doctor`: the preflight of a server (`kvrepro doctor`); `smoke_summary`: the summary of
  `scripts/gpu_smoke.sh`.

vllm, torch and transformers are imported only inside functions that need them.
"""
