"""Multi-GPU simulation: speed of simulate() at scale, and errors against the published tables.

    python benchmarks/bench_multigpu.py [--calibration synthetic] [--write]

Speed: llama-3-70b on 1024 GPUs (TP 8, PP 8, DP 16) must simulate in at most 1 s;
the single-GPU 70B step is timed alongside as the reference. Accuracy: every row
of validation/published/{narayanan2021,korthikanti2022,rajbhandari2020,steiger2025}*.toml
(tests/published_tables.py). --write rewrites validation/published/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import add_calibration_option, chosen_calibration, median_time
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, Plan, Recompute
from ghsim.simulate import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the published tables are test code
from published_tables import PUBLISHED, Row, all_rows, render, summary  # noqa: E402

BUDGET_1024_S = 1.0


def speed(cal) -> list[tuple[str, float, object]]:
    hw = load_hardware("h100-sxm")
    llama70 = load_model("llama-3-70b")
    cases = [
        ("llama-3-70b, 1 GPU, seq 4096, full recompute", llama70, Plan(seq=4096, recompute=Recompute.FULL)),
        ("llama-3-70b, 1024 GPUs, TP8 PP8 DP16, 1 micro-batch per rank", llama70,
         Plan(gpus=1024, tp=8, pp=8, seq=4096, recompute=Recompute.FULL, framework=Framework.DEEPSPEED, zero=1)),
        ("llama-3-70b, 1024 GPUs, TP8 PP8 DP16, global batch 1024 (64 micro-batches)", llama70,
         Plan(gpus=1024, tp=8, pp=8, seq=4096, global_batch=1024, recompute=Recompute.FULL,
              framework=Framework.DEEPSPEED, zero=1, sequence_parallel=True)),
    ]
    out = []
    for label, model, plan in cases:
        t, report = median_time(lambda: simulate(model, hw, plan, cal, keep_timeline=False))
        out.append((label, t, report))
    return out


def measured_cases() -> list[str]:
    """Markdown rows of the 2x H200 cases and their single-GPU baselines (ghsim.validate.cases)."""
    from ghsim.validate.cases import validate

    root = PUBLISHED.parent / "cases"
    wanted = ("h200x2-", "h200-llama1b-bf16-mb4-s2048", "h200-llama3b-bf16-mb2-s4096")
    out = []
    for r in validate(root, with_trace=False):
        if not r.case.name.startswith(wanted) or r.status == "skipped":
            continue
        m, p = r.measured, r.predicted
        out.append(f"| {r.case.name} | {m['step_time_s'] * 1e3:.1f} ms | {p['step_time_s'] * 1e3:.1f} ms | "
                   f"{p['step_time_s'] / m['step_time_s'] - 1:+.1%} | {m['peak_memory_bytes'] / 1e9:.1f} GB | "
                   f"{p['peak_memory_bytes'] / 1e9:.1f} GB | {p['peak_memory_bytes'] / m['peak_memory_bytes'] - 1:+.1%} |")
    return out


KERNEL_SETS = (
    (Framework.DEEPSPEED, "eager (deepspeed)", "eager PyTorch kernels: the setup before fused mode"),
    (Framework.MEGATRON, "fused, flash (megatron)", "Megatron-core today: flash attention, fused cross entropy"),
    (Framework.MEGATRON_LEGACY, "fused, softmax (megatron-legacy)", "the kernels the papers ran: the rows above"),
)


MEGATRON_TABLES = ("narayanan2021-megatron-weak-scaling", "korthikanti2022-selective-recompute")


def kernel_set_comparison(rows: list[Row]) -> list[str]:
    """Markdown: every Megatron-table row simulated with each kernel set (ghsim --framework);
    `rows` (all_rows()) already hold them with the papers' kernels (megatron-legacy)."""
    from published_tables import korthikanti, narayanan

    by = {fw: narayanan(PUBLISHED / f"{MEGATRON_TABLES[0]}.toml", fw)
          + korthikanti(PUBLISHED / f"{MEGATRON_TABLES[1]}.toml", fw)
          for fw, _, _ in KERNEL_SETS if fw != Framework.MEGATRON_LEGACY}
    by[Framework.MEGATRON_LEGACY] = [r for r in rows if r.source in MEGATRON_TABLES]
    lines = ["| kernel set | what it is | " + " | ".join(f"{key} median / max" for key in summary(by[KERNEL_SETS[0][0]])) + " |",
             "| --- | --- | " + " | ".join("---:" for _ in summary(by[KERNEL_SETS[0][0]])) + " |"]
    for fw, label, what in KERNEL_SETS:
        stats = summary(by[fw])
        lines.append(f"| {label} | {what} | " + " | ".join(
            f"{v['median_abs_error']:.1%} / {v['max_abs_error']:.1%}" for v in stats.values()) + " |")
    lines += ["", "| source | case | published | " + " | ".join(label for _, label, _ in KERNEL_SETS) + " |",
              "| --- | --- | ---: | " + " | ".join("---:" for _ in KERNEL_SETS) + " |"]
    first = by[KERNEL_SETS[0][0]]
    for i, r in enumerate(first):
        cells = " | ".join(f"{by[fw][i].predicted:.4g} ({by[fw][i].error:+.1%})" for fw, _, _ in KERNEL_SETS)
        lines.append(f"| {r.source.split('-')[0]} | {r.case} ({r.metric}) | {r.published:.4g} | {cells} |")
    return lines


