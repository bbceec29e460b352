"""External GPU cases: the twin predicts published GPU measurements of KV offload.

Modules:

* `constants`: the twin's one set of GPU-server constants, each measured, from a datasheet, or
  fitted on a declared fit case, then frozen (data/external/constants.yaml);
* `case`: a case file (data/external/<case>.yaml): its source, setup as stated, workload,
  published numbers and the assumptions where the source is silent;
* `server_spec`: the server spec (kvrepro.tier_spec) a case's setup and the constants make;
* `experiments`: one runner per workload kind (probe, single-request sweep, hot TTFT,
  shared-prefix fleet, study B), registered by kind;
* `predict`: every case's predicted vs published table (`external.csv`) and tier effects.
"""
