"""Every check of the fake raises what the real FlashInfer raises (type and message)."""

from __future__ import annotations

import inspect

import pytest

from a2a_programs import trigger
from fakes.flashinfer import set_profile
from testbed.cluster.layout import ParallelLayout

CASES = [
    ("seed001_overflow", "0.7.2", "RuntimeError", "workspace insufficient for combine payload region"),
    ("seed001_overflow", "0.6.8", "RuntimeError", "workspace insufficient for combine payload region"),
    ("dispatch_twice", "0.7.2", "AssertionError", "dispatch called twice without combine"),
    ("combine_before_dispatch", "0.7.2", "AssertionError", "combine called before successful dispatch"),
    ("rtm_exceeds_max", "0.7.2", "AssertionError", "runtime_max_tokens_per_rank exceeds max_num_tokens"),
    # stricter than the kernel, which returns garbage: every rank refuses, naming each value
    ("rtm_differs", "0.7.2", "RuntimeError", "passed different runtime_max_tokens_per_rank (rank 0: 2, rank 1: 3)"),
    ("rtm_differs", "0.6.8", "RuntimeError", "passed different runtime_max_tokens_per_rank (rank 0: 2, rank 1: 3)"),
    ("rtm_differs_at_combine", "0.7.2", "RuntimeError", "combine: the ranks of this round passed different "
                                                        "runtime_max_tokens_per_rank (rank 0: 3, rank 1: 4)"),
    ("ids_int64", "0.7.2", "RuntimeError", "token_selected_experts must be int32"),
    ("ids_wrong_top_k", "0.7.2", "RuntimeError", "token_selected_experts shape mismatch"),
    ("five_payloads", "0.6.8", "RuntimeError", "Too many payloads: 5 > 4"),
    ("misaligned_payloads", "0.7.2", "RuntimeError",
     "Misaligned payload buffer 1 with element size 4. Consider reordering payloads by largest to smallest element size"),
    ("experts_not_divisible", "0.6.8", "RuntimeError", "num_experts must be divisible by ep_size"),
    ("workspace_too_small", "0.7.2", "RuntimeError", "workspace size per rank insufficient, need 1408 bytes but has 1300"),
    ("output_not_contiguous", "0.7.2", "ValueError", "output must be contiguous"),
    ("payload_not_in_workspace", "0.7.2", "RuntimeError", "payload_in_workspace is True but tensor pointer mismatch"),
    ("ids_out_of_range", "0.7.2", "RuntimeError", "outside [0, 4)"),
    ("tokens_exceed_rtm", "0.7.2", "RuntimeError", "local_num_tokens (3) exceeds runtime_max_tokens_per_rank (2)"),
    ("top_k_zero", "0.7.2", "ValueError", "top_k must be a positive int"),
    # SWITCH_TOP_K: 3 in no release, 12 only from 0.6.16
    ("top_k_3", "0.6.8", "RuntimeError", "Error in function 'moe_a2a_dispatch_launch' at "),
    ("top_k_3", "0.7.2", "RuntimeError", ": Unsupported top_k"),
    ("top_k_12", "0.6.14", "RuntimeError", "Unsupported top_k"),
    ("rank_mask_not_enabled", "0.7.2", "ValueError", "active_rank_mask requires the instance"),
    ("combine_fp8_payload", "0.6.8", "TypeError", "Unsupported dtype for MoE combine"),
]
# What the real kernels accept, which the fake must not refuse.
ACCEPTED = [("padded_row_minus_one", "0.7.2"), ("padded_row_minus_one", "0.6.8"), ("combine_fp8_payload", "0.6.14"), ("combine_low_precision_fp32", "0.7.2"),
            ("combine_low_precision_fp32", "0.6.16")]


