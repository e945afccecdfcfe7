# An excerpt: the definitions SGLang's findings read (Finding.code); 0.5.23's file has these.
# FusedMoE.forward_impl, lines 1709-1746 of 0.5.23's sglang/srt/layers/moe/fused_moe_triton/layer.py
    def forward_impl(
        self,
        hidden_states: torch.Tensor,
        topk_output: TopKOutput,
        pre_quant_input: Optional[Tuple] = None,
    ):
        origin_hidden_states_dim = hidden_states.shape[-1]
        assert self.quant_method is not None

        if self._dwdp_bound:
            dwdp_mgr = get_global_dwdp_manager()
            dwdp_mgr.wait_prefetch(self.layer_id)

        dispatch_output = self._dispatch_with_pre_quant(
            hidden_states, topk_output, pre_quant_input
        )

        combine_input = self.run_moe_core(
            dispatch_output=dispatch_output,
        )

        if self._dwdp_bound:
            dwdp_mgr.record_compute_and_prefetch_next(self.layer_id)

        with use_symmetric_memory(
            get_parallel().tp_group, disabled=not is_allocation_symmetric()
        ):
            final_hidden_states = self.dispatcher.combine(combine_input=combine_input)

            # TODO: should we add some conditions here?
            final_hidden_states = final_hidden_states[
                ..., :origin_hidden_states_dim
            ].contiguous()

        if self.reduce_results and (self.moe_tp_size > 1 or self.moe_ep_size > 1):
            final_hidden_states = tensor_model_parallel_all_reduce(final_hidden_states)

        return final_hidden_states
