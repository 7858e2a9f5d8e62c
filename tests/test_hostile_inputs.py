"""Hostile input to every command: numbers (NaN, inf, huge, negative, not numbers), wrong types,
truncated and corrupted TOML, JSON and trace files. The promise (DESIGN.md): exit code 0 or 2;
on 2, one line on stderr and no traceback; no hang; a --json answer is valid JSON.

Each case is drawn from a random.Random, so the same generator serves hypothesis here (modest
max_examples for CI) and a counting run that does not stop at the first violation:

    PYTHONPATH=$PWD python tests/test_hostile_inputs.py 300     # cases per command, violations counted
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
import tempfile
from pathlib import Path
from typing import Callable

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from ghsim.cli import main  # noqa: E402
from synthetic import TINY_MODEL_TOML  # noqa: E402
from synthetic_traces import write_kineto  # noqa: E402

REPO = Path(os.environ.get("GHSIM_REPO", Path(__file__).resolve().parent.parent))  # another checkout: counts before a fix
EXAMPLES = int(os.environ.get("GHSIM_HOSTILE_EXAMPLES", "12"))
CASE_SECONDS = 60  # a case that runs longer hangs (every search here has --time-limit <= 1 s)

NUMBERS = ["nan", "NaN", "inf", "-inf", "1e400", "-1e400", "-1", "0", "-0", "1e-300", "3.5", "abc", "",
           "0x10", "1_000", " 7", "1e9", "2147483648", "-2147483649", str(10**30), str(-10**30), "true",
           "[1]", "1,2", "4096", "1", "2", "8"]
INT_FLAGS = ["--gpus", "--gpus-per-node", "--seq", "--micro-batch", "--global-batch", "--zero", "--tp", "--pp",
             "--ep", "--pp-interleave", "--lora-rank", "--dataloader-workers", "--cpu-threads", "--host-cores"]
FLOAT_FLAGS = ["--offload-ratio", "--batch-prep-ms", "--cpu-cores-share", "--host-memory-gb"]
CHOICE_FLAGS = {"--precision": ["fp32", "tf32", "bf16", "fp16", "fp8"], "--recompute": ["none", "selective", "full"],
                "--offload": ["optimizer", "grads,optimizer", "params,optimizer", "activations", "none", "bogus,,"],
                "--offload-schedule": ["auto", "sync", "overlapped", "superoffload"],
                "--framework": ["torch-amp", "fsdp-mixed", "deepspeed", "megatron", "megatron-legacy"],
                "--optimizer-impl": ["foreach", "fused"],
                "--cpu-optimizer": ["auto", "deepspeed-cpuadam", "torch-fused", "torch-foreach", "torch-forloop", "x"],
                "--lora-targets": ["all", "peft", "q,v", "q,k,v,o", "qkv", ",", "gate,down"],
                "--fp8-recipe": ["delayed", "tensorwise", "rowwise", "mxfp8", ""]}
SWITCHES = ["--unified-memory", "--cuda-graphs", "--sequence-parallel", "--offload-pageable", "--grad-clip", "--fp8-params",
            "--compile"]
HARDWARE = ["gh200-96gb", "h100-sxm", "h100-pcie", "h200-sxm", "a100-sxm-80gb", "gh200-96gb-quad", "nope"]
JUNK = ["", "\x00", "é", "-", "--", "a" * 300, "../../etc/passwd", "{}", "[]", "1e400"]


def number(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.6:
        return rng.choice(NUMBERS)
    if pick < 0.8:
        return str(rng.randint(-10**6, 10**6))
    return repr(rng.uniform(-1e6, 1e6))


def plan_flags(rng: random.Random, hostile: float = 0.5) -> list[str]:
    """A few plan flags; each value hostile with probability `hostile`, else plausible."""
    args: list[str] = []
    for _ in range(rng.randint(0, 4)):
        kind = rng.random()
        if kind < 0.45:
            flag = rng.choice(INT_FLAGS)
            args += [flag, number(rng) if rng.random() < hostile else str(rng.choice([1, 2, 4, 8]))]
        elif kind < 0.6:
            flag = rng.choice(FLOAT_FLAGS)
            args += [flag, number(rng) if rng.random() < hostile else rng.choice(["0.5", "1", "10"])]
        elif kind < 0.9:
            flag = rng.choice(list(CHOICE_FLAGS))
            args += [flag, rng.choice(JUNK) if rng.random() < hostile / 3 else rng.choice(CHOICE_FLAGS[flag])]
        else:
            args.append(rng.choice(SWITCHES))
    return args


OVERLAY_TOML = """[overlay]
format = 1
fitted_on = "h100-sxm"
gpu_model = "H100 SXM5 80GB"
calibration = "h100"
model = "tiny"
precision = "bf16"
trace = "t.json"
window = "steps 1-2"

