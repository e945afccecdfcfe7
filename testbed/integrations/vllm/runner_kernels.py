"""CPU kernels for the compiled ops of vLLM's standalone CPU model runner (0.34:
``StandaloneCPUModelRunner``, what vLLM runs on CPUs without Triton), which its CUDA wheel does
not carry: each registered under ``_C`` with the arguments ``vllm/_cpu_ops.py`` passes, in its
order, and computing what the Triton kernel of vLLM's GPU model runner that it stands for
computes (``v1/worker/gpu/input_batch.py``, ``block_table.py``, ``sample/prompt_logprob.py``), in
torch. What the testbed's engine runs never uses (draft tokens, sampling with a temperature,
logit biases) is refused naming the argument, never approximated.

Legend: R requests of the step (``idx_mapping`` maps each to its request-state row), T tokens
of the step, N rows of the request state, L its token capacity, B blocks per request, V vocab.
"""

from __future__ import annotations

import functools

import torch

from testbed.integrations.vllm.engine_kernels import define

SCHEMAS = {
    "prepare_prefill_inputs_cpu": (
        "prepare_prefill_inputs_cpu(Tensor(a0!) input_ids, Tensor(a1!) next_prefill_tokens, Tensor idx_mapping, "
        "Tensor query_start_loc, Tensor all_token_ids, Tensor prefill_len, Tensor num_computed_tokens) -> ()"),
    "prepare_pos_seq_lens_cpu": (
        "prepare_pos_seq_lens_cpu(Tensor idx_mapping, Tensor query_start_loc, Tensor num_computed_tokens, "
        "Tensor(a3!) pos, Tensor(a4!) seq_lens) -> ()"),
    "combine_sampled_and_draft_tokens_cpu": (
        "combine_sampled_and_draft_tokens_cpu(Tensor(a0!) input_ids, Tensor idx_mapping, Tensor last_sampled_tokens, "
        "Tensor query_start_loc, Tensor seq_lens, Tensor prefill_len, Tensor draft_tokens, Tensor cu_num_logits, "
        "int num_logits, int num_new_sampled_tokens) -> Tensor"),
    "post_update_cpu": (
        "post_update_cpu(Tensor idx_mapping, Tensor(a1!) num_computed_tokens, Tensor(a2!) last_sampled_tokens, "
        "Tensor(a3!)? output_bin_counts, Tensor sampled_tokens, Tensor num_sampled, Tensor num_rejected, "
        "Tensor? query_start_loc, Tensor(a8!) all_token_ids, Tensor(a9!) total_len) -> ()"),
    "gather_block_table_cpu": (
        "gather_block_table_cpu(Tensor block_table, Tensor(a1!) output, Tensor idx_mapping, Tensor num_blocks, "
        "int num_reqs_padded) -> ()"),
    "compute_slot_mapping_cpu": (
        "compute_slot_mapping_cpu(Tensor block_table, Tensor(a1!) slot_mapping, Tensor idx_mapping, "
        "Tensor query_start_loc, Tensor positions, int block_size, bool mapping_enabled, int pad_slot_id) -> ()"),
    "get_prompt_logprobs_token_ids_cpu": (
        "get_prompt_logprobs_token_ids_cpu(int num_tokens, Tensor query_start_loc, Tensor idx_mapping, "
        "Tensor num_computed_tokens, Tensor all_token_ids) -> Tensor"),
    "gumbel_sample_cpu": (
        "gumbel_sample_cpu(Tensor logits, Tensor expanded_idx_mapping, Tensor temperature, Tensor seeds, "
        "Tensor positions, bool apply_temperature, bool is_drafting, bool use_fp64) -> Tensor"),
}


def _rows(idx_mapping, query_start_loc):
    """Per request of the step: (its request-state row, its first token, its token count)."""
    starts = query_start_loc.tolist()
    return [(int(r), starts[b], starts[b + 1] - starts[b]) for b, r in enumerate(idx_mapping.tolist())]


def prepare_prefill_inputs_cpu(input_ids, next_prefill_tokens, idx_mapping, query_start_loc, all_token_ids,
                               prefill_len, num_computed_tokens) -> None:
    """A prefilling request's scheduled prompt tokens into ``input_ids`` [T], and its next
    ``next_prefill_tokens.size(0)`` prompt tokens (0 past the prompt) into its column of
    ``next_prefill_tokens`` [lookahead, N]; a decoding request is left alone."""
    lookahead = next_prefill_tokens.size(0)
    for req, start, length in _rows(idx_mapping, query_start_loc):
        prompt, done = int(prefill_len[req]), int(num_computed_tokens[req])
        if done >= prompt:
            continue
        input_ids[start:start + length] = all_token_ids[req, done:done + length].to(input_ids.dtype)
        for i in range(lookahead):
            pos = done + length + i
            next_prefill_tokens[i, req] = all_token_ids[req, pos] if pos < prompt else 0


def prepare_pos_seq_lens_cpu(idx_mapping, query_start_loc, num_computed_tokens, pos, seq_lens) -> None:
    """Each request's token positions into ``pos`` [T] and its sequence length (computed plus
    scheduled) into ``seq_lens`` [max requests], the rows past the step's requests 0."""
    requests = _rows(idx_mapping, query_start_loc)
    for b, (req, start, length) in enumerate(requests):
        done = int(num_computed_tokens[req])
        seq_lens[b] = done + length
        pos[start:start + length] = torch.arange(done, done + length, dtype=pos.dtype)
    seq_lens[len(requests):] = 0


