"""Record the fresh-process step15.py runs of an interleave15.py call as other runs of the issue-15 cases
(result.json other_runs; results_table15.py lists them beside each case). A run of the same call is replaced.

    python validation/harness/fp8_compile/record_runs15.py CALL FILE SOURCE

CALL: the label (e.g. s6); FILE: interleave15.py's JSON; SOURCE: how the runs were taken, stored with each.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "measured_libraries"
KEEP = ("step_time_s", "step_times_s", "peak_allocated_bytes", "first_step_s", "ok", "error")


def record(call: str, data: dict, source: str, root: Path = ROOT) -> list[str]:
    done = []
    for run in data.get("fresh", {}).get("cases", []):
        folder = root / str(run.get("name"))
        if not run.get("ok") or not (folder / "result.json").exists():
            continue
        result = json.loads((folder / "result.json").read_text())
        others = [o for o in result.get("other_runs", []) if o.get("call") != call]
        result["other_runs"] = others + [{"call": call, **{k: run.get(k) for k in KEEP}, "source": source}]
        (folder / "result.json").write_text(json.dumps(result, indent=1, default=str))
        done.append(folder.name)
    return done


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    call, path, source = sys.argv[1:]
    for name in record(call, json.loads(Path(path).read_text()), source):
        print("recorded", call, name)


if __name__ == "__main__":
    main()