[model_shape]
hidden_size = 1024
intermediate_size = 2816
num_attention_heads = 8
num_kv_heads = 8
head_dim = 128

[kernel.elementwise]
factor = 1.25
source = "t.json steps 1-2"

[kernel."attention:bf16"]
factor = 0.9
shapes = [[1, 8, 8, 4096, 128]]
source = "t.json steps 1-2"

[host."launch:bf16-amp"]
factor = 1.3
source = "t.json steps 1-2"
"""

# -- files: valid templates, then damaged --------------------------------------------------------

def damage(rng: random.Random, data: bytes) -> bytes:
    """Truncate, flip bytes, or splice a hostile number over a number."""
    how = rng.random()
    if how < 0.3 or not data:
        return data[: rng.randint(0, max(0, len(data) - 1))]
    if how < 0.6:
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out)
    digits = [i for i, b in enumerate(data) if chr(b).isdigit() and (i == 0 or not chr(data[i - 1]).isdigit())]
    if not digits:
        return data + b"\x00"
    i = rng.choice(digits)
    j = i
    while j < len(data) and (chr(data[j]).isdigit() or data[j] in b".e-+"):
        j += 1
    value = rng.choice(["nan", "inf", "-inf", "1e400", "-5", "0", str(10**400), '"x"', "[]", "{}", "true", "NaN",
                        "Infinity", "-1e-400"])
    return data[:i] + value.encode() + data[j:]


class Files:
    """Valid inputs written once; each case writes a damaged copy."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.model = folder / "tiny.toml"
        self.model.write_text(TINY_MODEL_TOML)
        self.templates = {
            "plan.toml": (REPO / "examples" / "plans" / "llama70b-4xgh200.toml").read_bytes(),
            "model.toml": TINY_MODEL_TOML.encode(),
            "hardware.toml": (REPO / "hardware_profiles" / "h100-sxm.toml").read_bytes(),
            "ds.json": (REPO / "examples" / "ds_config_zero2_offload.json").read_bytes(),
            "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 512,
                                       "intermediate_size": 1408, "num_hidden_layers": 4,
                                       "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 32000,
                                       "max_position_embeddings": 2048}).encode(),
            "microbench.json": (REPO / "validation" / "microbench" / "h100-extra.json").read_bytes(),
            "nsys.csv": b"Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
                        b"60.0,6000,3,2000,2000,1000,3000,100,ampere_sgemm\n40.0,4000,2,2000,2000,2000,2000,0,elem\n",
        }
        kineto = folder / "k.json"
        write_kineto(kineto, steps=2, kernels_per_step=6, cpu_events_per_kernel=1)
        self.templates["trace.json"] = kineto.read_bytes()
        predicted = folder / "predicted.json"
        CliRunner().invoke(main, ["simulate", "--model", str(self.model), "--seq", "512", "--trace", str(predicted)])
        self.templates["predicted.json"] = predicted.read_bytes()
        self.templates["overlay.toml"] = OVERLAY_TOML.encode()
        self.n = 0

    def damaged(self, rng: random.Random, name: str) -> str:
        self.n += 1
        path = self.folder / f"{self.n}-{name}"
        data = self.templates[name]
        path.write_bytes(damage(rng, data) if rng.random() < 0.85 else data)
        return str(path)


# -- one case per command ------------------------------------------------------------------------

def simulate_case(rng: random.Random, files: Files) -> list[str]:
    args = ["simulate", "--model", str(files.model)]
    if rng.random() < 0.3:
        args[2] = files.damaged(rng, rng.choice(["model.toml", "config.json"]))
    if rng.random() < 0.2:
        args += ["--hardware", files.damaged(rng, "hardware.toml")]
    elif rng.random() < 0.5:
        args += ["--hardware", rng.choice(HARDWARE)]
    if rng.random() < 0.15:
        args += ["--plan", files.damaged(rng, "plan.toml")]
    if rng.random() < 0.15:
        args += ["--deepspeed", files.damaged(rng, "ds.json")]
    if rng.random() < 0.15:
        args += ["--calibration", files.damaged(rng, "overlay.toml")]
    return args + plan_flags(rng) + (["--json"] if rng.random() < 0.5 else [])