def combine_sampled_and_draft_tokens_cpu(input_ids, idx_mapping, last_sampled_tokens, query_start_loc, seq_lens,
                                         prefill_len, draft_tokens, cu_num_logits, num_logits,
                                         num_new_sampled_tokens) -> torch.Tensor:
    """The step's logits indices [num_logits] (each request's last ``cu_num_logits`` tokens),
    and, for a request past its prompt, its last sampled token written where its step starts
    sampling. Draft tokens are refused (the testbed's engine runs no speculative decoding)."""
    if num_new_sampled_tokens not in (0, 1):
        raise ValueError(f"num_new_sampled_tokens must be 0 or 1, got {num_new_sampled_tokens}")
    logits_indices = torch.empty(num_logits, dtype=torch.int64)
    cu = cu_num_logits.tolist()
    ends = query_start_loc.tolist()[1:]
    for b, req in enumerate(idx_mapping.tolist()):
        logits = cu[b + 1] - cu[b]
        if logits - num_new_sampled_tokens > 0:
            raise NotImplementedError("the testbed's combine_sampled_and_draft_tokens_cpu takes no draft tokens, "
                                      f"got {logits - num_new_sampled_tokens} for request {b}")
        first = ends[b] - logits
        logits_indices[cu[b]:cu[b + 1]] = torch.arange(first, ends[b])
        seq_len, prompt = int(seq_lens[b]), int(prefill_len[req])
        if seq_len > prompt and num_new_sampled_tokens > 0 and seq_len - logits >= prompt:
            input_ids[first] = last_sampled_tokens[req]
    return logits_indices


def post_update_cpu(idx_mapping, num_computed_tokens, last_sampled_tokens, output_bin_counts, sampled_tokens,
                    num_sampled, num_rejected, query_start_loc, all_token_ids, total_len) -> None:
    """After a step, per request (a negative row is skipped): its sampled tokens appended to
    ``all_token_ids`` [N, L] (and counted in ``output_bin_counts`` [N, V]), the last one kept
    as its last sampled token, its length and computed-token count advanced."""
    starts = query_start_loc.tolist() if query_start_loc is not None else None
    for b, req in enumerate(idx_mapping.tolist()):
        if req < 0:
            continue
        length, sampled = int(total_len[req]), int(num_sampled[b])
        if sampled > 0:
            tokens = sampled_tokens[b, :sampled]
            last_sampled_tokens[req] = tokens[-1]
            total_len[req] = length + sampled
            all_token_ids[req, length:length + sampled] = tokens.to(all_token_ids.dtype)
            if output_bin_counts is not None:
                for token in tokens.tolist():
                    output_bin_counts[req, token] += 1
        query = starts[b + 1] - starts[b] if starts is not None else 0
        num_computed_tokens[req] += query - int(num_rejected[b])


def gather_block_table_cpu(block_table, output, idx_mapping, num_blocks, num_reqs_padded) -> None:
    """Each step request's block ids (its ``num_blocks``) from its request-state row of
    ``block_table`` [N, B] into its row of ``output`` [rows, B]; padding rows up to
    ``num_reqs_padded`` zero."""
    requests = idx_mapping.tolist()
    for b, req in enumerate(requests):
        count = int(num_blocks[req])
        output[b, :count] = block_table[req, :count]
    output[len(requests):num_reqs_padded] = 0


def compute_slot_mapping_cpu(block_table, slot_mapping, idx_mapping, query_start_loc, positions, block_size,
                             mapping_enabled, pad_slot_id) -> None:
    """Each scheduled token's KV-cache slot into ``slot_mapping`` [max tokens]: block
    ``block_table[request row, pos // block_size] * block_size + pos % block_size``; a dummy
    request (negative row) or a group without slot mapping gets ``pad_slot_id``, as do the
    slots past the step's tokens."""
    for req, start, length in _rows(idx_mapping, query_start_loc):
        pos = positions[start:start + length].long()
        if not mapping_enabled or req < 0:
            slot_mapping[start:start + length] = pad_slot_id
            continue
        blocks = block_table[req, pos // block_size].long()
        slot_mapping[start:start + length] = (blocks * block_size + pos % block_size).to(slot_mapping.dtype)
    slot_mapping[int(query_start_loc[-1]):] = pad_slot_id


def get_prompt_logprobs_token_ids_cpu(num_tokens, query_start_loc, idx_mapping, num_computed_tokens,
                                      all_token_ids) -> torch.Tensor:
    """Per scheduled token, the id of the token after it (whose prompt logprob it gives) [T]."""
    token_ids = torch.empty(num_tokens, dtype=torch.int64)
    for req, start, length in _rows(idx_mapping, query_start_loc):
        after = int(num_computed_tokens[req]) + 1
        token_ids[start:start + length] = all_token_ids[req, after:after + length].long()
    return token_ids


def gumbel_sample_cpu(logits, expanded_idx_mapping, temperature, seeds, positions, apply_temperature, is_drafting,
                      use_fp64) -> torch.Tensor:
    """Greedy rows (temperature 0) take their first maximum; the testbed samples greedily,
    so a row with a temperature is refused."""
    temps = temperature[expanded_idx_mapping.long()]
    if bool((temps != 0).any()):
        raise NotImplementedError("the testbed's gumbel_sample_cpu samples greedily (temperature 0), got "
                                  f"temperatures {sorted(set(temps.tolist()))}")
    return logits.argmax(dim=-1).view(-1)


@functools.cache
def register() -> torch.library.Library:
    """The ops under vLLM's ``_C`` namespace, once per process (kept alive by the cache)."""
    return define(SCHEMAS, globals())
