"""What the testbed found in vLLM's code (0.33.0's, 0.34.0's VLLM-008, and the bugs 0.18 .. 0.21
shipped and later releases fixed, VLLM-009 .. VLLM-015; FlashInfer's through it), each written up
in ``docs/findings.md`` under its id; they apply to scenarios of ``--integration vllm`` on a
release whose code still holds them (``Finding.code``)."""

from __future__ import annotations

from typing import Optional

from fakes.flashinfer.profiles import resolve
from testbed.integrations.base import Finding
from testbed.scenario.model import Scenario, row_bytes


def _vllm(sc: Scenario, path: str, profile: Optional[str] = None) -> bool:
    """``sc`` on ``path``, and on FlashInfer ``profile`` (by the profile that serves its release)."""
    return sc.path == path and (profile is None or resolve(sc.profile).name == profile)


def _orders_rounds(sc: Scenario) -> bool:
    """Whether the release's one-sided kernels order a round after the previous round's
    combine reads: moe_ep's own kernels (0.7.4) do; MoeAlltoAll's do not."""
    return resolve(sc.profile).moe_ep_kernels


# Where each lives in vLLM's code (Finding.code), relative to the release's root.
_ALL2ALL = "vllm/distributed/device_communicators/all2all.py"
_PF = "vllm/model_executor/layers/fused_moe/prepare_finalize/"
# A prepare/finalize module: in prepare_finalize/ from 0.19, beside the layer in 0.18.
_ONE_SIDED = (_PF + "flashinfer_nvlink_one_sided.py",
              "vllm/model_executor/layers/fused_moe/flashinfer_nvlink_one_sided_prepare_finalize.py")
_TWO_SIDED = (_PF + "flashinfer_nvlink_two_sided.py",
              "vllm/model_executor/layers/fused_moe/flashinfer_nvlink_two_sided_prepare_finalize.py")
_NOT_REDUCED = r"def output_is_reduced\(self\) -> bool:\s*return False"


def _payload_grows_within_a_forward(sc: Scenario) -> bool:
    """A stage where a layer dispatches more bytes per token than the layer before it."""
    def grows(a, b):
        return sum(row_bytes(b.fmt, sc.hidden, sc.mx_alignment).values()) > sum(row_bytes(a.fmt, sc.hidden, sc.mx_alignment).values())

    return any(grows(a, b) for st in sc.stages for a, b in zip(st, st[1:]))


def _runtime_max_grows_between_unordered_forwards(sc: Scenario) -> bool:
    """Rounds an engine ran itself (nothing of the testbed's orders its forwards) where a
    forward's runtime max (its most tokens on a DP rank) is larger than the previous forward's:
    its first dispatch then writes at least one token's payload per EP rank past where the
    previous round's dispatch region ended, into that round's combine region."""
    if sc.forwards_ordered:
        return False
    most = [max(sc.tokens(p, st[0], d) for d in range(sc.layout.dp)) for p in range(len(sc.passes))
            for st in sc.stages[:1]]
    return any(b > a for a, b in zip(most, most[1:]))


def _dispatch_bytes(sc: Scenario, fmt: str) -> int:
    return sum(row_bytes(fmt, sc.hidden, sc.mx_alignment).values())


def _payload_grows_past_the_first(sc: Scenario) -> bool:
    """A stage where a later layer dispatches more bytes per token than its first (each stage
    has an EP group, and so a manager, of its own)."""
    return any(_dispatch_bytes(sc, ly.fmt) > _dispatch_bytes(sc, st[0].fmt) for st in sc.stages for ly in st[1:])


def _dispatches_more_than_nvfp4(sc: Scenario) -> bool:
    return any(_dispatch_bytes(sc, ly.fmt) > _dispatch_bytes(sc, "nvfp4") for st in sc.stages for ly in st)


def _unequal_dp_counts(sc: Scenario) -> bool:
    """A layer of a pass where the DP ranks' token counts differ: the runtime max then leaves
    unwritten receive slots behind some rank's rows."""
    return any(len({sc.tokens(p, ly, d) for d in range(sc.layout.dp)}) > 1
               for p in range(len(sc.passes)) for st in sc.stages for ly in st)