def plan_case(rng: random.Random, files: Files) -> list[str]:
    args = ["plan", "--model", str(files.model), "--seq", "1024", "--jobs", "1", "--precisions", "bf16",
            "--recompute", "full", "--time-limit", rng.choice(["0.3", "0.5", number(rng)])]
    for flag in ("--price", "--top", "--objective"):
        if rng.random() < 0.3:
            args += [flag, number(rng) if flag != "--objective" else rng.choice(["time", "cost", "memory", "x", ""])]
    if rng.random() < 0.15:
        args += ["--calibration", files.damaged(rng, "microbench.json")]
    if rng.random() < 0.15:
        args += ["--plan", files.damaged(rng, "plan.toml")]
    return args + plan_flags(rng, 0.6)[:4] + (["--json"] if rng.random() < 0.5 else [])


def compare_case(rng: random.Random, files: Files) -> list[str]:
    args = ["compare", "--model", str(files.model)]
    for _ in range(rng.randint(1, 3)):
        args += ["--hardware", rng.choice(HARDWARE)]
    if rng.random() < 0.2:
        args += ["--best", "--time-limit", rng.choice(["0.3", number(rng)]), "--precision", "bf16",
                 "--recompute", "full", "--seq", "1024"]
    return args + plan_flags(rng) + (["--json"] if rng.random() < 0.5 else [])


def trace_command_case(rng: random.Random, files: Files) -> list[str]:
    steps = rng.choice(["10-12", "3", "5-2", "-1", "a-b", "", "1-99999999999999999999", "nan"])
    return ["trace", "command", "--model", str(files.model), "--steps", steps,
            "--startup-s", rng.choice(["60", number(rng)])] + plan_flags(rng)


def summarize_case(rng: random.Random, files: Files) -> list[str]:
    path = files.damaged(rng, rng.choice(["trace.json", "nsys.csv"]))
    args = ["trace", "summarize", path]
    if rng.random() < 0.3:
        args += ["--steps", rng.choice(["1-2", "all", "2", "x", "3-1", "-5", str(10**30)])]
    if rng.random() < 0.2:
        args += ["--top", number(rng)]
    if rng.random() < 0.2:
        args += ["--device", number(rng)]
    return args + (["--json"] if rng.random() < 0.5 else [])


def trace_compare_case(rng: random.Random, files: Files) -> list[str]:
    args = ["trace", "compare", files.damaged(rng, "predicted.json"),
            files.damaged(rng, rng.choice(["trace.json", "trace.json", "nsys.csv", "predicted.json"]))]
    if rng.random() < 0.3:
        args += ["--steps", rng.choice(["1-2", "all", "2", "x", "3-1", str(10**30)])]
    for flag in ("--step-time", "--top", "--device"):
        if rng.random() < 0.2:
            args += [flag, number(rng)]
    return args + (["--json"] if rng.random() < 0.5 else [])


def calibrate_case(rng: random.Random, files: Files) -> list[str]:
    out = files.folder / "cal-out"
    if rng.random() < 0.4:  # a run's trace, to fit an overlay on
        steps = ["--steps", rng.choice(["1-2", "2", "x", "3-1", str(10**30)])] if rng.random() < 0.3 else []
        return ["calibrate", "--trace", files.damaged(rng, "trace.json"), "--model", str(files.model),
                "--hardware", rng.choice(HARDWARE), "--out", str(out / "o.toml"), *steps] + plan_flags(rng)
    return ["calibrate", files.damaged(rng, "microbench.json"), "--reference", rng.choice(HARDWARE),
            "--out-dir", str(out)]


def sweep_case(rng: random.Random, files: Files) -> list[str]:
    models = rng.choice([str(files.model), f"{files.model},nope", "nope", ",", ""])
    gpus = rng.choice(["1", "1,2", "0", "-1", "x", "nan", str(10**30), ",", ""])
    args = ["sweep", "--models", models, "--gpus", gpus, "--hardware", rng.choice(["h100-sxm", "nope", ""]),
            "--seq", rng.choice(["1024", number(rng)]), "--jobs", "1", "--precisions", "bf16",
            "--pin", rng.choice(["recompute=full", "recompute=banana", "zero", "=", "zero=9", "gpus=nan"])]
    if rng.random() < 0.2:
        args += ["--scheduler", rng.choice(["banana", "tcp://", ":1", "host:0", "x:y"])]
    return args