_PREAMBLE = (
    "# Multi-GPU predictions vs published measurements",
    "",
    "Written by `python benchmarks/bench_multigpu.py --write`; the test",
    "`tests/test_multigpu_published.py` recomputes every row. Nothing in ghsim was tuned to",
    "these rows. The A100 rows are priced with `hardware_profiles/calibration/a100.json`,",
    "which is *derived, not measured*: the measured H100 efficiencies applied to the A100's",
    "datasheet peaks (its `meta.derivation` and `meta.caveats` say so). The GH200 rows use",
    "the profile's own (H100-measured) calibration. Error = predicted / published - 1.",
    "",
    "## Summary",
    "",
    "| table: metric | rows | median abs error | max abs error |",
    "| --- | ---: | ---: | ---: |",
)
_ASSUMPTIONS_AND_READING = (
    "## Assumptions where the papers leave a choice open", "",
    "- Narayanan et al. Table 1 gives no micro-batch size or interleaving: micro-batch 1,",
    "  non-interleaved 1F1B, no ZeRO, full recomputation; TFLOP/s per GPU from the paper's Eq. 3",
    "  FLOP count divided by the predicted step time.",
    "- Korthikanti et al.: micro-batch and interleaving as in the table (Calculon's reproduction);",
    "  'full recompute' without sequence parallelism, the other column with it plus selective",
    "  recomputation (attention core).",
    "- Both Megatron tables are simulated with ghsim's 'megatron-legacy' framework: fp16 working",
    "  weights with fp32 masters and the kernels Megatron-LM ran in 2021-22 (fused LayerNorm,",
    "  bias-GeLU, bias-dropout-add and scale-mask-softmax, Narayanan et al. Sec. 4.2; attention as",
    "  batched GEMMs around that softmax, no flash attention, as Korthikanti et al.'s Table 2 counts",
    "  the stored softmax; the cross entropy in PyTorch ops; fused Adam, gradient-norm clipping and",
    "  the master-to-fp16 copy); hidden and attention dropout 0.1 (Megatron's defaults; Table 2",
    "  counts the masks); the data-parallel all-reduce after the last backward (Megatron's",
    "  default, not overlapped). Fused kernels stream their minimal bytes at the measured",
    "  copy/add rates (docs/formats.md, 'framework').",
    "- ZeRO Figure 1 is simulated on gpt3-7.5b (7.46B parameters, not 7.5B); DeepSpeed's ZeRO-1",
    "  gradient partition, which the paper's formula leaves out, is counted.",
    "- Steiger et al.: Llama-3-8B shape (the closest catalog model), DeepSpeed bf16, micro-batch",
    "  1, seq 2048, no recomputation; tokens/s taken as the sum over the 4 GPUs; published peak",
    "  VRAM includes model initialization. SuperOffload with several GPUs is not simulated.",
    "",
    "## Reading the errors", "",
    "- Megatron tables, by kernel set (next section): with the eager PyTorch kernels ghsim",
    "  modeled before (separate norm, activation and cast kernels) it was too slow by up to 21%",
    "  (Narayanan) and 25% (Korthikanti full recompute, which runs the forward twice). Today's",
    "  fused set ('megatron': flash attention) overshoots the other way, by up to 45% on the",
    "  smallest model, where the s x s attention work that flash attention removes weighs most",
    "  (s/h = 0.9 at 1.7B). The set the papers ran ('megatron-legacy') leaves every Narayanan",
    "  row 2-11% optimistic and Korthikanti within -13%..+5%. What remains is not tuned away:",
    "  candidates are the A100 calibration (derived from H100 efficiencies: memory-bound",
    "  kernels are assumed to reach the same share of HBM bandwidth, the batched attention GEMMs",
    "  are held only to the copy-rate floor) and Megatron work not modeled (the embedding-gradient",
    "  all-reduce between pipeline ends, embedding dropout, data loading, logging).",
    "- ZeRO model-state memory follows the paper's accounting to within 2%.",
    "- GH200 DeepSpeed: ghsim predicts 1.5x (ZeRO-1/2) and 2.3x (ZeRO-3) the published tokens/s.",
    "  ghsim's ZeRO-3 is FSDP-like (one all-gather per layer, prefetched, overlapped); DeepSpeed",
    "  ZeRO-3 fetches per submodule through Python hooks, which this study measures as 26% slower",
    "  than ZeRO-1. ghsim's 2-GPU FSDP ZeRO-2/3 and DDP cases (below) are within 8-14%, so",
    "  most of the gap is DeepSpeed's engine overhead, which ghsim does not model.",
    "  (Numbers in this section as of the commit that wrote this file; the tables are exact.)",
    "",
    "## Megatron tables by kernel set", "",
    "Each row of the two Megatron tables simulated with each `--framework` (nothing else",
    "changed); the predicted value, then its error. In the order it happened: fused mode was",
    "built as 'megatron' (today's kernels) and overshot; 'megatron-legacy' was then added with",
    "what the papers state they ran (softmax attention, dropout, unfused cross entropy); its",
    "batched attention GEMMs first priced above the A100's peak (the GEMM table has no such",
    "skinny shape), so they are held to the measured copy rate for their bytes and to the peak.",
    "No number was fitted to these rows.", "",
)
_MEASURED_HEADER = (
    "## Our 2-GPU H200 measurements (validation/cases/h200x2-*)", "",
    "The NVLink figures of the h200-sxm and h100-sxm profiles come from the 2x H200 NCCL sweep",
    "(validation/microbench/h200-x2-nccl.json). The cases (DDP, FSDP ZeRO-2/3) as `ghsim validate`",
    "reports them; the single-GPU H200 cases of the same models are listed for the baseline.", "",
    "| case | measured step | predicted | error | measured peak | predicted | error |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
)


