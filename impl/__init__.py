"""The integration under test (what would be upstreamed into vLLM).

Talks to FlashInfer only through one resolved backend handle; never imports ``fakes`` or
``testbed``. Its modules arrive with the impl issue; this package is the layout's anchor.
"""
