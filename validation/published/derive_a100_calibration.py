"""Write hardware_profiles/calibration/a100.json from the measured H100 set (no A100 was available).

    python validation/published/derive_a100_calibration.py

The H100 measurements are copied unchanged and stay referenced to the h100-sxm
profile, so the cost model reads every rate as an efficiency of the H100's
datasheet peaks and applies it to the A100 profile's peaks and HBM bandwidth.
Nothing is fitted to the published A100 results. Run it again whenever
hardware_profiles/calibration/h100.json changes.
"""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "hardware_profiles/calibration/h100.json"


def main() -> None:
    d = json.loads((ROOT / SOURCE).read_text())
    meta = d["meta"]
    d["meta"] = {
        "gpu": "NVIDIA A100 (derived, not measured)",
        "reference_profile": meta.get("reference_profile", "h100-sxm"),
        "derived_from": SOURCE,
        "derived_from_measurement": meta.get("calibrated_from", ""),
        "derived_by": "validation/published/derive_a100_calibration.py",
        "derivation": (
            "NOT an A100 measurement: no A100 was available. This file is the measured H100 SXM set unchanged, "
            "still referenced to the h100-sxm profile, so every rate is read as an efficiency of the H100's "
            "datasheet peaks and applied to the A100 profile's peaks: GEMM and attention at the same fraction of "
            "peak FLOP/s per shape, memory-bound kernels and the GPU optimizer at the same fraction of HBM "
            "bandwidth, the same host costs per kernel. Nothing here was fitted to any published A100 result."),
        "caveats": (
            "A100 kernels usually reach a larger fraction of peak than H100 kernels (cuBLAS bf16/fp16 GEMMs "
            "~80-90% of 312 TFLOP/s vs ~70-75% of 989 on H100; FlashAttention-2 on A100 ~70% fwd vs well under "
            "that on H100), so predictions with this set lean slow; the host costs were measured on the H100 "
            "host's Xeon, not on a DGX A100's EPYC 7742."),
        "method": meta.get("method", ""),
    }
    (ROOT / "hardware_profiles/calibration/a100.json").write_text(json.dumps(d, indent=1))


if __name__ == "__main__":
    main()
