#!/usr/bin/env bash
# The GPU path in minutes, on the first GPU server kvrepro meets (after `make live-gpu`):
#
#   1. kvrepro doctor on the smoke server (data/servers/gpu_tiny.yaml: the tiny Llama the
#      package writes locally, no download; one GPU; study A's three tiers, in-process LMCache);
#   2. the dry run of its three tiers (every command line and config, nothing started);
#   3. a short three-tier campaign of study A's shape (agentic sessions; baseline, DRAM, flash);
#   4. kvrepro doctor on the study's server (data/servers/study_a.yaml, or STUDY_SPEC);
#   5. a one-screen summary, and everything in one tarball to send back.
#
# Usage:   scripts/gpu_smoke.sh            (from the repository root; about 10 minutes)
#          scripts/gpu_smoke.sh --dry-run  (steps 1, 2, 4 and 5 only: starts no server)
# Settings (environment): VENV (.venv), SMOKE_SPEC, STUDY_SPEC, TIERS ("baseline dram
# flash"), DURATION_S (300), WARMUP_S (30), OUT (runs/gpu-smoke-<UTC time>).
# Exit status: 0 when every step passed; 1 when a doctor check or a tier failed (the tarball
# is written either way); 2 when the script could not run at all.
set -uo pipefail

VENV=${VENV:-.venv}
KVREPRO="$VENV/bin/kvrepro"
PYTHON="$VENV/bin/python"
SMOKE_SPEC=${SMOKE_SPEC:-data/servers/gpu_tiny.yaml}
STUDY_SPEC=${STUDY_SPEC:-data/servers/study_a.yaml}
TIERS=${TIERS:-baseline dram flash}
DURATION_S=${DURATION_S:-300}
WARMUP_S=${WARMUP_S:-30}
OUT=${OUT:-runs/gpu-smoke-$(date -u +%Y%m%dT%H%M%SZ)-$$}
DRY_RUN=0
case "${1:-}" in
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac

for file in "$KVREPRO" "$PYTHON"; do
  [ -x "$file" ] || { echo "$file not found: run 'make live-gpu' first (VENV=$VENV)" >&2; exit 2; }
done
for spec in "$SMOKE_SPEC" "$STUDY_SPEC"; do
  [ -f "$spec" ] || { echo "$spec not found: run from the repository root" >&2; exit 2; }
done
if [ -e "$OUT" ]; then echo "$OUT exists: set OUT to a new folder" >&2; exit 2; fi
mkdir -p "$OUT" || exit 2

status=0
step() {  # step NAME COMMAND...: run it, keep its output in $OUT/NAME.txt, note its status
  local name=$1; shift
  echo "== $name: $*" | tee -a "$OUT/steps.txt"
  "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  echo "   exit $rc" | tee -a "$OUT/steps.txt"
  [ $rc -eq 0 ] || status=1
  return $rc
}

tier_args=()
for tier in $TIERS; do tier_args+=(--tier "$tier"); done

{ date -u; uname -a; nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  "$PYTHON" -m pip freeze 2>/dev/null | grep -Ei '^(vllm|lmcache|torch|kvrepro)'; } \
  > "$OUT/machine.txt" 2>&1

step doctor-smoke "$KVREPRO" doctor --server "$SMOKE_SPEC" "${tier_args[@]}" \
  --json "$OUT/doctor-smoke.json"
smoke_ok=$?
step dry-run "$KVREPRO" run live --server "$SMOKE_SPEC" "${tier_args[@]}" --dry-run \
  --out "$OUT/dry-run"
if [ $DRY_RUN -eq 1 ]; then
  echo "== campaign: skipped (--dry-run)" | tee -a "$OUT/steps.txt"
elif [ $smoke_ok -ne 0 ]; then
  echo "== campaign: skipped (the smoke server's doctor failed: $OUT/doctor-smoke.txt)" \
    | tee -a "$OUT/steps.txt"
  status=1
else
  # study A's shape, scaled to the tiny model: agentic sessions that come back after pauses
  step campaign "$KVREPRO" run live --server "$SMOKE_SPEC" "${tier_args[@]}" \
    --workload agentic -w seed=3 -w duration_s="$DURATION_S" -w warmup_s="$WARMUP_S" \
    -w session_rate_per_min=20 -w context_cap_tokens=7680 -w 'tool_tokens=[100, 300]' \
    -w 'file_tokens=[600, 1500]' -w 'short_output_tokens=[10, 40]' \
    -w 'code_tokens=[60, 150]' -w p_returning=0.3 \
    --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --out "$OUT/campaign"
fi
step doctor-study "$KVREPRO" doctor --server "$STUDY_SPEC" --json "$OUT/doctor-study.json"

"$PYTHON" -m kvrepro.engines.live.smoke_summary "$OUT" | tee "$OUT/summary.txt"
tar -czf "$OUT.tar.gz" --exclude='lmcache-l2' -C "$(dirname "$OUT")" "$(basename "$OUT")"
echo
echo "Send back $OUT.tar.gz (it holds no model weights and no KV files): attach it to an"
echo "issue of this repository, or mail it to whoever asked for the smoke run."
exit $status