@pytest.mark.parametrize("what, profile, kind, text", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_fake_a2a_check_raises_like_real(cluster, what, profile, kind, text):
    results = cluster.run(trigger, ParallelLayout(2, dp=2), (what, profile), timeout_s=60)
    for rank, got in enumerate(results):
        assert got is not None, f"rank {rank}: {what} raised nothing"
        assert got[0] == kind and text in got[1], (rank, got)


@pytest.mark.parametrize("profile", ["0.6.16", "0.7.2"])
def test_fake_a2a_top_k_12_runs_from_0_6_16(cluster, profile):
    assert cluster.run(trigger, ParallelLayout(2, dp=2), ("top_k_12", profile), timeout_s=60) == [None, None]


def test_fake_a2a_check_message_form_of_cpp_checks(cluster):
    (kind, msg), _ = cluster.run(trigger, ParallelLayout(2, dp=2), ("ids_int64",), timeout_s=60)
    assert msg.startswith("Check failed: (")  # TVM_FFI_ICHECK's form


def test_fake_a2a_trap_is_permanent_for_the_process(cluster):
    """The real kernel traps when a wait runs out and the CUDA context is dead: catching the
    error and carrying on must not work; the next scenario (a new process) is clean."""
    results = cluster.run(trigger, ParallelLayout(2, dp=2), ("dispatch_after_trap",), timeout_s=60)
    kind, msg = results[0]
    assert kind == "RuntimeError" and msg.startswith("CUDA error: unspecified launch failure (a kernel trapped "
                                                     "earlier: dispatch: rank 0 timed out")
    assert results[1] is None
    assert cluster.run(trigger, ParallelLayout(2, dp=2), ("top_k_12", "0.7.2"), timeout_s=60) == [None, None]


def test_fake_a2a_completion_wait_names_missing_peer(cluster):
    results = cluster.run(trigger, ParallelLayout(2, dp=2), ("peer_never_dispatches",), timeout_s=60)
    kind, msg = results[0]
    assert kind == "CompletionTimeout"
    assert "dispatch: rank 0 timed out" in msg and "from rank(s) [1]" in msg
    assert results[1] is None


def test_fake_a2a_non_divisible_experts_allowed_from_0_6_16(cluster):
    assert cluster.run(trigger, ParallelLayout(2, dp=2), ("experts_not_divisible", "0.6.16")) == [None, None]
    assert cluster.run(trigger, ParallelLayout(2, dp=2), ("five_payloads", "0.7.2")) == [None, None]


def _params(fn):
    return list(inspect.signature(fn).parameters)


def test_fake_profiles_signatures_follow_the_release_table():
    import fakes.flashinfer.comm.trtllm_moe_alltoall as m

    seen = {}
    for name in ("0.6.8", "0.6.14", "0.6.16", "0.7.2"):
        set_profile(name)
        seen[name] = (_params(m.MoeAlltoAll.combine), _params(m.MoeAlltoAll.__init__),
                      _params(m.moe_a2a_dispatch), m.MoeAlltoAll.__name__)
    set_profile("0.7.2")
    assert seen["0.6.8"][0] == ["self", "payload", "runtime_max_tokens_per_rank", "payload_in_workspace"]
    assert seen["0.6.14"][0][4:] == ["output_dtype", "output_scales", "output_scalar_scale", "sf_layout"]
    assert "output" in seen["0.6.16"][0] and "output" not in seen["0.6.14"][0]
    combine = inspect.signature(m._BY_PROFILE["0.6.16"]["MoeAlltoAll"].combine).parameters
    assert combine["use_low_precision"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "eplb_stats_num_experts" in seen["0.6.16"][1] and "eplb_stats_num_experts" not in seen["0.6.14"][1]
    assert "backend" in seen["0.7.2"][1] and "backend" not in seen["0.6.16"][1]
    assert "eplb_local_stats" in seen["0.6.16"][2] and "eplb_local_stats" not in seen["0.6.8"][2]
    assert {s[3] for s in seen.values()} == {"MoeAlltoAll"}


def test_fake_profiles_custom_combine_signature():
    import fakes.flashinfer.comm.trtllm_moe_alltoall as m

    def combine(self, **kwargs):
        return self._combine(kwargs["payload"], kwargs["runtime_max_tokens_per_rank"])

    cls = m.custom_moe_alltoall(combine, base="0.7.2")
    assert _params(cls.combine) == ["self", "kwargs"]
    assert issubclass(cls, m._BY_PROFILE["0.7.2"]["MoeAlltoAll"])


def test_fake_profiles_unknown_name():
    with pytest.raises(ValueError, match="FlashInfer release '0.5.0' is not served by the fake: it serves 0.6.3, 0.6.4, "):
        set_profile("0.5.0")


def test_fake_a2a_metainfo_offsets_spec_example():
    from fakes.flashinfer.comm.moe_a2a_kernels import metainfo_offsets

    # ep 8, 10 tokens, kMaxTopK 22, no EPLB: worked by hand from calculateOffsets (aux = 2176)
    assert metainfo_offsets(8, 10, 0, 22) == [0, 4, 8, 40, 128, 256, 384, 1280, 2176, 2176]
    # with 5 EPLB experts the stats take 8 * 5 * 4 = 160 bytes at 2176
    assert metainfo_offsets(8, 10, 5, 22)[-2:] == [2176, 2432]


@pytest.mark.parametrize("what, profile", ACCEPTED, ids=[f"{w}-{p}" for w, p in ACCEPTED])
def test_fake_a2a_accepts_what_real_accepts(cluster, what, profile):
    assert cluster.run(trigger, ParallelLayout(2, dp=2), (what, profile), timeout_s=60) == [None, None]