def results_markdown(rows: list[Row], timings: list[tuple[str, float, object]]) -> str:
    lines = _summary_lines(rows) + ["", "## Every row", ""] + _row_lines(rows)
    lines += ["", *_ASSUMPTIONS_AND_READING]
    lines += kernel_set_comparison(rows)
    lines += ["", *_MEASURED_HEADER]
    lines += measured_cases()
    lines += ["",
              "## Simulator speed (this machine)", "",
              "| case | simulate() median | step | MFU |", "| --- | ---: | ---: | ---: |"]
    for label, t, report in timings:
        lines.append(f"| {label} | {t * 1e3:.0f} ms | {report.step_time_s:.3f} s | {report.mfu:.1%} |")
    return "\n".join(lines) + "\n"


def _summary_lines(rows: list[Row]) -> list[str]:
    """The page's preamble and its summary table (errors by table and metric)."""
    lines = list(_PREAMBLE)
    for key, v in summary(rows).items():
        lines.append(f"| {key} | {v['rows']} | {v['median_abs_error']:.1%} | {v['max_abs_error']:.1%} |")
    return lines


def _row_lines(rows: list[Row]) -> list[str]:
    """Every published row with its prediction and error."""
    lines = ["| source | case | metric | published | predicted | error | note |",
             "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        pred = f"{r.predicted:.4g}" if r.predicted is not None else "not simulated"
        err = f"{r.error:+.1%}" if r.error is not None else "-"
        lines.append(f"| {r.source} | {r.case} | {r.metric} | {r.published:.4g} | {pred} | {err} | {r.note} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    add_calibration_option(ap)
    ap.add_argument("--write", action="store_true", help="rewrite validation/published/RESULTS.md")
    args = ap.parse_args()
    cal = chosen_calibration(args.calibration)
    timings = speed(cal)
    for label, t, report in timings:
        print(f"{label:<80} {t * 1e3:8.1f} ms   step {report.step_time_s:8.3f} s")
    t1024 = timings[1][1]
    print(f"1024-GPU simulate: {t1024:.3f} s = {t1024 / BUDGET_1024_S:.2f} x the {BUDGET_1024_S:.0f} s budget")
    rows = all_rows()
    print(render(rows))
    for key, v in summary(rows).items():
        print(f"{key:<70} median |err| {v['median_abs_error']:6.1%}   max {v['max_abs_error']:6.1%}")
    if args.write:
        (PUBLISHED / "RESULTS.md").write_text(results_markdown(rows, timings))
        print(f"wrote {PUBLISHED / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
