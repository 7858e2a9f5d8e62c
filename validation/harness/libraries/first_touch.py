"""Host first-touch microbenchmark: what torch's fp32 CPU -> bf16 cast into a NEW tensor costs, split
into its page faults and its bytes, so that hosts with other page sizes (Grace: 64 KiB) can be priced.

DeepSpeed ZeRO-3 returns each updated fp32 sub-group to the GPU with a blocking copy_ of the fp32 CPU
tensor into the bf16 GPU parameter; torch casts on the CPU into a freshly allocated pageable tensor first
(large allocations are fresh mmap'd pages: every page faults and is zeroed by the kernel on first touch).

Measured (each the median of 3 after one warm-up, CUDA synchronised where the GPU is involved):
  torch: src.to(bf16) (fresh pages), y.copy_(src) into a pre-touched bf16 tensor (no faults), and the
         blocking gpu_bf16.copy_(cpu_fp32), at 16 and 3 torch threads; minor faults from getrusage.
  mmap:  one thread (numpy) fills a fresh anonymous mapping (first touch) then fills it again, with
         4 KiB pages and with madvise(MADV_HUGEPAGE) (transparent huge pages, where the kernel allows);
         minor faults from getrusage. Two page sizes give two equations: seconds per fault and per byte.
    python3 validation/harness/libraries/first_touch.py --out $OUT/first_touch.json
"""
import argparse, json, mmap, platform, resource, statistics, time
from pathlib import Path

import numpy as np
import torch


def minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed(fn, reps=3):
    fn()
    rows = []
    for _ in range(reps):
        f0, t0 = minflt(), time.perf_counter()
        fn()
        rows.append((time.perf_counter() - t0, minflt() - f0))
    return {"s": statistics.median(r[0] for r in rows), "minor_faults": statistics.median(r[1] for r in rows),
            "all_s": [r[0] for r in rows]}


def torch_rows(n: int) -> list[dict]:
    out = []
    src = torch.randn(n)
    pre = torch.empty(n, dtype=torch.bfloat16)
    pre.fill_(0)
    gpu = torch.empty(n, dtype=torch.bfloat16, device="cuda")

    def blocking():
        gpu.copy_(src)
        torch.cuda.synchronize()

    for threads in (16, 3):
        torch.set_num_threads(threads)
        out.append({"threads": threads, "elements": n,
                    "cast_fresh": timed(lambda: src.to(torch.bfloat16)),
                    "cast_pretouched": timed(lambda: pre.copy_(src)),
                    "blocking_copy_to_gpu": timed(blocking)})
    return out


def mmap_rows(nbytes: int) -> list[dict]:
    out = []
    for huge in (False, True):
        def first_and_second():
            mm = mmap.mmap(-1, nbytes)
            if huge:
                mm.madvise(mmap.MADV_HUGEPAGE)
            a = np.frombuffer(mm, dtype=np.uint8)
            f0, t0 = minflt(), time.perf_counter()
            a.fill(1)
            t1, f1 = time.perf_counter(), minflt()
            a.fill(2)
            t2 = time.perf_counter()
            del a
            mm.close()
            return t1 - t0, f1 - f0, t2 - t1
        first_and_second()
        rows = [first_and_second() for _ in range(3)]
        out.append({"madv_hugepage": huge, "bytes": nbytes,
                    "first_touch_s": statistics.median(r[0] for r in rows),
                    "minor_faults": statistics.median(r[1] for r in rows),
                    "second_fill_s": statistics.median(r[2] for r in rows), "all": rows})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--elements", type=int, default=250_000_000)
    args = ap.parse_args()
    thp = {}
    for name in ("enabled", "defrag"):
        p = Path("/sys/kernel/mm/transparent_hugepage") / name
        thp[name] = p.read_text().strip() if p.exists() else None
    result = {"script": "validation/harness/libraries/first_touch.py", "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0), "page_size": mmap.PAGESIZE, "thp": thp,
              "cpu": platform.processor() or platform.machine(), "nproc": torch.get_num_threads(),
              "mmap": mmap_rows(args.elements * 2), "torch_rows": torch_rows(args.elements)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("mmap", "torch_rows")}))
    for r in result["mmap"]:
        print("mmap", r["madv_hugepage"], r["first_touch_s"], r["minor_faults"], r["second_fill_s"])
    for r in result["torch_rows"]:
        print("torch", r["threads"], {k: (v["s"], v["minor_faults"]) for k, v in r.items() if isinstance(v, dict)})


if __name__ == "__main__":
    main()
