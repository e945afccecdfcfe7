# An excerpt: the definitions SGLang's findings read (Finding.code); 0.5.21's file has these.
# should_skip_post_experts_all_reduce, lines 760-769 of 0.5.21's sglang/srt/layers/moe/utils.py
def should_skip_post_experts_all_reduce(*, is_tp_path: bool) -> bool:
    """Whether the MoE block should leave out its post-experts all-reduce: a later
    step runs it (fused into the next norm, or as the reduce-scatter back to the
    local tokens), or there is nothing to sum.

    Pass ``is_tp_path=True`` for the TP all-reduce, ``False`` for the EP one.
    """
    return should_skip_mlp_all_reduce() or post_experts_output_is_complete(
        is_tp_path=is_tp_path
    )

# post_experts_output_is_complete, lines 741-757 of 0.5.21's sglang/srt/layers/moe/utils.py
def post_experts_output_is_complete(*, is_tp_path: bool) -> bool:
    """Whether the experts' output owes no sum over the MoE-TP group
    (``is_tp_path=True``) or the EP group: the combine already summed it, or each
    rank computed its own tokens in full.

    This is a property of the MoE configuration. Whether the MoE block or a later
    step runs a sum that is still owed is decided separately.
    """
    if get_parallel().dwdp_size > 1:
        return True
    if is_tp_path and should_use_flashinfer_cutlass_moe_fp4_allgather():
        # The combine reduce-scatters back to the local tokens.
        return True
    a2a = get_moe_a2a_backend()
    # The flashinfer and pplx combines, and the megamoe kernel's internal
    # combine, sum each token's expert outputs back to its source rank.
    return a2a.is_flashinfer() or a2a.is_pplx() or a2a.is_flashinfer_megamoe()
