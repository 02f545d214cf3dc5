"""Every fast path chooses its kernel by the device's compute capability, with the portable fallback on
anything the table does not know (issue #33, target 4): sm80, sm90, sm100, an unknown architecture, a CPU."""

from __future__ import annotations

import pytest

from trainer.speed import capability

SM80, SM90, SM100, SM103 = (8, 0), (9, 0), (10, 0), (10, 3)
UNKNOWN = [(12, 1), (11, 0), (7, 5), (13, 0)]


def test_hopper_runs_the_measured_kernels():
    plan = capability.plan(SM90, frozenset(), detect=False)
    assert {p: c.kernel for p, c in plan.items()} == {
        "fused_lora": "triton", "siglip_attention": "cudnn", "lm_attention": "cudnn_gqa"}
    assert capability.choose("siglip_attention", SM90, {"fa4"}).kernel == "fa4"


@pytest.mark.parametrize("cap", [SM100, SM103])
def test_blackwell_gets_kernels_that_build_for_it(cap):
    plan = capability.plan(cap, frozenset(), detect=False)
    assert plan["lm_attention"].kernel == "cudnn_gqa"  # cuDNN picks its Blackwell kernels itself
    assert plan["siglip_attention"].kernel == "cudnn"
    assert capability.choose("siglip_attention", cap, {"fa4"}).kernel == "fa4"  # FA4 builds for sm100
    assert plan["fused_lora"].kernel == "triton"


def test_ampere_takes_no_hopper_only_path():
    plan = capability.plan(SM80, frozenset({"fa4"}), detect=False)
    assert plan["siglip_attention"].kernel == "sdpa"  # FA4 has no sm80 build worth taking; SDPA's order
    assert plan["lm_attention"].kernel == "sdpa"
    assert plan["fused_lora"].kernel == "triton"


@pytest.mark.parametrize("cap", UNKNOWN)
def test_an_unknown_architecture_gets_every_fallback(cap):
    plan = capability.plan(cap, frozenset({"fa4"}), detect=False)
    assert all(c.fallback for c in plan.values()), plan
    assert {c.kernel for c in plan.values()} == set(capability.FALLBACK.values())
    assert all(capability.arch(cap) in c.reason for c in plan.values())


def test_a_cpu_gets_every_fallback():
    plan = capability.plan(None, frozenset({"fa4"}), detect=False)
    assert all(c.fallback and c.reason == "no GPU" for c in plan.values())


def test_an_unknown_path_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown fast path 'flash'"):
        capability.choose("flash", SM90)


def test_every_proven_pair_is_a_choice_the_table_can_make():
    for (path, kernel), archs in capability.PROVEN.items():
        assert path in capability.PATHS
        made = {capability.choose(path, cap, {"fa4"}).kernel for cap in capability.KNOWN}
        made |= {capability.choose(path, cap, set()).kernel for cap in capability.KNOWN}
        assert kernel in made, (path, kernel)
        assert all(a.startswith("sm") for a in archs)


def test_detection_on_this_machine_has_no_gpu():
    # the CI machine has no GPU: detection says so, and the plan is the fallback one
    assert capability.device_capability() is None
    assert all(c.fallback for c in capability.plan().values())
