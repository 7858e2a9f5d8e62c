"""How to profile exactly the steps that matter: the nsys command line and the
PyTorch profiler schedule for a window of steps, timed from the predicted step."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ghsim.errors import GhsimError
from ghsim.traces.summary import parse_steps


@dataclass(frozen=True)
class CaptureWindow:
    first_step: int  # 0-based step index where capture starts
    last_step: int
    step_time_s: float
    startup_s: float  # process start to the first step (model build, data, compile)

    @property
    def delay_s(self) -> float:
        """Seconds from launch to the first captured step, less one step of margin."""
        return self.startup_s + max(self.first_step - 1, 0) * self.step_time_s

    @property
    def duration_s(self) -> float:
        """Captured steps plus one step of margin on each side."""
        return (self.last_step - self.first_step + 3) * self.step_time_s


def capture_window(steps: str, step_time_s: float, startup_s: float) -> CaptureWindow:
    first, last = parse_steps(steps)  # (it refuses negative steps and reversed ranges)
    if startup_s < 0:
        raise GhsimError("--startup-s must not be negative")
    return CaptureWindow(first, last, step_time_s, startup_s)


def nsys_command(w: CaptureWindow, output: str, program: str) -> str:
    delay = math.floor(w.delay_s)
    duration = max(1, math.ceil(w.duration_s + (w.delay_s - delay)))
    return (f"nsys profile --trace=cuda,nvtx,cublas,cudnn,osrt --cuda-memory-usage=true "
            f"--cuda-um-gpu-page-faults=true --cuda-um-cpu-page-faults=true "
            f"--delay={delay} --duration={duration} --output={output} --force-overwrite=true {program}")


def nsys_range_command(output: str, program: str) -> str:
    """The exact alternative: capture between torch.cuda.profiler.start() and stop()."""
    return (f"nsys profile --trace=cuda,nvtx,cublas,cudnn,osrt --capture-range=cudaProfilerApi "
            f"--capture-range-end=stop --output={output} --force-overwrite=true {program}")


def torch_profiler_snippet(w: CaptureWindow, output: str) -> str:
    """A torch.profiler schedule whose active steps are exactly the window (prof.step() once per step)."""
    warmup = 1 if w.first_step >= 1 else 0
    wait = w.first_step - warmup
    active = w.last_step - w.first_step + 1
    return "\n".join([
        "from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler",
        f"sched = schedule(wait={wait}, warmup={warmup}, active={active}, repeat=1)",
        "with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=sched,",
        f"             on_trace_ready=tensorboard_trace_handler('{output}'), profile_memory=True) as prof:",
        "    for step, batch in enumerate(loader):",
        f"        if step == {w.first_step}: torch.cuda.profiler.start()   # for nsys --capture-range=cudaProfilerApi",
        "        train_step(batch)",
        f"        if step == {w.last_step}: torch.cuda.profiler.stop()",
        "        prof.step()",
    ])
