"""SGLang's own processes where the testbed serves it (``a2a-testbed serve --integration
sglang``): ``python -m sglang.launch_server`` on the CPU (``SGLANG_USE_CPU_ENGINE=1``) with DP
attention and FlashInfer's all-to-all, in SGLang's own API server, DP controller, schedulers
and detokenizer.

The server's command, its environment and what each of its processes needs before its main
module are the engine's description (:mod:`.environment`, ``SERVING``). Here, inert outside a
served run (no :data:`testbed.integrations.engine.SERVE_RUN_ENV`):

- :func:`plugin`, SGLang's general plugin (entry point group ``sglang.srt.plugins``, which
  SGLang loads in its server, DP controller and each scheduler before its work), which puts in
  what a CPU lacks on the path a GPU deployment runs (:func:`_cpu_stand_ins`), the run's mutant,
  and once SGLang's groups form each rank's recorders, with its EP group read from SGLang's own.

Each MoE layer call of a forward that runs the all-to-all (decode, or an idle DP rank's dummy
batch; SGLang 0.5.23's extend batches all-gather instead) is logged in the rank's event log and
as a line in ``steps<rank>.jsonl``: the layer, the rank's rows and the DP token counts SGLang's
scheduler gathered for the forward.
"""

from __future__ import annotations

from testbed.integrations import served

def plugin() -> None:
    """SGLang's general-plugin hook."""
    served.apply_once(_cpu_stand_ins, _on_groups)


def _cpu_stand_ins() -> None:
    """What SGLang's CPU platform lacks on the path a GPU deployment of DP attention with
    FlashInfer's all-to-all runs:

    - the MoE layer's forward: on the CPU platform SGLang runs ``forward_cpu`` (its torch-native
      experts, which index the layer's local weights by global expert id: no expert parallel);
      with a FlashInfer runner it runs ``forward_cuda``'s FlashInfer path instead, the fake's
      TRT-LLM MoE, as on a GPU;
    - the TP group's varying-size all-gather and reduce-scatter (the extend batches' MoE): NCCL
      through pynccl, which a CPU has not; the reduce-scatter as SGLang's own NCCL-free one
      computes it (its deterministic-inference path: an all-reduce, then this rank's rows), the
      all-gather the group's gloo all-gather of rows padded to the largest;
    - the padded rows' sequence length of the torch-native attention backend, which SGLang's
      DP-attention padding asks of every CPU backend and only the AMX one answers
      (``docs/findings.md``, SGL-013): 1, the AMX backend's and the GPU backends' answer;
    - the packing of the routed ids and weights into one int32 (0.5.19's TRT-LLM bf16 runner): a
      Triton kernel, which a CPU has no driver for; SGLang's own torch version of it
      (``PackTopkIds.vanilla``) instead.
    """
    import torch
    from sglang.srt.distributed.parallel_state import GroupCoordinator
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

    cpu_forward = UnquantizedFusedMoEMethod.forward_cpu

    def forward_cpu(self, layer, dispatch_output):
        if self.use_flashinfer_trtllm_moe:
            return self.forward_cuda(layer, dispatch_output)
        return cpu_forward(self, layer, dispatch_output)

    # forward_native is forward_cpu's alias (the class body's end); the dispatch picks either.
    UnquantizedFusedMoEMethod.forward_cpu = UnquantizedFusedMoEMethod.forward_native = forward_cpu

    def all_gatherv(self, input_, sizes=None, output=None):
        single = isinstance(input_, torch.Tensor)
        gathered = [_all_gatherv_rows(self, t, sizes) for t in ([input_] if single else input_)]
        if not single:
            return gathered
        if output is None:
            return gathered[0]
        output.copy_(gathered[0])
        return output

    GroupCoordinator.all_gatherv = all_gatherv

    def reduce_scatterv(self, input_, output=None, sizes=None):
        out = _reduce_scatterv_rows(self, input_, sizes)
        return out if output is None else output.copy_(out)

    GroupCoordinator.reduce_scatterv = reduce_scatterv
    # 0.5.19 on ask the CPU one, which the backend lacks; 0.5.15 .. 0.5.18 the CUDA one on a CPU
    # too, the base class's NotImplementedError.
    for asked in ("get_cpu_graph_seq_len_fill_value", "get_cuda_graph_seq_len_fill_value"):
        if asked not in vars(TorchNativeAttnBackend):
            setattr(TorchNativeAttnBackend, asked, lambda self: 1)
    try:  # 0.5.19's TRT-LLM bf16 runner packs its ids and weights with a Triton kernel
        from sglang.kernels.ops.moe.pack_topk_ids import PackTopkIds
    except ImportError:
        return
    PackTopkIds.execute = classmethod(lambda cls, ids, weights: cls.vanilla(ids, weights))


