"""The integration under test: what would be upstreamed into vLLM.

It reaches FlashInfer only through the handle :func:`impl.backend.resolve_backend` returns
(the real package or the CPU fake), and never imports ``fakes`` or ``testbed`` itself.

Modules: ``backend`` (which FlashInfer), ``communicator`` (FlashInfer's ``CommBackend`` over a
torch process group), ``compat`` (signature probing), ``quant`` (formats, the dispatch byte
layout, reference activation quantizers), ``forward_context`` (tokens per DP rank),
``one_sided`` / ``two_sided`` (managers and prepare/finalize), ``gather`` (all-gather /
reduce-scatter and expert-parallel-off prepare/finalize, over ``collectives``), ``parallel``
(the parallel config and the support table), ``factory`` (a backend by name), ``moe_layer``
(the layer: sequence parallel, shared experts, the reduce contract), ``moe_output`` (the output
contract and its consumer), ``experts`` (the TRT-LLM kernels as experts).
"""
