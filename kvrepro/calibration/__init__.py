"""Calibration: the twin fitted to, and checked against, live runs of the same server.

Read top to bottom; each module imports only the ones above it, at the top of the module
(no import inside a function), so the imports run one way and never round a loop:

* `fit`: the step-time model (decode and prefill lines) fitted to a live campaign's lone
  requests (imports no other calibration module);
* `validate`: the twin run on a live run's own workload, and the table of twin vs live
  (imports `fit`: `isolated`, the lone requests);
* `fit_offload`: each offload tier's costs (lookup, connector, read rate) fitted by twin runs
  (imports `fit` and `validate`: `simulate_run`);
* `profile_yaml`: a fitted server spec built as data, validated by
  `kvrepro.tier_spec.ServerSpec` and only then written as commented YAML, the LMCache tiers'
  stated values (sizes, write rates, flags) read from the spec it regenerates, only the
  fitted ones rewritten (imports `fit`, `validate`: `FITTED_PARAMETERS`, and `fit_offload`);
* `calibrate`: a study's twin (study A's, study B's) fitted to the targets its plan
  (`data/studies/<study>.yaml`) declares `fitted`, by a staged search on the Ray sweep, the
  values written back into the spec with their residuals (`kvrepro calibrate`; imports no
  other calibration module, and no study: the plan names its point function);
* `__main__`: `python -m kvrepro.calibration CAMPAIGN_DIR OUT_YAML [STATED_YAML]` (imports
  `profile_yaml`).
"""
