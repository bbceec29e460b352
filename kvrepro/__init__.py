"""kvrepro: reproduce two studies of KV-cache offloading to DRAM and flash in LLM serving.

Modules: `models` (KV bytes per token), `sizing` (capacity, headroom), `endurance` (DWPD,
C_bound), `roofline` (prefill/decode timing), `reference` (the studies' numbers),
`analytic` (the analytic figures' inputs and numbers), `plots` (one function per figure),
`reproduce` / `cli` (run every notebook). Heavy serving dependencies are imported only
by the modules that drive a live engine.
"""

__version__ = "0.1.0"
