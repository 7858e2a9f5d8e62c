"""ds_config.json -> plan fields: what `ghsim plan --deepspeed` and `simulate --deepspeed` read."""

from __future__ import annotations

import json

import pytest

from ghsim.deepspeed import plan_dict_from_ds_config
from ghsim.errors import GhsimError
from ghsim.plan import plan_from_dict


def ds(tmp_path, config) -> dict:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config) if not isinstance(config, str) else config)
    return plan_dict_from_ds_config(path)


def test_zero_offload_config(tmp_path):
    d = ds(tmp_path, {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
                      "bf16": {"enabled": True},
                      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True,
                                                                              "ratio": 0.3}}})
    plan = plan_from_dict({**d, "gpus": 4})
    assert plan.zero == 2 and plan.precision.value == "bf16" and plan.framework.value == "deepspeed"
    assert plan.offload == {"optimizer", "grads"} and plan.offload_ratio == 0.3 and plan.offload_pinned
    assert plan.micro_batch == 2 and plan.resolved_global_batch == 2 * 4 * 4 and plan.grad_accum == 4


def test_zero3_param_offload_and_fp16(tmp_path):
    d = ds(tmp_path, {"fp16": {"enabled": "auto"}, "train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
                      "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                            "offload_optimizer": {"device": "cpu"}}})
    assert d["precision"] == "fp16" and d["zero"] == 3 and set(d["offload"]) == {"optimizer", "grads", "params"}
    assert d["global_batch"] == 64 and d["offload_pinned"] is True  # DeepSpeed 0.19.8 pin_memory default


def test_accumulation_without_gpus_resolves_against_the_plan(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8}))
    d = plan_dict_from_ds_config(path)
    assert d["grad_accum"] == 8
    assert plan_from_dict({**d, "gpus": 2}).resolved_global_batch == 16
    # data-parallel ranks, not GPUs: with tp 2 on 8 GPUs, 4 ranks x 1 x 8 accumulation steps
    tp = plan_from_dict({**d, "gpus": 8, "tp": 2})
    assert tp.grad_accum == 8 and tp.resolved_global_batch == 32


@pytest.mark.parametrize("config,message", [
    ("[1, 2]", "must be a JSON object"),
    ("{not json", "malformed JSON"),
    ({"zero_optimization": {"stage": "three"}}, "zero_optimization.stage must be 0-3"),
    ({"zero_optimization": {"stage": True}}, "zero_optimization.stage must be 0-3"),
    ({"zero_optimization": {"offload_optimizer": "cpu"}}, "offload_optimizer must be an object"),
    ({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}}, "device must be cpu, nvme or none"),
    ({"zero_optimization": {"offload_param": {"device": "nvme"}}}, "NVMe offload"),
    ({"bf16": True}, "bf16 must be an object"),
    ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "cannot both be enabled"),
    ({"train_micro_batch_size_per_gpu": 0}, "positive integer"),
    ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
     "is not train_micro_batch_size_per_gpu"),
])
def test_malformed_configs_are_one_line_errors(tmp_path, config, message):
    with pytest.raises(GhsimError, match=message) as e:
        ds(tmp_path, config)
    assert "\n" not in str(e.value) and "ds_config.json" in str(e.value)
