"""Regenerate the outputs README.md and examples/README.md quote, or check them.

Each quote sits between `<!-- begin NAME (examples/regenerate_readme.py) -->` and
`<!-- end NAME -->` and is the output of one command, excerpted by a fixed rule. Timings are
what the run measured; a check masks them (they vary by machine), every other number must match.

    python examples/regenerate_readme.py            # rerun every command, rewrite the quotes
    python examples/regenerate_readme.py --check    # rerun the cheap ones, exit 1 if a quote is stale
    python examples/regenerate_readme.py --check --all

tests/test_readme_quotes.py runs the check of the cheap quotes; the expensive ones (a search
over 15,504 plans, every validation case, two plan searches) are regenerated here, not in CI.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
GHSIM = [sys.executable, "-m", "ghsim.cli"]
FIRST_COMMAND = ["simulate", "--model", "llama-2-7b", "--hardware", "gh200-96gb", "--framework", "deepspeed", "--precision", "bf16",
                 "--recompute", "full", "--micro-batch", "1", "--seq", "4096", "--offload", "optimizer"]
TIMINGS = re.compile(r"in \d+(?:\.\d+)? s\b")


def fenced(text: str) -> str:
    return "```\n" + text.rstrip("\n") + "\n```"


def lines_starting(*prefixes: str) -> Callable[[str], str]:
    def pick(out: str) -> str:
        return fenced("\n".join(line for line in out.splitlines() if line.startswith(prefixes)))
    return pick


def until_blank_after(marker: str) -> Callable[[str], str]:
    """Everything up to the first blank line after the line starting with `marker`."""
    def pick(out: str) -> str:
        lines, seen = [], False
        for line in out.splitlines():
            if seen and not line.strip():
                break
            seen = seen or line.startswith(marker)
            lines.append(line)
        return fenced("\n".join(lines))
    return pick


def accuracy_table(out: str) -> str:
    s = json.loads(out)["summary"]
    rows = [("step time", "step_time_rel", "{:.1%}"), ("peak allocated HBM", "peak_memory_rel", "{:.1%}"),
            ("GPU utilization (kernel-busy share)", "utilization_abs", "{:.2f}"),
            ("kernel time share by category", "kernel_share_abs", "{:.2f}")]
    lines = ["| quantity | median error | worst case |", "| --- | --- | --- |"]
    lines += [f"| {label} | {fmt.format(s[key]['median'])} | {fmt.format(s[key]['max'])} |" for label, key, fmt in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class Quote:
    name: str
    file: str
    command: list[str]
    excerpt: Callable[[str], str]
    cheap: bool  # seconds, not minutes: checked by the test suite


QUOTES = (
    Quote("first-command", "README.md", GHSIM + FIRST_COMMAND,
          lines_starting("step time", "tokens/s", "HBM peak", "host peak", "fits"), cheap=True),
    Quote("plan-llama-70b", "README.md", GHSIM + ["plan", "--model", "llama-70b", "--gpus", "4", "--time-limit", "0"],
          fenced, cheap=False),
    Quote("accuracy", "README.md", GHSIM + ["validate", "validation", "--json"], accuracy_table, cheap=False),
    Quote("intervals", "README.md", [sys.executable, "benchmarks/prediction_intervals.py", "--coverage"],
          lambda out: out.rstrip("\n"), cheap=True),
    Quote("gh200-vs-h100", "examples/README.md", [sys.executable, "examples/gh200_vs_h100_7b_full_finetune.py"],
          until_blank_after("GH200 is"), cheap=False),
)


def run(q: Quote) -> str:
    p = subprocess.run(q.command, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if p.returncode not in (0, 1):  # validate exits 1 when a case is outside tolerance: still quoted
        raise SystemExit(f"{q.name}: {' '.join(q.command)} exited {p.returncode}: {p.stderr[-500:]}")
    return q.excerpt(p.stdout)


def block(q: Quote) -> re.Pattern:
    return re.compile(rf"(<!-- begin {re.escape(q.name)} \(examples/regenerate_readme.py\) -->\n)(.*?)"
                      rf"(\n<!-- end {re.escape(q.name)} -->)", re.S)


def quoted(q: Quote) -> str:
    m = block(q).search((REPO / q.file).read_text())
    if not m:
        raise SystemExit(f"{q.file}: no quote named {q.name}")
    return m.group(2)


def stale(q: Quote) -> str | None:
    """How the quote differs from a fresh run (timings masked), or None."""
    fresh, old = TIMINGS.sub("in <t> s", run(q)), TIMINGS.sub("in <t> s", quoted(q))
    if fresh == old:
        return None
    diff = [f"- {a}\n+ {b}" for a, b in zip(old.splitlines(), fresh.splitlines()) if a != b]
    return f"{q.file}: quote {q.name} is stale:\n" + "\n".join(diff[:10] or [f"{len(old)} vs {len(fresh)} chars"])


def rewrite(q: Quote) -> None:
    path = REPO / q.file
    text = path.read_text()
    quoted(q)
    path.write_text(block(q).sub(lambda m: m.group(1) + run(q) + m.group(3), text, count=1))


def main(args: list[str]) -> int:
    check, every = "--check" in args, "--all" in args
    if not check:
        for q in QUOTES:
            rewrite(q)
            print(f"rewrote {q.file}: {q.name}")
        return 0
    problems = [p for q in QUOTES if q.cheap or every for p in [stale(q)] if p]
    print("\n".join(problems) or "every checked quote is current")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