def _all_idle_pass(sc: Scenario) -> bool:
    return any(not any(sc.tokens(p, ly, d) for d in range(sc.layout.dp))
               for p in range(len(sc.passes)) for st in sc.stages for ly in st)


def _mxfp8_on_an_empty_rank(sc: Scenario) -> bool:
    return any(
        ly.fmt == "mxfp8" and any(not sc.tokens(p, ly, d) for d in range(sc.layout.dp))
        for p in range(len(sc.passes)) for st in sc.stages for ly in st)


def _moe_ep_without_the_pins_fields(sc: Scenario) -> bool:
    """The release pins a FlashInfer with 0.7.3's moe_ep (its one-sided config's ``cft`` and
    ``lamport``), and the scenario runs one whose moe_ep predates them (0.7.2, 0.7.2.post1): what
    an install that cannot get the pin resolves."""
    from testbed.integrations.vllm.environment import ENGINE

    profile = resolve(sc.profile)
    return (resolve(ENGINE.pinned()).moe_ep_kernels and "moe_ep" not in profile.absent_modules
            and not profile.moe_ep_kernels)


_EVERY_FORWARD = "every forward of vLLM's MoERunner on that backend and release hits it, the engine's too"
# vLLM 0.33.0's engine never enters an MoE layer with 0 tokens on a DP rank.
_ENGINE_STEP = ("an idle DP rank runs the 1-token dummy batch (v1/engine/core.py execute_dummy_batch, "
                "gpu_worker.py _dummy_run(uniform_decode_query_len)) and no forward runs when every DP rank is "
                "idle; the layer sees 0 tokens only from a direct caller (--raw-passes)")

