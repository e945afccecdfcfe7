# Excerpt of FlashInfer 0.6.4 (comm/__init__.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .mapping import Mapping
from .trtllm_moe_alltoall import MoeAlltoAll as MoeAlltoAll
from .trtllm_moe_alltoall import moe_a2a_combine as moe_a2a_combine
from .trtllm_moe_alltoall import moe_a2a_dispatch as moe_a2a_dispatch
from .trtllm_moe_alltoall import moe_a2a_initialize as moe_a2a_initialize
from .trtllm_moe_alltoall import moe_a2a_get_workspace_size_per_rank as moe_a2a_get_workspace_size_per_rank
from .trtllm_moe_alltoall import moe_a2a_sanitize_expert_ids as moe_a2a_sanitize_expert_ids
from .trtllm_moe_alltoall import moe_a2a_wrap_payload_tensor_in_workspace as moe_a2a_wrap_payload_tensor_in_workspace
