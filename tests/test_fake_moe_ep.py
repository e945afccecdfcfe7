"""FlashInfer 0.7.4's ``moe_ep`` as the fake imitates it: the workspace layout of its own
kernels, its checks (type and message), its shared workspaces, and the modules it removed."""

from __future__ import annotations

import importlib

import pytest
import torch

from a2a_programs import rank_mask_beyond_64, trigger_moe_ep
from fakes.flashinfer import install, profiles
from testbed.cluster.layout import ParallelLayout

CASES = [
    ("runtime_over_capacity", "ValueError", "runtime_max_tokens_per_rank=5 must be in (0, 4]"),
    ("old_keyword", "TypeError", "max_tokens_per_rank"),
    ("rtm_differs", "RuntimeError", "dispatch: the ranks of this round passed different runtime_max_tokens_per_rank "
                                    "(rank 0: 2, rank 1: 3)"),
    ("top_k_5", "ValueError", "NVLinkOneSidedAlltoAll supports top_k in (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 18, 22), got 5"),
    ("experts_not_divisible", "ValueError", "requires num_experts (5) divisible by the EP size (2)"),
    ("lamport_and_cft", "ValueError", "lamport=True and cft=True both ask for every eligible step"),
    ("timeout_not_int", "TypeError", "timeout_sec must be an integer number of seconds"),
    ("interleaved_rounds", "RuntimeError", "another NVLinkOneSidedAlltoAll sharing this workspace has a dispatch "
                                           "awaiting its combine"),
    ("after_destroy", "RuntimeError", "NVLinkOneSidedAlltoAll has been destroyed"),
    ("unaligned_payload", "RuntimeError", "payload must be 16-byte aligned"),
    # 2 ranks x 4 tokens x 16 values: 256 bytes of bf16, 1024 of float64
    ("combine_region_overflow", "ValueError", "a torch.float64 combine input needs 1024 bytes, more than the "
                                              "256-byte combine region"),
    ("output_not_contiguous", "RuntimeError", "Check failed: (output.IsContiguous()) is false: output must be contiguous"),
    ("stats_not_contiguous", "RuntimeError", "Check failed: (stats.IsContiguous()) is false: stats must be contiguous"),
    ("mask_int64", "RuntimeError", "Check failed: t.dtype() == dl_uint64 (int64 vs. uint64): Inconsistency of Tensor "
                                   "type: t"),
    ("dispatch_while_checkpointed", "RuntimeError", "CUDA error: an illegal memory access was encountered"),
]


@pytest.mark.parametrize("what, kind, text", CASES, ids=[c[0] for c in CASES])
def test_moe_ep_0_7_4_check_raises_like_real(cluster, what, kind, text):
    results = cluster.run(trigger_moe_ep, ParallelLayout(2, dp=2), (what,), timeout_s=60)
    for rank, got in enumerate(results):
        assert got is not None, f"rank {rank}: {what} raised nothing"
        assert got[0] == kind and text in got[1], (rank, got)


def test_moe_ep_0_7_4_routes_ids_outside_the_experts_nowhere(cluster):
    """0.7.4's dispatch kernel gives a lane whose id is outside [0, num_experts) no destination
    (earlier kernels do not check, and the fake refuses such ids there)."""
    assert cluster.run(trigger_moe_ep, ParallelLayout(2, dp=2), ("invalid_ids_route_nowhere",),
                       timeout_s=60) == [None, None]


def test_moe_ep_0_7_4_layout_constants_carry_the_lamport_limits():
    from fakes.flashinfer.moe_ep.one_sided_ops import layout_constants

    c = layout_constants()
    assert (c.MAX_RANKS, c.MAX_TOP_K, c.MAX_PAYLOADS, c.NUM_METAINFO_FIELDS) == (256, 22, 4, 33)
    assert (c.LAMPORT_MAX_RANKS, c.LAMPORT_MAX_TOKENS_PER_RANK, c.LAMPORT_IDS_SENTINEL & 0xFFFFFFFF) == \
        (64, 512, 0x88888888)
    assert c.COMBINE_INPUT_OFFSET_INDEX == 15 and c.WORKSPACE_SIZE_INDEX == 24


def test_moe_ep_0_7_4_runs_top_k_3_which_older_kernels_refuse(cluster):
    assert cluster.run(trigger_moe_ep, ParallelLayout(2, dp=2), ("top_k_3",), timeout_s=60) == [None, None]
    assert 3 in profiles.PROFILES["0.7.4"].top_k_kernels
    assert all(3 not in p.top_k_kernels for name, p in profiles.PROFILES.items() if name != "0.7.4")


def test_moe_ep_0_7_4_trap_is_permanent_for_the_process(cluster):
    """A wait past ``timeout_sec`` traps the real kernel: the next call must fail too."""
    kind, msg = cluster.run(trigger_moe_ep, ParallelLayout(2, dp=2), ("dispatch_after_trap",), timeout_s=60)[0]
    assert kind == "RuntimeError" and "a kernel trapped earlier: dispatch: rank 0 timed out after 1 s" in msg