def _reduce_scatterv_rows(group, x_NX, sizes):
    """This rank's rows of the sum over the group of ``x_NX`` (``sizes[r]`` rows for rank ``r``, in
    rank order; all equal where None), as SGLang's own NCCL-free reduce-scatter of its
    deterministic inference (0.5.21 on) computes it: an all-reduce of the whole, then this rank's
    rows."""
    sizes = list(sizes) if sizes is not None else [x_NX.shape[0] // group.world_size] * group.world_size
    offset = sum(sizes[:group.rank_in_group])
    return group.all_reduce(x_NX.clone()).narrow(0, offset, sizes[group.rank_in_group]).clone()


def _all_gatherv_rows(group, x_NX, sizes):
    """Every rank's rows of ``x_NX`` (``sizes[r]`` from rank ``r``; all equal where None), in
    rank order: each rank's rows as bytes, padded to the largest count, all-gathered on the
    group's (gloo) device group."""
    import math

    import torch
    import torch.distributed as dist

    sizes = list(sizes) if sizes is not None else [x_NX.shape[0]] * group.world_size
    width = math.prod(x_NX.shape[1:]) * x_NX.element_size()  # a row's bytes, also where this rank has none
    rows_NB = x_NX.contiguous().view(torch.uint8).view(x_NX.shape[0], width)
    padded = torch.zeros(max(sizes), width, dtype=torch.uint8)
    padded[:x_NX.shape[0]] = rows_NB
    parts = [torch.empty_like(padded) for _ in range(group.world_size)]
    dist.all_gather(parts, padded, group=group.device_group)
    return torch.cat([p[:n] for p, n in zip(parts, sizes)]).view(x_NX.dtype).view(sum(sizes), *x_NX.shape[1:])


def _on_groups(run_dir: str, plan: dict) -> None:
    import sys

    from sglang.srt.distributed import parallel_state as ps

    formed = ps.initialize_model_parallel

    def initialize_model_parallel(*a, **k):
        out = formed(*a, **k)
        import torch.distributed as dist

        with served.testbed_errors(run_dir):
            rank, world = dist.get_rank(), dist.get_world_size()
            log = served.named(plan["start_rank"])(run_dir, rank, world, tuple(ps.get_moe_ep_group().ranks))
            _log_layers(log, served.Steps(run_dir, rank))
        return out

    # Wherever SGLang's modules bound it by name (its bootstrap from 0.5.16, its model runner
    # before), all imported by the time its plugins load.
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("sglang.") and \
                getattr(module, "initialize_model_parallel", None) is formed:
            module.initialize_model_parallel = initialize_model_parallel


def _log_layers(log, steps: served.Steps) -> None:
    """Each MoE layer's build (its dispatcher's, in its constructor), and each call of a forward
    that runs the all-to-all, in ``log`` (numbered per layer) and ``steps``."""
    from sglang.srt.layers.dp_attention import get_dp_global_num_tokens, get_is_extend_in_batch
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    from testbed.integrations.sglang import shapes
    from testbed.scenario.events import ForwardEnd, ForwardStart, LayerBuilt

    init, forward = FusedMoE.__init__, FusedMoE.forward
    calls: dict[int, int] = {}

    def built(self, *a, **k):  # SGLang's FusedMoE builds its dispatcher, and so its MoeAlltoAll
        init(self, *a, **k)
        log.write(LayerBuilt(layer=self.layer_id))

    def forward_logged(self, hidden_states, *a, **k):
        if get_is_extend_in_batch():  # SGLang's extend batches all-gather on the TP group: no round
            return forward(self, hidden_states, *a, **k)
        i = self.layer_id
        p = calls[i] = calls.get(i, -1) + 1
        steps.append((i, int(hidden_states.shape[0]), tuple(get_dp_global_num_tokens())))
        log.write(ForwardStart(pass_index=p, layer=i, reduced=bool(shapes.output_is_complete()), pending=False,
                               sp=False))
        out = forward(self, hidden_states, *a, **k)
        log.write(ForwardEnd(pass_index=p, layer=i))
        return out

    FusedMoE.__init__ = built
    FusedMoE.forward = forward_logged
