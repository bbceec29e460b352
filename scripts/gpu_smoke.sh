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
#          --with-host-details             (either way: also uname -a, the full nvidia-smi
#                                           with its process table, and the paths as they are)
# Settings (environment): VENV (.venv), SMOKE_SPEC, STUDY_SPEC, TIERS ("baseline dram
# flash"), DURATION_S (300), WARMUP_S (30), OUT (runs/gpu-smoke-<UTC time>; trailing slashes
# dropped). OUT and OUT.tar.gz must not exist: neither is ever overwritten.
# The tarball is meant for a public issue: by default it holds no host name (replaced by
# <host> in every file, each run's meta.json included), no nvidia-smi process table (only each
# GPU's name, memory and driver), and no home, repository or venv path (~, <repo>, <venv>);
# live.env values are never written anywhere (kvrepro.engines.live.tiers.REDACTED). What the
# runs record in OUT itself is left whole.
# Exit status: 0 when every step passed; 1 when a doctor check or a tier failed (the tarball
# is written either way); 2 when the script could not run at all or the tarball could not be
# written.
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
HOST_DETAILS=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --with-host-details) HOST_DETAILS=1 ;;
    *) echo "usage: $0 [--dry-run] [--with-host-details]" >&2; exit 2 ;;
  esac
done
while [ "$OUT" != / ] && [ "${OUT%/}" != "$OUT" ]; do OUT=${OUT%/}; done  # dir/ names dir.tar.gz
case "$OUT" in
  ""|/|.|..|*/.|*/..) echo "OUT=$OUT: name a new folder" >&2; exit 2 ;;
esac
TARBALL="$OUT.tar.gz"

for file in "$KVREPRO" "$PYTHON"; do
  [ -x "$file" ] || { echo "$file not found: run 'make live-gpu' first (VENV=$VENV)" >&2; exit 2; }
done
for spec in "$SMOKE_SPEC" "$STUDY_SPEC"; do
  [ -f "$spec" ] || { echo "$spec not found: run from the repository root" >&2; exit 2; }
done
for path in "$TARBALL" "$OUT"; do
  if [ -e "$path" ] || [ -L "$path" ]; then
    echo "$path exists: set OUT to a new name (it is never overwritten)" >&2; exit 2
  fi
done
# the folder itself without -p: if another process made it since the check, this one loses
if ! made=$(mkdir -p -- "$(dirname -- "$OUT")" 2>&1 && mkdir -- "$OUT" 2>&1); then
  echo "$OUT: not made as a new folder (${made##*: }): set OUT to a new name" >&2; exit 2
fi

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

{ date -u
  # by default the kernel and machine, not the host name; each GPU, not the process table
  if [ $HOST_DETAILS -eq 1 ]; then uname -a; else uname -srvmo; fi
  if ! command -v nvidia-smi > /dev/null; then echo "nvidia-smi: not available"
  elif [ $HOST_DETAILS -eq 1 ]; then nvidia-smi
  else nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
  fi
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
pack=(--pack "$TARBALL")
[ $HOST_DETAILS -eq 1 ] && pack+=(--with-host-details)
"$PYTHON" -m kvrepro.engines.live.smoke_summary "${pack[@]}" "$OUT" || exit 2
echo
if [ $HOST_DETAILS -eq 1 ]; then
  echo "Send back $TARBALL (no model weights, no KV files; WITH this machine's host name,"
  echo "process table and paths): mail it to whoever asked for the smoke run."
else
  echo "Send back $TARBALL (no model weights, no KV files, no host name, process table or"
  echo "home and venv paths): attach it to an issue of this repository, or mail it to whoever"
  echo "asked for the smoke run."
fi
exit $status
