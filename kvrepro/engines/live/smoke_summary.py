"""The one-screen summary of `scripts/gpu_smoke.sh`: `python -m kvrepro.engines.live.smoke_summary
OUT` reads the smoke folder (the doctors' JSON, the dry run, the campaign's tier folders) and
prints what a person checks first: which doctor lines failed and why, and per tier the requests
served, the share of prompt tokens served from cache and the median TTFT."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from kvrepro import analysis
from kvrepro.records import read_runs


def doctor_lines(path: Path) -> list[str]:
    """`name: N passed, M failed` and one line per failed check."""
    if not path.is_file():
        return [f"{path.name}: not written (the doctor did not run)"]
    checks = json.loads(path.read_text())
    failed = [c for c in checks if not c["ok"]]
    lines = [f"{path.stem}: {len(checks) - len(failed)} passed, {len(failed)} failed"]
    lines += [f"  FAIL {' '.join(filter(None, (c['check'], c['subject'])))}: {c['why']}"
              for c in failed]
    return lines


def campaign_table(campaign: Path) -> pd.DataFrame:
    """Per tier: requests ok / failed, cached share of prompt tokens, median TTFT."""
    folders = sorted((p for p in campaign.iterdir() if (p / "meta.json").is_file()),
                     key=lambda p: json.loads((p / "meta.json").read_text()).get(
                         "started_utc", ""))  # in the order the tiers ran
    records, _ = read_runs(folders)
    split = analysis.prompt_split(records).set_index("tier")
    rows = []
    for tier, part in records.groupby("tier", sort=False):
        ok = part[part.error == ""]
        rows.append({"tier": tier, "requests_ok": len(ok), "failed": len(part) - len(ok),
                     "cached_share": round(float(split.at[tier, "hit_share"]), 3),
                     "median_ttft_s": round(float(ok.ttft_s.median()), 4)})
    return pd.DataFrame(rows)


def summary(out: Path) -> str:
    lines = [f"GPU smoke run {out}"]
    for name in ("doctor-smoke", "doctor-study"):
        lines += doctor_lines(out / f"{name}.json")
    dry = out / "dry-run" / "dry_run.txt"
    lines.append(f"dry run: {dry}" if dry.is_file() else "dry run: not written")
    campaign = out / "campaign"
    if campaign.is_dir() and any(campaign.iterdir()):
        lines += ["campaign:", campaign_table(campaign).to_string(index=False)]
    else:
        lines.append("campaign: not run")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m kvrepro.engines.live.smoke_summary OUT_FOLDER")
    print(summary(Path(sys.argv[1])))
