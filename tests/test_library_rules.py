"""Plans the named library would not run are refused with its reason and never proposed by the
search (issue 14): DeepSpeed builds SuperOffload only at ZeRO-3, and its pipeline engine refuses
ZeRO-2/3."""

import pytest
from click.testing import CliRunner

from ghsim.cli import main
from ghsim.graph.offload.setup import library_refusal
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, OffloadSchedule, Plan
from ghsim.search.space import default_space, groups

DS = Framework.DEEPSPEED


@pytest.mark.parametrize("plan, runs", [
    (Plan(framework=DS, offload=frozenset({"optimizer"}), offload_schedule=OffloadSchedule.SUPEROFFLOAD), False),
    (Plan(framework=DS, zero=3, offload=frozenset({"optimizer"}), offload_schedule=OffloadSchedule.SUPEROFFLOAD), True),
    (Plan(framework=DS, gpus=4, pp=2, zero=2), False),
    (Plan(framework=DS, gpus=4, pp=2, zero=1), True),
    (Plan(framework=Framework.MEGATRON, gpus=4, pp=2, zero=2), True),  # Megatron's distributed optimizer
])
def test_deepspeed_rules(plan, runs):
    assert (library_refusal(plan) is None) == runs


def test_the_commands_refuse_them_in_one_line():
    res = CliRunner().invoke(main, ["simulate", "--model", "llama-2-7b", "--framework", "deepspeed", "--gpus", "2",
                                    "--pp", "2", "--zero", "2"])
    assert res.exit_code == 2 and "incompatible with pipeline parallelism" in res.output
    assert "Traceback" not in res.output


def test_the_search_never_proposes_them():
    model, hw = load_model("llama-3-70b"), load_hardware("gh200-96gb-quad")
    base = Plan(gpus=4, framework=DS, global_batch=32)
    for g in groups(default_space(model, hw, base), base):
        assert library_refusal(g.base) is None, g.base.flags()
