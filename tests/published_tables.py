"""Multi-GPU predictions against published tables (validation/published/*.toml).

Each row is simulated with the plan the paper states and nothing tuned to it;
where the paper leaves a choice open the assumption is written next to the
row (and in RESULTS.md). Predictions use the profile's calibration: the A100
rows run on hardware_profiles/calibration/a100.json, which is the measured
H100 set read as efficiencies (see its meta), not an A100 measurement.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from ghsim.errors import GhsimError
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, OffloadSchedule, Plan, Precision, Recompute
from ghsim.simulate import simulate
from ghsim.tomlio import read_toml, repo_root

PUBLISHED = repo_root() / "validation" / "published"


@dataclass(frozen=True)
class Row:
    source: str  # the TOML's stem
    case: str
    metric: str  # what is compared, with its unit
    published: float
    predicted: float | None  # None: not simulated (see note)
    note: str = ""

    @property
    def error(self) -> float | None:
        if self.predicted is None or not self.published:
            return None
        return self.predicted / self.published - 1.0


def megatron_flops(model, batch: int, seq: int) -> float:
    """Narayanan et al. (SC21) Eq. 3: FLOPs of one iteration with activation recomputation."""
    L, h, V = model.num_layers, model.hidden_size, model.vocab_size
    return 96 * batch * seq * L * h * h * (1 + seq / (6 * h) + V / (16 * L * h))


def narayanan(path: Path, framework: Framework = Framework.MEGATRON_LEGACY) -> list[Row]:
    """Table 1 weak scaling: achieved TFLOP/s per GPU = Eq. 3 FLOPs / (predicted step x GPUs).

    Assumptions (not in the table): micro-batch 1, non-interleaved 1F1B, ZeRO off,
    fp16 working weights with fp32 masters and the kernels Megatron-LM ran in 2021
    (ghsim's "megatron-legacy" framework: fused LayerNorm, bias-GeLU, bias-dropout-add
    and scale-mask-softmax, Sec. 4.2 of the paper; attention as batched GEMMs, no flash
    attention); dropout 0.1 (Megatron's default, models/gpt3-*.toml).
    `framework` swaps the kernel set (RESULTS.md compares them).
    """
    d = read_toml(path)
    hw = load_hardware(d["setup"]["hardware"])
    rows = []
    for r in d["row"]:
        model = load_model(r["model"])
        plan = Plan(gpus=r["gpus"], tp=r["tp"], pp=r["pp"], global_batch=r["global_batch"], micro_batch=1,
                    seq=d["setup"]["seq"], precision=Precision.FP16, recompute=Recompute.FULL,
                    framework=framework)
        rep = simulate(model, hw, plan, keep_timeline=False)
        tflops = megatron_flops(model, r["global_batch"], d["setup"]["seq"]) / (rep.step_time_s * r["gpus"]) / 1e12
        rows.append(Row(path.stem, f"{r['model']} tp{r['tp']} pp{r['pp']} {r['gpus']} GPUs", "TFLOP/s per GPU",
                        r["achieved_tflops_per_gpu"], tflops,
                        f"step {rep.step_time_s:.2f} s, bubble {rep.extra['parallel']['pipeline_bubble_fraction']:.1%}"))
    return rows


def korthikanti(path: Path, framework: Framework = Framework.MEGATRON_LEGACY) -> list[Row]:
    """Table 4 iteration time: full recompute (no sequence parallelism) vs sequence
    parallelism + selective recompute, with the paper's micro-batch and interleaving;
    Megatron-LM's kernels of the time (ghsim's "megatron-legacy" framework: its Table 2
    counts the stored softmax and dropout masks, i.e. no flash attention)."""
    d = read_toml(path)
    hw = load_hardware(d["setup"]["hardware"])
    rows = []
    for r in d["row"]:
        model = load_model(r["model"])
        for label, rc, sp, key in (("full recompute", Recompute.FULL, False, "iteration_time_full_recompute_s"),
                                   ("seq-par + selective", Recompute.SELECTIVE, True,
                                    "iteration_time_seqpar_selective_s")):
            plan = Plan(gpus=r["gpus"], tp=r["tp"], pp=r["pp"], global_batch=r["global_batch"],
                        micro_batch=r["micro_batch"], seq=d["setup"]["seq"], precision=Precision.FP16,
                        recompute=rc, sequence_parallel=sp, pp_interleave=r["interleave"],
                        framework=framework)
            rep = simulate(model, hw, plan, keep_timeline=False)
            fit = "" if rep.fits else "; predicted not to fit: " + "; ".join(rep.fit_problems)
            rows.append(Row(path.stem, f"{r['model']} {label}", "iteration s", r[key], rep.step_time_s,
                            f"HBM peak {rep.hbm.peak_bytes / 1e9:.1f} GB{fit}"))
    return rows


def rajbhandari(path: Path) -> list[Row]:
    """Figure 1: model-state bytes per GPU for 7.5B parameters on 64 GPUs, ZeRO 0-3.
    Simulated on gpt3-7.5b (7.46B parameters), fp16 with fp32 masters and Adam."""
    d = read_toml(path)
    model = load_model("gpt3-7.5b")
    hw = load_hardware("a100-sxm-80gb")  # any profile: model states do not depend on it
    rows = []
    for r in d["row"]:
        for zero, key in enumerate(("baseline_gb", "zero1_os_gb", "zero2_os_g_gb", "zero3_os_g_p_gb")):
            plan = Plan(gpus=r["dp"], zero=zero, seq=2048, precision=Precision.FP16, framework=Framework.DEEPSPEED)
            rep = simulate(model, hw, plan, keep_timeline=False)
            states = rep.extra["parallel"]["stages"][0]["model_state_bytes"]
            rows.append(Row(path.stem, f"ZeRO-{zero}, {r['dp']} GPUs", "model states GB", r[key],
                            sum(states.values()) / 1e9,
                            ", ".join(f"{k} {v / 1e9:.2f}" for k, v in states.items())))
    return rows


def steiger(path: Path) -> list[Row]:
    """ETH GH200 study: one quad-GH200 node, DeepSpeed ZeRO 0-3 (+ optimizer offload),
    Llama-3-8B shape, micro-batch 1, seq 2048, bf16, no recompute; tokens/s summed over 4 GPUs."""
    d = read_toml(path)
    s = d["setup"]
    hw = load_hardware(s["hardware"])
    model = load_model("llama-3-8b")
    rows = []
    reference = None
    for r in d["row"]:
        label = r["what"].split(",")[0]
        offload = frozenset(r.get("offload", []))
        plan = Plan(gpus=s["gpus"], zero=r["zero"], micro_batch=s["micro_batch"], seq=s["seq"],
                    precision=Precision.BF16, framework=Framework.DEEPSPEED, offload=offload,
                    offload_schedule=OffloadSchedule(r.get("offload_schedule", "auto")),
                    offload_ratio=r.get("offload_ratio", 1.0))  # the authors' offload settings, if any
        try:
            rep = simulate(model, hw, plan, keep_timeline=False)
        except GhsimError as e:
            rows.append(Row(path.stem, label, "tokens/s", r.get("tokens_per_s", 0.0), None, str(e)))
            continue
        if r.get("status") == "OOM":
            rows.append(Row(path.stem, label, "fits (1 = yes)", 0.0, 0.0 if not rep.fits else 1.0,
                            f"published OOM; predicted HBM peak {rep.hbm.peak_bytes / 1e9:.1f} GB"))
            continue
        if "tokens_per_s" in r:
            rows.append(Row(path.stem, label, "tokens/s (4 GPUs)", r["tokens_per_s"], rep.tokens_per_s,
                            f"step {rep.step_time_s * 1e3:.0f} ms"))
            if r["zero"] == 3 and not offload:
                reference = rep.tokens_per_s
        if "throughput_vs_zero3" in r and reference:
            rows.append(Row(path.stem, label, "throughput vs ZeRO-3 (ratio)", 1 + r["throughput_vs_zero3"],
                            rep.tokens_per_s / reference, r.get("read_from", "")
                            + (f"; {r['caveat']}" if "caveat" in r else "")))
        rows.append(Row(path.stem, label, "peak VRAM GB", r["peak_vram_gb"], rep.hbm.peak_bytes / 1e9,
                        "published peak includes model initialization"))
    return rows


TABLES = {
    "narayanan2021-megatron-weak-scaling": narayanan,
    "korthikanti2022-selective-recompute": korthikanti,
    "rajbhandari2020-zero-memory": rajbhandari,
    "steiger2025-eth-gh200-deepspeed": steiger,
}


def all_rows(root: Path = PUBLISHED) -> list[Row]:
    rows: list[Row] = []
    for stem, fn in TABLES.items():
        rows += fn(root / f"{stem}.toml")
    return rows


def summary(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Median and max |error| per source and metric."""
    out: dict[str, dict[str, float]] = {}
    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.error is not None and r.metric != "fits (1 = yes)":
            groups.setdefault((r.source, r.metric), []).append(abs(r.error))
    for (source, metric), errs in groups.items():
        out[f"{source}: {metric}"] = {"median_abs_error": statistics.median(errs), "max_abs_error": max(errs),
                                      "rows": len(errs)}
    return out


def render(rows: list[Row]) -> str:
    lines = [f"{'source':<38} {'case':<36} {'metric':<28} {'published':>10} {'predicted':>10} {'error':>8}"]
    for r in rows:
        pred = f"{r.predicted:10.3g}" if r.predicted is not None else f"{'-':>10}"
        err = f"{r.error:+8.1%}" if r.error is not None else f"{'-':>8}"
        lines.append(f"{r.source:<38} {r.case:<36} {r.metric:<28} {r.published:10.3g} {pred} {err}")
    return "\n".join(lines)
