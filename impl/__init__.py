"""The integration under test: what would be upstreamed into vLLM.

It reaches FlashInfer only through the handle :func:`impl.backend.resolve_backend` returns
(the real package or the CPU fake), and never imports ``fakes`` or ``testbed`` itself.

Modules: ``backend`` (which FlashInfer), ``communicator`` (FlashInfer's ``CommBackend`` over a
torch process group), ``compat`` (signature probing), ``quant`` (formats, the dispatch byte
layout, reference activation quantizers), ``forward_context`` (tokens per DP rank),
``one_sided`` / ``two_sided`` (managers and prepare/finalize), ``moe_layer`` (the caller's
side of the reduce contract).
"""
