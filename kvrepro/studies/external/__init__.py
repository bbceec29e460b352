"""External GPU cases: the twin predicts published GPU measurements of KV offload.

Modules:

* `constants`: the twin's one set of GPU-server constants, each measured, from a datasheet, or
  fitted on a declared fit case, then frozen (data/external/constants.yaml);
* `case`: a case file (data/external/<case>.yaml): its source, setup as stated, workload,
  published numbers and the assumptions where the source is silent;
* `server_spec`: the server spec (kvrepro.tier_spec) a case's setup and the constants make;
* `experiments`: one runner per workload kind (probe, single-request sweep,
  shared-prefix fleet, study B), registered by kind;
* `fs_path`: LMCache's filesystem L2 path (a read, then a staging copy) and the fit of its
  two constants through the twin;
* `predict`: every case's predicted vs published table (`external.csv`), tier effects, and
  `refit` (every fitted constant from its fit case).
"""