FINDINGS: tuple[Finding, ...] = (
    Finding("VLLM-001", "vLLM 0.33.0's one-sided prepare calls dispatch(max_tokens_per_rank=), which FlashInfer "
                        "0.7.4 renamed runtime_max_tokens_per_rank (keyword-only): every forward raises TypeError",
            lambda sc: _vllm(sc, "one_sided", "0.7.4"),
            (("completes", "unexpected keyword argument 'max_tokens_per_rank'"),),
            "yes", _EVERY_FORWARD,
            code=((_ONE_SIDED, r"(?<!runtime_)max_tokens_per_rank=self\.runtime"),)),
    Finding("VLLM-002", "vLLM 0.33.0's two-sided backend needs flashinfer.comm.trtllm_alltoall.MnnvlMoe, which "
                        "FlashInfer 0.7.4 removed: the manager's constructor asserts",
            lambda sc: _vllm(sc, "two_sided", "0.7.4"),
            (("completes", "flashinfer all2all module not found"),),
            "yes", "the manager is built when vLLM's EP group starts (CudaCommunicator), before any forward",
            code=((_ALL2ALL, r"\bMnnvlMoe\b"),)),
    Finding("VLLM-003", "vLLM 0.33.0's one-sided prepare dispatches max_tokens_per_rank=0 in a forward where no DP "
                        "rank has a token; FlashInfer refuses it (must be in (0, capacity])",
            lambda sc: _vllm(sc, "one_sided") and _all_idle_pass(sc),
            (("runtime-max-tokens", "with runtime_max_tokens_per_rank 0"),
             ("completes", "max_tokens_per_rank=0 must be in (0,")),
            "no", _ENGINE_STEP,
            "a2a-testbed run --integration vllm --layout 4,1,4,1 --stages bf16:8 --tokens 0,0,0,0 --raw-passes"),
    Finding("FI-RACE", "FlashInfer's one-sided protocol does not order a round after the previous round's combine "
                       "reads: vLLM runs an MoE layer whose dispatch payload is larger right after another in one "
                       "forward, or (served, DP attention) a forward whose runtime max is larger right after "
                       "another, with nothing on the device between them",
            lambda sc: _vllm(sc, "one_sided") and not _orders_rounds(sc) and (
                _payload_grows_within_a_forward(sc) or _runtime_max_grows_between_unordered_forwards(sc)),
            (("round-ordering", "the cross-round race"), ("output", "x the tolerance"),
             ("expert-load", "lanes"), ("answers", "the reference"), ("logprobs", "the reference")),
            "yes", "served at DP 2 and DP 4 (TP 1) on its pin, a step with more tokens on some DP rank than the step "
            "before (a new request's prefill after decodes) dispatches past the previous step's combine region; "
            "between steps vLLM synchronises DP on the CPU group only, under async scheduling (its log: 'Disabling "
            "NCCL for DP synchronization when using async scheduling'); `a2a-testbed serve --integration vllm`"),
    Finding("VLLM-005", "vLLM 0.33.0's two-sided manager hands FlashInfer's Mapping the function "
                        "torch.accelerator.device_count as gpus_per_node; Mapping's node_rank, local_rank and "
                        "has_multi_node then compute with a function",
            lambda sc: _vllm(sc, "two_sided") and not _vllm(sc, "two_sided", "0.7.4"),
            (("arguments", "gpus_per_node=<function device_count"),),
            "yes", "the manager's initialize runs on the first forward of MoERunner at every two-sided deployment",
            code=((_ALL2ALL, r"gpus_per_node=torch\.accelerator\.device_count\b"),)),
    Finding("VLLM-006", "vLLM 0.33.0's two-sided prepare/finalize declares topk_indices_dtype() None, so vLLM's "
                        "router hands it ids in the router's own dtype, and passes them to MnnvlMoe's moe_prepare, "
                        "which takes int32 only: a router computing int64 ids fails every forward",
            lambda sc: _vllm(sc, "two_sided") and not _vllm(sc, "two_sided", "0.7.4") and sc.router_ids == "int64",
            (("completes", "Inconsistency of Tensor type: expertsIds"),),
            "not checked", "needs a router that hands the prepare int64 ids: vLLM 0.33.0's CPURouter and "
            "CustomRoutingRouter cast to int32; its routing simulator (VLLM_MOE_ROUTING_SIMULATION_STRATEGY) is the "
            "candidate, not driven here (--level kernel reaches it)",
            "a2a-testbed run --integration vllm --layout 2,1,2,1 --path two_sided --experts 4 --top-k 2 --hidden 64 "
            "--stages bf16:1 --tokens 1,1 --router-ids int64 --level kernel",
            code=((_TWO_SIDED, r"MnnvlMoe\.mnnvl_moe_alltoallv_prepare_without_allgather\("),)),
    Finding("VLLM-008", "vLLM 0.34.0's one-sided manager builds NVLinkOneSidedConfig(cft=False, lamport=False), "
                        "fields FlashInfer 0.7.3 added, while its probe and its message accept FlashInfer 0.7.2: on "
                        "0.7.2 the backend raises TypeError when the first MoE layer builds its communication",
            lambda sc: _vllm(sc, "one_sided") and _moe_ep_without_the_pins_fields(sc),
            (("completes", "unexpected keyword argument 'cft'"),),
            "yes", "its pin, flashinfer-python 0.7.3, is not on PyPI, so an install resolves another FlashInfer: "
            "0.7.2.post1, the newest below it, passes has_flashinfer_nvlink_one_sided() (utils/flashinfer.py) and "
            "the manager's 'Please install FlashInfer 0.7.2 or later' assertion, and every one-sided deployment "
            "builds the communication at start-up",
            "a2a-testbed run --integration vllm --layout 2,1,2,1 --stages bf16:16 --tokens 5,7",
            code=((_ALL2ALL, r"NVLinkOneSidedConfig\((?s:.)*?\bcft=False"),
                  (_ALL2ALL, r"Please install FlashInfer 0\.7\.2 or later"))),
    Finding("VLLM-009", "vLLM 0.18 .. 0.21's FlashInfer NVLink prepare/finalizes (one-sided and two-sided) "
                        "declare output_is_reduced() False, though FlashInfer's combine already sums every expert "
                        "rank's contribution: the TP all-reduce after it (the model's in 0.18/0.19, the runner's "
                        "_maybe_reduce_final_output in 0.20/0.21) sums complete outputs, output x TP",
            lambda sc: sc.path in ("one_sided", "two_sided"),
            (("reduce", "output_is_reduced() is False"), ("reduce", "TP all_reduce call(s)"),
             ("output", "x the reference")),
            "yes", "every forward at TP > 1 with DP and expert parallel on either backend (the backends never run "
            "sequence parallel before 0.29, so nothing skips the reduce); at TP 1 the declaration is as wrong "
            "and the TP all-reduce is a no-op. Fixed in 0.22.0 (vLLM PR #41382)",
            # nvfp4 at TP 1: the one layer every release with it builds and dispatches one-sided (at TP 2
            # the output is 2x: `--layout 4,2,2,1 --stages bf16:8 --tokens 2,3` on 0.21.0).
            "a2a-testbed run --integration vllm --layout 2,1,2,1 --stages nvfp4:16 --tokens 5,7 --tokens 3,1",
            code=((_ONE_SIDED, _NOT_REDUCED), (_TWO_SIDED, _NOT_REDUCED))),
    Finding("VLLM-010", "vLLM 0.18/0.19's FlashInfer managers set up the MNNVL workspace over the DP group "
                        "(CustomCommunicator(get_dp_group().cpu_group)), not the EP group they dispatch over: at "
                        "TP > 1 the workspace spans DP ranks only and FlashInfer refuses it",
            lambda sc: sc.path in ("one_sided", "two_sided") and sc.layout.tp > 1,
            (("collectives", "mnnvl_compat.py"), ("completes", "workspace first dim must equal ep_size"),
             ("completes", "its MNNVL communicator must span the EP group")),
            "yes", "the managers set the workspace up when the first MoE layer builds its prepare/finalize, at "
            "start-up of every TP > 1 deployment with DP and expert parallel. Fixed in 0.20.0 (vLLM PR #40893)",
            "a2a-testbed run --integration vllm --layout 4,2,2,1 --stages nvfp4:8 --tokens 2,3",
            code=((_ALL2ALL, r"CustomCommunicator\(get_dp_group\(\)\.cpu_group\)"),)),
    Finding("VLLM-011", "vLLM 0.18/0.19's one-sided path is written for nvfp4 alone: the manager sizes the "
                        "workspace for an nvfp4 dispatch row (hidden // 2 + hidden // 16 + 8 top_k bytes) and the "
                        "prepare views received scales as nvfp4's, whatever the layer dispatches: a bf16, mxfp8 "
                        "or blockwise-FP8 layer writes past its dispatch region (FlashInfer's combinePayloadOffset "
                        "check) or fails to view its scales",
            lambda sc: sc.path == "one_sided" and _dispatches_more_than_nvfp4(sc),
            (("workspace", "does not cover layer"), ("completes", "combinePayloadOffset"),
             ("completes", "is invalid for input of size"), ("round-ordering", "the cross-round race"),
             ("output", "x the tolerance"), ("expert-load", "lanes")),
            "yes", "every one-sided deployment of an unquantized or mxfp8 checkpoint (0.18/0.19's prepare builder "
            "dispatches nvfp4, mxfp8 and bf16). 0.20.0 refuses any format but nvfp4 (vLLM PR #39717); 0.20.1 and "
            "0.21.0 size the row by the layer's format (vLLM PR #40960)",
            "a2a-testbed run --integration vllm --layout 2,1,2,1 --stages bf16:8 --tokens 2,3",
            code=((_ALL2ALL, r"hidden_size // 2  # nvfp4 hidden states"),)),
    Finding("VLLM-012", "vLLM 0.18 .. 0.21's one-sided manager keeps the first layer's workspace (initialize "
                        "returns once initialized): a later layer of a stage that dispatches more bytes per token "
                        "(an nvfp4 model's bf16 MTP head) writes past it",
            lambda sc: sc.path == "one_sided" and _payload_grows_past_the_first(sc),
            (("workspace", "does not cover layer"), ("completes", "combinePayloadOffset"),
             ("round-ordering", "the cross-round race"), ("output", "x the tolerance"), ("expert-load", "lanes")),
            "yes", "a checkpoint whose MoE layers dispatch different formats, as an nvfp4 model with a bf16 MTP "
            "drafter; FlashInfer's combinePayloadOffset check fires on a GPU. Fixed in 0.22.0: the workspace grows "
            "to the union of the layers (vLLM PR #42976)",
            "a2a-testbed run --integration vllm --layout 2,1,2,1 --stages nvfp4:16,bf16:16 --tokens 1,5 --tokens 3,4",
            code=((_ALL2ALL, r"class FlashInferNVLinkOneSidedManager(?s:.)*?def initialize(?s:.)*?"
                             r"if self\.initialized:\s*return\b"),)),
    Finding("VLLM-013", "vLLM 0.18 .. 0.21's one-sided manager barriers on the world group (dist.barrier()) "
                        "after building MoeAlltoAll, not on its EP group: under pipeline parallel every stage's "
                        "ranks wait for every other stage's set-up",
            lambda sc: sc.path == "one_sided" and sc.layout.pp > 1,
            (("collectives", "barrier on group"),),
            "not checked", "each rank initializes its manager once, at its stage's first MoE layer, so the world "
            "barrier completes where every stage holds an MoE layer; a stage without one (dense first layers) "
            "hangs the others. Fixed in 0.22.0: the barrier is on the EP group (vLLM PR #42976)",
            "a2a-testbed run --integration vllm --layout 4,1,2,2 --stages 'nvfp4:8;nvfp4:8' --tokens 2,5 --tokens 4,1",
            code=((_ALL2ALL, r"dist\.barrier\(\)"),)),
    Finding("VLLM-014", "vLLM 0.18 .. 0.21's two-sided dispatch sends the activation scales through "
                        "MnnvlMoe.mnnvl_moe_alltoallv whether or not there are any: an unquantized (bf16) layer "
                        "hands it None, and every forward raises",
            lambda sc: sc.path == "two_sided" and any(ly.fmt == "bf16" for st in sc.stages for ly in st),
            (("completes", "'NoneType' object has no attribute 'dim'"),),
            "yes", "every forward of an unquantized layer at every two-sided deployment. Fixed in 0.22.0 (if "
            "x_sf is not None; the release notes name no pull request)",
            "a2a-testbed run --integration vllm --layout 2,1,2,1 --path two_sided --hidden 512 --stages bf16:8 "
            "--tokens 2,6",
            code=((_TWO_SIDED, r"\n        x_sf = MnnvlMoe\.mnnvl_moe_alltoallv\("),)),
    Finding("VLLM-015", "vLLM 0.18 .. 0.20.0's one-sided dispatch passes no invalid_token_expert_id: the receive "
                        "slots behind a DP rank with fewer tokens than the runtime max keep what was there, and "
                        "the experts compute them as routed rows",
            lambda sc: sc.path == "one_sided" and _unequal_dp_counts(sc),
            (("expert-load", "lanes"),),
            "yes", "every forward where the DP ranks' counts differ (the runtime max is the largest count); the "
            "combine reads only the real rows, so the cost is the experts' work and ids never routed reaching "
            "them. Fixed in 0.20.1 and 0.21.0 (invalid_token_expert_id=-1, 'Follow TRTLLM Pattern', vLLM PR "
            "#40960)",
            "a2a-testbed run --integration vllm --layout 2,1,2,1 --stages nvfp4:16 --tokens 5,7 --tokens 3,1",
            # MoeAlltoAll's dispatch called without the sentinel (moe_ep, 0.33 on, sets its own).
            code=((_ONE_SIDED, r"moe_alltoall\.dispatch\((?:(?!invalid_token_expert_id)[^()])*\)"),)),
    Finding("VLLM-004", "vLLM 0.33.0's mxfp8 activation quantize raises on a rank with 0 tokens (scales "
                        ".view(M, -1) with M = 0), so an mxfp8 layer fails wherever a DP rank enters it empty",
            _mxfp8_on_an_empty_rank,
            (("completes", "cannot reshape tensor of 0 elements"),),
            "no", _ENGINE_STEP,
            "a2a-testbed run --integration vllm --layout 2,1,2,1 --stages mxfp8:8 --tokens 0,3 --raw-passes"),
)


