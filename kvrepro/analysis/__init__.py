"""Analysis: from what an engine or a trace produced to the studies' curves and numbers.

* `runs`: request records of any engine (live or simulated) -> throughput and TTFT over
  time, resume statistics, peak / plateau / late window / fill time. Its public functions
  are re-exported here (`analysis.throughput_over_time`, ...); study A's reading of them
  (its settings and A2-A5 headlines) is a study's, kept with the studies;
* `block_traces`: block-hash traces -> KV working set under a TTL (B2), write volume, reuse;
* `token_mix`: Claude Code telemetry -> the token mix of agentic coding (A1).
"""

from kvrepro.analysis.runs import (
    RATE_COLUMNS,
    RESUME_COLUMNS,
    SPLIT_COLUMNS,
    TTFT_COLUMNS,
    common_resume_sessions,
    crossover_time_s,
    early_spread,
    fill_time_s,
    gain_over_baseline_at_peak,
    hit_miss_ttft,
    late_bins,
    late_window,
    peak,
    plateau,
    process_cpu,
    prompt_split,
    prompt_tokens_by_source,
    resume_stats,
    retained_share,
    smooth_rates,
    throughput_over_time,
    ttft_over_time,
    window_bins,
)

__all__ = ["RATE_COLUMNS", "RESUME_COLUMNS", "SPLIT_COLUMNS", "TTFT_COLUMNS",
           "common_resume_sessions", "crossover_time_s", "early_spread", "fill_time_s",
           "gain_over_baseline_at_peak", "hit_miss_ttft", "late_bins", "late_window", "peak",
           "plateau", "process_cpu", "prompt_split", "prompt_tokens_by_source", "resume_stats",
           "retained_share", "smooth_rates", "throughput_over_time", "ttft_over_time",
           "window_bins"]