def test_moe_ep_0_7_4_workspace_layout_by_hand():
    """``calculateWorkspaceLayout`` for ep 8, 10 tokens, top_k 2, 1000 dispatch and 2000 combine
    bytes, no EPLB, no CFT, worked by hand from nvlink_one_sided_alltoall.cu: 4-byte fields
    packed, the flags and routing tables on 128-byte lines, payload regions on 256 bytes and
    their capacities rounded up to 256."""
    from fakes.flashinfer.moe_ep.one_sided_ops import METAINFO_FIELDS, workspace_layout

    got = dict(zip(METAINFO_FIELDS, workspace_layout(8, 10, 2, 1000, 2000, 0, 0, False)))
    want = {"FLAG_VAL": 0, "LOCAL_TOKEN_COUNTER": 4, "SEND_COUNTERS": 8, "RECV_COUNTERS": 40,
            "DISPATCH_COMPLETION_FLAGS": 128, "TOPK_TARGET_RANKS": 256, "TOPK_TARGET_INDICES": 384,
            "EPLB_GATHERED_STATS": 512, "DISPATCH_PAYLOAD": 512, "DISPATCH_PAYLOAD_SIZE_INDEX": 1024,
            "COMBINE_COMPLETION_FLAGS": 1536, "COMBINE_INPUT": 1792, "COMBINE_INPUT_SIZE_INDEX": 2048,
            "MAX_NUM_TOKENS_INDEX": 10, "TOP_K_INDEX": 2, "EP_SIZE_INDEX": 8, "WORKSPACE_SIZE_INDEX": 3840}
    assert {k: got[k] for k in want} == want
    assert all(v == 0 for k, v in got.items() if k not in want)  # CFT and Lamport regions absent
    assert len(METAINFO_FIELDS) == 33


def test_moe_ep_0_7_4_layout_refuses_like_real():
    from fakes.flashinfer.moe_ep.one_sided_ops import workspace_layout

    with pytest.raises(RuntimeError, match=r"Invalid EP size: 257"):
        workspace_layout(257, 10, 2, 1000, 2000, 0, 0, False)
    with pytest.raises(RuntimeError, match=r"Invalid top_k: 23"):
        workspace_layout(8, 10, 23, 1000, 2000, 0, 0, False)
    with pytest.raises(RuntimeError, match=r"A combine receive payload requires CFT support"):
        workspace_layout(8, 10, 2, 1000, 2000, 64, 0, False)


def test_moe_ep_0_7_4_removed_modules_refuse_through_both_names():
    with install("0.7.4"):
        for gone in ("flashinfer.comm.trtllm_moe_alltoall", "flashinfer.comm.trtllm_alltoall"):
            with pytest.raises(ModuleNotFoundError, match=gone):
                importlib.import_module(gone)
        from flashinfer.moe_ep import NVLinkOneSidedAlltoAll, NVLinkOneSidedConfig  # noqa: F401

        assert "MoeAlltoAll" not in dir(importlib.import_module("flashinfer.comm"))
        assert NVLinkOneSidedConfig().timeout_sec == 300
    with profiles.fake_profile("0.7.4"):
        from fakes.flashinfer.comm import trtllm_alltoall, trtllm_moe_alltoall

        for module, name in ((trtllm_moe_alltoall, "MoeAlltoAll"), (trtllm_alltoall, "MnnvlMoe")):
            with pytest.raises(AttributeError, match="flashinfer 0.7.4 does not ship"):
                getattr(module, name)
    with profiles.fake_profile("0.6.16"), pytest.raises(AttributeError, match="does not ship flashinfer.moe_ep"):
        from fakes.flashinfer import moe_ep

        moe_ep.NVLinkOneSidedAlltoAll  # noqa: B018


def test_moe_ep_active_rank_mask_has_0_7_4_words():
    with profiles.fake_profile("0.7.4"):
        from fakes.flashinfer.moe_ep import NVLinkOneSidedAlltoAll

        fake = NVLinkOneSidedAlltoAll.__new__(NVLinkOneSidedAlltoAll)
        fake.ep_size = 130
        from fakes.flashinfer.moe_ep.one_sided_ops import layout_constants

        fake._index = layout_constants()
        mask = fake.active_rank_mask([0, 129])
        assert mask.dtype == torch.uint64 and mask.shape == (4,)
        assert mask.view(torch.int64).tolist() == [1, 0, 0b10, 0]  # rank 129: word 2, bit 1


def test_moe_ep_0_7_4_rank_mask_second_word_at_66_ranks(cluster):
    """0.7.4's kernels take 256 ranks and 4-word masks: at 66 EP ranks rank 65 (bit 1 of the
    second word) is masked off, and every live token's combine sums exactly its live targets."""
    results = cluster.run(rank_mask_beyond_64, ParallelLayout(66, dp=66), (65,), timeout_s=120)
    assert results[65] is None
    for rank, (out, live_targets) in enumerate(results[:65]):
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(3, 16, generator=g).to(torch.bfloat16)
        want = x.float() * torch.tensor(live_targets, dtype=torch.float32)[:, None]
        torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)
    assert any(n < 4 for _, live in results[:65] for n in live)  # the dead rank's lanes were dropped


class _Group:
    """A communicator of ``size`` ranks that answers every collective for all of them (the
    constructor's checks before the workspace need no peers)."""

    def __init__(self, size: int):
        self.size = size

    def Get_rank(self):
        return 0

    def Get_size(self):
        return self.size

    def allgather(self, data):
        return [data] * self.size


def test_moe_ep_0_7_4_refuses_257_ranks_like_real():
    with profiles.fake_profile("0.7.4"):
        from fakes.flashinfer import moe_ep

        bootstrap = moe_ep.BootstrapConfig(world_size=257, rank=0)
        params = moe_ep.MoEEpCommParams(num_experts=257, top_k=8, max_tokens_per_rank=4, hidden_size=16)
        with pytest.raises(ValueError, match=r"^NVLinkOneSidedAlltoAll supports at most 256 EP ranks, got 257$"):
            moe_ep.NVLinkOneSidedAlltoAll(bootstrap, params, moe_ep.NVLinkOneSidedConfig(comm_backend=_Group(257)))
