# An excerpt: the definitions SGLang's findings read (Finding.code); 0.5.18's file has these.
# ServerArgs._handle_a2a_moe, lines 6882-7010 of 0.5.18's sglang/srt/server_args.py
    def _handle_a2a_moe(self):
        # The backend overrides and the ep_size=tp_size adjustments moved to
        # the resolution pipeline (arg_groups/overrides.py:
        # _a2a_backend_overrides / _a2a_ep_size); the per-backend logs,
        # asserts, fusion/deepep_mode/env/cuda-graph writes stay below.
        from sglang.srt.arg_groups.overrides import (
            _a2a_backend_overrides,
            _a2a_ep_size,
            _a2a_fusion_adjustments,
            run_post_process_pass,
        )

        run_post_process_pass(self, _a2a_backend_overrides)
        run_post_process_pass(self, _a2a_ep_size)

        # The a2a-driven shared-experts fusion adjustments moved to the
        # pipeline (arg_groups/overrides.py: _a2a_fusion_adjustments),
        # invoked here at the legacy write slots.
        run_post_process_pass(self, _a2a_fusion_adjustments)

        a2a_backend = resolved_view(self).moe_a2a_backend
        if self.enable_waterfill:
            self.enforce_shared_experts_fusion = True
            logger.info(f"Waterfill is enabled with moe_a2a_backend='{a2a_backend}'.")

        if a2a_backend == "deepep":
            if self.moe_runner_backend == "flashinfer_cutedsl":
                if self.deepep_mode == "auto":
                    self.deepep_mode = "low_latency"
                    logger.warning(
                        "Forcing --deepep-mode low_latency: flashinfer_cutedsl "
                        "FP4 MoE has no DeepEP normal-dispatch handler, so "
                        "deepep auto mode would crash during prefill. "
                        "low_latency covers both prefill and decode."
                    )
                elif self.deepep_mode == "normal":
                    raise ValueError(
                        "flashinfer_cutedsl FP4 MoE only supports DeepEP "
                        "low_latency dispatch (masked layout). DeepEP normal "
                        "(prefill) dispatch has no CuteDSL FP4 handler. Pass "
                        "--deepep-mode low_latency or auto."
                    )
            if self.deepep_mode == "normal":
                logger.warning("Cuda graph is disabled because deepep_mode=`normal`")
                self.cuda_graph_config.decode.backend = Backend.DISABLED
                self.cuda_graph_config.prefill.backend = Backend.DISABLED

        if (
            self.moe_a2a_backend == "none" and is_npu()
        ) or self.moe_a2a_backend == "ascend_tp":
            # FIXME (OrangeRedeng): for some reasons if pass "ascend_tp" accuracy drops to zero
            self.moe_a2a_backend = "none"

        if self.moe_a2a_backend == "flashinfer":
            assert (
                resolved_view(self).enable_dp_attention and self.dp_size == self.tp_size
            ), "Flashinfer MoE A2A is only supported with dp_size == tp_size and --enable-dp-attention"
            if self.deepep_mode != "auto":
                logger.warning("--deepep-mode is ignored for Flashinfer MoE A2A")
            if not envs.SGLANG_MOE_NVFP4_DISPATCH.is_set() and (
                resolved_view(self).quantization == "modelopt_fp4"
                or self.get_model_config().nvfp4_moe_meta is not None
            ):
                envs.SGLANG_MOE_NVFP4_DISPATCH.set(True)
                logger.warning(
                    "SGLANG_MOE_NVFP4_DISPATCH is set to True for Flashinfer MoE A2A"
                )
            assert resolved_view(self).moe_runner_backend in [
                "flashinfer_cutlass",
                "flashinfer_cutedsl",
                "flashinfer_trtllm_routed",
            ], "Flashinfer MoE A2A is only supported with flashinfer_cutlass, flashinfer_cutedsl or flashinfer_trtllm_routed moe runner backend"

        if a2a_backend == "mori":
            if self.deepep_mode == "auto":
                self.deepep_mode = "normal"
                logger.warning("auto set deepep_mode=`normal` for MORI EP")

            # Check chunked prefill for mori
            # Skip validation if chunked prefill is disabled (i.e., size <= 0).
            # Skip validation if disaggregation mode is decode.
            if self.chunked_prefill_size > 0 and self.disaggregation_mode != "decode":
                assert (
                    self._required_mori_dispatch_tokens_per_rank()
                ) <= envs.SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK.get(), (
                    "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK (default 4096) "
                    "must be >= the per-rank MoRI dispatch tokens "
                    "(chunked_prefill_size by default)"
                )

        if a2a_backend == "pplx":
            if self.deepep_mode == "normal":
                raise ValueError(
                    "moe_a2a_backend='pplx' only supports low-latency mode; "
                    "set --deepep-mode to 'low_latency' or 'auto'."
                )
            if self.deepep_mode == "auto":
                self.deepep_mode = "low_latency"
                logger.warning("auto set deepep_mode=`low_latency` for PPLX EP")
            # pplx-kernels' AllToAll needs numDPGroups (== attention dp_size) > 1;
            # without DP attention numDPGroups == 1 and construction fails deep in
            # the kernel. This also implies ep_size >= 2.
            assert resolved_view(self).enable_dp_attention and self.dp_size >= 2, (
                "moe_a2a_backend='pplx' requires --enable-dp-attention with at "
                "least 2 DP groups (--dp-size >= 2)."
            )
            # pplx runs the masked DeepGEMM expert path (sm_90a): reject other
            # runners and resolve auto -> deep_gemm. Unquantized bf16 pplx needs
            # an explicit deep_gemm backend, otherwise the expert layer falls
            # through to the deprecated masked path and asserts at runtime.
            assert resolved_view(self).moe_runner_backend in ("deep_gemm", "auto"), (
                "moe_a2a_backend='pplx' is only supported with --moe-runner-backend "
                "deep_gemm (or auto)."
            )
            if self.moe_runner_backend == "auto":
                self.moe_runner_backend = "deep_gemm"
                logger.warning("auto set moe_runner_backend=`deep_gemm` for PPLX EP")

            # Check per-rank dispatch tokens for pplx
            # Skip validation if chunked prefill is disabled (i.e., size <= 0)
            # Skip validation if disaggregation mode is decode
            if self.chunked_prefill_size > 0 and self.disaggregation_mode != "decode":
                assert (
                    self._required_pplx_dispatch_tokens_per_rank()
                ) <= envs.SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK.get(), (
                    "SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK (default 128) "
                    "must be >= the per-rank pplx dispatch tokens "
                    "(chunked_prefill_size, or the decode cuda-graph batch size)"
                )
