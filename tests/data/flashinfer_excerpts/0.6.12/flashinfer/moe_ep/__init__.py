# Excerpt of FlashInfer 0.6.12 (moe_ep/__init__.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
__all__ = ['MoEEpNotBuiltError', 'have_nccl_ep', 'have_nixl_ep', 'available_backends']
_pkg_dir = None
_REBUILD_HINT = None

class MoEEpNotBuiltError:
    ...

def _probe_nccl_ep():
    ...

def _probe_nixl_ep():
    ...

def have_nccl_ep():
    ...

def have_nixl_ep():
    ...

def available_backends():
    ...

def _require_built():
    ...
_set_build_flags = None
