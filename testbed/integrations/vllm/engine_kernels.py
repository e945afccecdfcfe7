"""CPU kernels for the compiled ops vLLM's CPU engine loop calls outside the MoE layer, which
its CUDA wheel does not carry: each registered under the schema of vLLM's CPU build
(``csrc/cpu/torch_bindings.cpp``) and computing what that kernel computes, in torch; the
variants the tiny checkpoints never use are refused naming the argument, never approximated.

Legend: T tokens of the step, R requests, H query heads, G KV heads, D head size,
B KV-cache blocks, S block size.

- ``init_cpu_memory_env``: the worker's NUMA memory binding; nothing to bind here.
- ``cpu_attn_has_isa``: which of the kernel's ISA paths is built; these kernels are one path.
- ``get_scheduler_metadata``: the kernel's work split; these kernels need none.
- ``cpu_attn_reshape_and_cache``: each token's key and value into its slot of the paged cache.
- ``cpu_attention_with_kv_cache``: causal (optionally windowed) attention of each request's
  query tokens over its cached keys, fp32 softmax.
- ``greedy_argmax``: the sampler's greedy pick, the first maximum of each row.
- ``compute_slot_mapping_kernel_impl``: each scheduled token's KV-cache slot from its
  request's block table and its position (the block table's Triton kernel, which the CPU
  platform routes here), the rest of the buffer padded with -1.

The rest of a model's CPU path is vLLM's own torch code: the checkpoints are run with
``compilation_config.custom_ops=["none"]``, vLLM's switch that puts every ``CustomOp`` (RMS
norm, rotary embedding, SiLU-and-mul) on its ``forward_native``.
"""

from __future__ import annotations

import functools

import torch

# The schemas of vLLM's CPU build (csrc/cpu/torch_bindings.cpp, as the search index's snapshot of
# upstream holds it; vLLM 0.33.0's Python calls each with these arguments, in this order).
SCHEMAS = {
    "init_cpu_memory_env": "init_cpu_memory_env(SymInt[] node_ids) -> ()",
    "cpu_attn_has_isa": "cpu_attn_has_isa(str isa) -> bool",
    "get_scheduler_metadata": (
        "get_scheduler_metadata(int num_req, int num_heads_q, int num_heads_kv, int head_dim, Tensor seq_lens, "
        "ScalarType dtype, Tensor query_start_loc, bool casual, int window_size, str isa_hint, "
        "bool enable_kv_split, Tensor? dynamic_causal, str kv_cache_dtype=\"auto\") -> Tensor"),
    "cpu_attn_reshape_and_cache": (
        "cpu_attn_reshape_and_cache(Tensor key, Tensor value, Tensor(a2!) key_cache, Tensor(a3!) value_cache, "
        "Tensor slot_mapping, str isa, float k_scale=1.0, float v_scale=1.0, str kv_cache_dtype=\"auto\") -> ()"),
    "cpu_attention_with_kv_cache": (
        "cpu_attention_with_kv_cache(Tensor query, Tensor key_cache, Tensor value_cache, Tensor(a3!) output, "
        "Tensor query_start_loc, Tensor seq_lens, float scale, bool causal, Tensor? alibi_slopes, "
        "SymInt sliding_window_size, Tensor block_table, float softcap, Tensor scheduler_metadata, "
        "Tensor? s_aux, Tensor? dynamic_causal, float k_scale=1.0, float v_scale=1.0, "
        "str kv_cache_dtype=\"auto\") -> ()"),
    "greedy_argmax": "greedy_argmax(Tensor logits) -> Tensor",
    "compute_slot_mapping_kernel_impl": (
        "compute_slot_mapping_kernel_impl(Tensor query_start_loc, Tensor positions, Tensor block_table, "
        "Tensor(a3!) slot_mapping, SymInt block_size) -> ()"),
}
ISAS = ("vec", "vec16")  # the generic paths _get_attn_isa picks on an x86 without AMX


def init_cpu_memory_env(node_ids) -> None:
    return None


def cpu_attn_has_isa(isa: str) -> bool:
    return isa in ISAS


def get_scheduler_metadata(num_req, num_heads_q, num_heads_kv, head_dim, seq_lens, dtype, query_start_loc,
                           casual, window_size, isa_hint, enable_kv_split, dynamic_causal,
                           kv_cache_dtype="auto") -> torch.Tensor:
    _refuse_kv_dtype(kv_cache_dtype)
    if num_heads_q % num_heads_kv:
        raise ValueError(f"get_scheduler_metadata: num_heads_q {num_heads_q} must be a multiple of "
                         f"num_heads_kv {num_heads_kv}")
    return torch.zeros(0, dtype=torch.int32)


def cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, isa, k_scale=1.0, v_scale=1.0,
                               kv_cache_dtype="auto") -> None:
    """``key`` / ``value`` ``[T, G, D]`` into ``key_cache`` / ``value_cache`` ``[B, G, S, D]``
    at ``slot_mapping`` ``[T]`` (block * S + offset; a negative slot is a padding token)."""
    _refuse_kv_dtype(kv_cache_dtype)
    size = key_cache.size(2)
    slots = slot_mapping[: key.size(0)].long()
    keep = slots >= 0
    block, offset = slots[keep] // size, slots[keep] % size
    key_cache[block, :, offset] = key[keep].to(key_cache.dtype)
    value_cache[block, :, offset] = value[keep].to(value_cache.dtype)


def cpu_attention_with_kv_cache(query, key_cache, value_cache, output, query_start_loc, seq_lens, scale, causal,
                                alibi_slopes, sliding_window_size, block_table, softcap, scheduler_metadata, s_aux,
                                dynamic_causal, k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto") -> None:
    """``query`` ``[T, H, D]`` attends, per request, over its ``seq_lens`` cached tokens
    (``block_table`` ``[R, blocks]`` into the ``[B, G, S, D]`` caches); its query tokens are the
    last of its sequence. Writes ``output`` ``[T, H, D]``."""
    _refuse_kv_dtype(kv_cache_dtype)
    for name, value in (("alibi_slopes", alibi_slopes), ("s_aux", s_aux), ("dynamic_causal", dynamic_causal)):
        if value is not None:
            raise NotImplementedError(f"the testbed's cpu_attention_with_kv_cache takes no {name}")
    if softcap:
        raise NotImplementedError(f"the testbed's cpu_attention_with_kv_cache takes no softcap, got {softcap}")
    heads, groups, size = query.size(1), key_cache.size(1), key_cache.size(2)
    starts = query_start_loc.tolist()
    for r, length in enumerate(seq_lens.tolist()):
        q_tHD = query[starts[r]:starts[r + 1]].float()
        t = q_tHD.size(0)
        if t == 0:
            continue
        blocks = block_table[r, : -(-length // size)].long()
        k_LGD = key_cache[blocks].transpose(1, 2).reshape(-1, groups, key_cache.size(3))[:length].float()
        v_LGD = value_cache[blocks].transpose(1, 2).reshape(-1, groups, value_cache.size(3))[:length].float()
        k_LHD = k_LGD.repeat_interleave(heads // groups, dim=1)
        v_LHD = v_LGD.repeat_interleave(heads // groups, dim=1)
        scores_HtL = torch.einsum("thd,lhd->htl", q_tHD, k_LHD) * scale
        q_pos = torch.arange(length - t, length).unsqueeze(1)
        k_pos = torch.arange(length).unsqueeze(0)
        allowed = torch.ones(t, length, dtype=torch.bool)
        if causal:
            allowed &= k_pos <= q_pos
        if sliding_window_size >= 0:
            allowed &= k_pos > q_pos - sliding_window_size - 1
        scores_HtL = scores_HtL.masked_fill(~allowed, float("-inf"))
        out_tHD = torch.einsum("htl,lhd->thd", scores_HtL.softmax(-1), v_LHD)
        output[starts[r]:starts[r + 1]] = out_tHD.reshape(output[starts[r]:starts[r + 1]].shape).to(output.dtype)


def compute_slot_mapping_kernel_impl(query_start_loc, positions, block_table, slot_mapping, block_size) -> None:
    """``slot_mapping`` ``[max tokens]``: token t of request r at position p goes to slot
    ``block_table[r, p // S] * S + p % S``; the slots past the step's tokens are -1."""
    starts = query_start_loc.long()
    tokens = int(starts[-1])
    request_T = torch.bucketize(torch.arange(tokens), starts[1:], right=True)
    pos_T = positions[:tokens].long()
    blocks_T = block_table[request_T, pos_T // block_size].long()
    slot_mapping[:tokens] = blocks_T * block_size + pos_T % block_size
    slot_mapping[tokens:] = -1


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1).view(-1)


def _refuse_kv_dtype(kv_cache_dtype: str) -> None:
    if kv_cache_dtype not in ("auto", "bfloat16", "float16"):
        raise NotImplementedError(f"the testbed's CPU attention kernels keep the KV cache in the model's dtype; "
                                  f"kv_cache_dtype {kv_cache_dtype!r} is not one of them")


def define(schemas: dict[str, str], kernels: dict) -> torch.library.Library:
    """Each of ``schemas`` defined under vLLM's ``_C`` namespace with its kernel (``kernels``
    by name); an op a process's vLLM carries itself (a CPU build) is kept. Call once per
    process and keep the library alive: a library cannot define an op twice."""
    lib = torch.library.Library("_C", "FRAGMENT")
    for name, schema in schemas.items():
        if hasattr(torch.ops._C, name):
            continue
        lib.define(schema)
        lib.impl(name, kernels[name], "CompositeExplicitAutograd")
    return lib


@functools.cache
def register() -> torch.library.Library:
    """The ops under vLLM's ``_C`` namespace, once per process (kept alive by the cache)."""
    return define(SCHEMAS, globals())
