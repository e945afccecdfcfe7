"""The parallel config and the one support table: vLLM's derived facts, the rules each
rejected combination names, the generated feature matrix, and the CLI's one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from impl import parallel as p

ROOT = Path(__file__).resolve().parent.parent


# Stated here from the sources, not read from the table: vLLM 0.33's use_sequence_parallel_moe
# lists allgather_reducescatter and flashinfer_nvlink_one_sided but not the two-sided backend;
# supports_deferred_moe_finalize is True only for the no-DP/no-EP prepare/finalize; only
# MoeAlltoAll has get_combine_payload_tensor_in_workspace; every backend carries every format.
REJECTED = {(p.TWO_SIDED, "sequence_parallel"), (p.NO_EP, "sequence_parallel"),
            (p.ONE_SIDED, "deferred_finalize"), (p.TWO_SIDED, "deferred_finalize"), (p.AG_RS, "deferred_finalize"),
            (p.TWO_SIDED, "workspace_output"), (p.AG_RS, "workspace_output"), (p.NO_EP, "workspace_output")}


def test_support_table_states_the_upstream_facts():
    got = {(b, f) for b in p.BACKENDS for f in p.FORMATS + p.MODES if p.SUPPORT[b][f] is not None}
    assert got == REJECTED


def test_support_feature_matrix_doc_is_fresh():
    doc = (ROOT / "docs/feature_matrix.md").read_text()
    assert doc == p.feature_matrix_markdown(), "docs/feature_matrix.md is stale: python -m impl.parallel > it"


@pytest.mark.parametrize("backend", p.BACKENDS)
@pytest.mark.parametrize("feature", p.FORMATS + p.MODES)
def test_support_check_follows_the_table(backend, feature):
    kw = {feature: True} if feature in p.MODES else {}
    fmt = feature if feature in p.FORMATS else "bf16"
    rule = p.SUPPORT[backend][feature]
    if rule is None:
        p.check_supported(backend, fmt, **kw)
        return
    with pytest.raises(p.UnsupportedFeatureError) as e:
        p.check_supported(backend, fmt, **kw)
    assert str(e.value) == f"{backend} does not support {feature}: {rule}"


def test_support_sequence_parallel_and_deferral_where_vllm_allows_them():
    # Sequence parallel: the one-sided and all-gather backends only, with EP, TP > 1 and DP > 1.
    assert {b for b in p.BACKENDS if b != p.NO_EP and p.ParallelConfig(tp=2, dp=2, all2all_backend=b)
            .use_sequence_parallel_moe} == {p.ONE_SIDED, p.AG_RS}
    assert not p.ParallelConfig(tp=1, dp=4, all2all_backend=p.ONE_SIDED).use_sequence_parallel_moe
    assert not p.ParallelConfig(tp=4, dp=1, all2all_backend=p.ONE_SIDED).use_sequence_parallel_moe
    assert not p.ParallelConfig(tp=2, dp=2, all2all_backend=p.ONE_SIDED,
                                sequence_parallel_moe=False).use_sequence_parallel_moe
    # Deferral: TP-only, expert parallel off.
    off = dict(enable_expert_parallel=False, all2all_backend=p.NO_EP, defer_moe_finalize=True)
    assert p.ParallelConfig(tp=2, **off).use_deferred_moe_finalize
    assert not p.ParallelConfig(tp=1, **off).use_deferred_moe_finalize
    assert not p.ParallelConfig(tp=2, dp=2, **off).use_deferred_moe_finalize
    assert not p.ParallelConfig(tp=2, dp=1, all2all_backend=p.ONE_SIDED,
                                defer_moe_finalize=True).use_deferred_moe_finalize


@pytest.mark.parametrize("tp, dp, ep_on, ep, moe_tp, all2all", [
    (2, 2, True, 4, 1, True), (4, 1, True, 4, 1, False), (1, 1, True, 1, 1, False), (2, 1, False, 1, 2, False),
])
def test_support_parallel_config_sizes(tp, dp, ep_on, ep, moe_tp, all2all):
    c = p.ParallelConfig(tp=tp, dp=dp, enable_expert_parallel=ep_on,
                         all2all_backend=p.ONE_SIDED if ep_on else p.NO_EP)
    assert (c.ep_size, c.moe_tp_size, c.use_all2all_kernels) == (ep, moe_tp, all2all)


def test_support_backend_names_and_alias():
    assert p.ParallelConfig(tp=2, all2all_backend="flashinfer_all2allv").all2all_backend == p.TWO_SIDED
    with pytest.raises(ValueError, match="all2all_backend must be one of .*got 'pplx'"):
        p.ParallelConfig(all2all_backend="pplx")
    with pytest.raises(ValueError, match="backend 'none' exactly when expert parallel is off"):
        p.ParallelConfig(tp=2, all2all_backend=p.NO_EP)
    with pytest.raises(ValueError, match="tp must be a positive int"):
        p.ParallelConfig(tp=0)


@pytest.mark.parametrize("argv, message", [
    (("--layout", "4,2,2,1", "--path", "two_sided", "--sequence-parallel"),
     "--sequence-parallel: flashinfer_nvlink_two_sided: vLLM's use_sequence_parallel_moe does not list"),
    (("--layout", "4,4,1,1", "--sequence-parallel"), "--sequence-parallel: flashinfer_nvlink_one_sided: "
                                                     "sequence-parallel MoE needs tp > 1 and dp > 1"),
    (("--defer-finalize",), "--defer-finalize: flashinfer_nvlink_one_sided does not support deferred_finalize"),
    (("--path", "flashinfer_all2allv", "--expert-output", "workspace"),
     "--expert-output: flashinfer_nvlink_two_sided does not support workspace_output"),
    (("--expert-kernel", "trtllm", "--stages", "mxfp8:8"), "--expert-kernel: the CPU fake implements the TRT-LLM"),
    (("--layout", "2,1,2,1", "--path", "none"), "--path: expert parallel off with dp > 1"),
    (("--routed-scaling", "0"), "--routed-scaling: must be a finite number > 0"),
    (("--routed-scaling", "1e39"), "--routed-scaling: must be a finite number > 0 and <= 1e+06"),
    (("--path", "two_sided", "--invalid-expert-id", "num_experts"), "--invalid-expert-id: applies to --path one_sided"),
])
def test_support_cli_rejects_in_one_line_with_the_rule(capsys, argv, message):
    from testbed.cli import main

    assert main(["run", *argv]) == 2  # refused before any rank starts, so in this process
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"a2a-testbed run: error: {message}"), line