def catalog_case(rng: random.Random, files: Files) -> list[str]:
    return rng.choice([["models"], ["hardware"], [], ["--version"], ["nosuch"], ["simulate"],
                       ["validate", str(files.folder / "nowhere")], ["validate", "--case", "x", rng.choice(JUNK) or "x"],
                       ["validate", "--explain", "--no-trace"], ["validate", "--explain", str(files.folder / "nowhere")],
                       ["trace"], ["calibrate"], ["simulate", "--model"]])


COMMANDS: dict[str, Callable[[random.Random, Files], list[str]]] = {
    "simulate": simulate_case, "plan": plan_case, "compare": compare_case, "trace command": trace_command_case,
    "trace summarize": summarize_case, "trace compare": trace_compare_case, "calibrate": calibrate_case, "sweep": sweep_case, "catalog": catalog_case,
}


# -- the promise -----------------------------------------------------------------------------------

NON_FINITE = re.compile(r"(?<![\w-])-?(nan|inf|infinity)(?![\w-])", re.I)


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def _finite_json(text: str) -> None:
    def refuse(token: str):
        raise ValueError(token)
    json.loads(text, parse_constant=refuse)


def violation(args: list[str]) -> str | None:
    """What breaks the promise for this command line, or None."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        r = CliRunner().invoke(main, args, catch_exceptions=True)
    except Hang:
        return "hang"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    if isinstance(r.exception, Hang):
        return "hang"
    if r.exit_code not in (0, 2):
        exc = r.exception if not isinstance(r.exception, SystemExit) else None
        return f"exit {r.exit_code}" + (f": {type(exc).__name__}: {str(exc)[:120]}" if exc else "")
    err = r.stderr.strip()
    if "Traceback" in err:
        return "traceback on stderr"
    if r.exit_code == 2:
        errors = [line for line in err.splitlines() if not line.startswith("ghsim: note:")]
        if len(errors) != 1:
            return f"{len(errors)} error lines: {err[:200]!r}"
        for leak in ("object has no attribute", "ConversionSyntax", "InvalidOperation", "KeyError", "Errno",
                     "<class "):
            if leak in errors[0]:
                return f"Python internals in the message: {errors[0][:200]}"
    if r.exit_code == 0 and NON_FINITE.search(r.stdout):  # silently accepted: "step time nan ms"
        return f"non-finite number printed: {NON_FINITE.search(r.stdout).group(0)!r}"
    if r.exit_code == 0 and "--json" in args:
        try:
            _finite_json(r.stdout)
        except ValueError as e:
            return f"invalid JSON: {str(e)[:80]}"
    return None


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Files:
    return Files(tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize("command", list(COMMANDS))
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False))
def test_hostile_input_keeps_the_promise(files, command, rng):
    args = COMMANDS[command](rng, files)
    problem = violation(args)
    assert problem is None, f"ghsim {' '.join(args)}: {problem}"


def count(per_command: int, seed: int = 0) -> dict[str, dict]:
    """Run per_command random cases of each command; violations by command and kind."""
    with tempfile.TemporaryDirectory() as tmp:
        files = Files(Path(tmp))
        out: dict[str, dict] = {}
        for name, make in COMMANDS.items():
            rng = random.Random(f"{seed}-{name}")
            found: dict[str, list[str]] = {}
            for _ in range(per_command):
                args = make(rng, files)
                problem = violation(args)
                if problem:
                    key = problem.split(":")[0] + (":" + problem.split(":")[1] if problem.startswith("exit") and ":" in problem else "")
                    found.setdefault(key, []).append(" ".join(args)[:300] + " -> " + problem[:200])
            out[name] = {"cases": per_command, "violations": sum(len(v) for v in found.values()),
                         "kinds": {k: {"n": len(v), "example": v[0]} for k, v in found.items()}}
    return out


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    result = count(n)
    print(json.dumps(result, indent=1))
    print("total cases", n * len(COMMANDS), "violations", sum(v["violations"] for v in result.values()))
