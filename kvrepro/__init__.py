"""kvrepro: reproduce two studies of KV-cache offloading to DRAM and flash in LLM serving.

The package is the pipeline, one subpackage per stage:

* `tier_spec`: the server spec (one YAML per server in `data/servers/`) that both engines and
  the cost model render;
* `workload`: every generator and trace reader of the load the engines serve;
* `engines`: `live` (real vLLM + LMCache) and `sim` (the digital twin), one `run()` interface;
* `records`: the per-request record and run folders both engines write;
* `analysis`: engine runs, block traces and telemetry -> curves and headline numbers;
* `calc`: calculators (models, sizing, endurance, roofline, economics, notebook 01's report);
* `storage`: fio measurements of a drive, turned into a flash profile for the twin;
* `plots`: one function per figure;
* tooling: `reference` (the studies' numbers), `reproduce` / `cli` (run every notebook).

Heavy serving dependencies are imported only by the modules that drive a live engine.
"""

__version__ = "0.1.0"
