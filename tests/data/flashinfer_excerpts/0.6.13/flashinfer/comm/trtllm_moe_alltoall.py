# Excerpt of FlashInfer 0.6.13 (comm/trtllm_moe_alltoall.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .mnnvl import MnnvlMemory, MnnvlConfig
from .mapping import Mapping

class _A2AState:
    ...

@functools.cache
def get_moe_alltoall_module():
    return SimpleNamespace(moe_a2a_initialize=moe_a2a_initialize, moe_a2a_dispatch=moe_a2a_dispatch, moe_a2a_combine=moe_a2a_combine, moe_a2a_sanitize_expert_ids=moe_a2a_sanitize_expert_ids, moe_a2a_get_metainfo_index_pairs=moe_a2a_get_metainfo_index_pairs, moe_a2a_get_aux_data_size=moe_a2a_get_aux_data_size)

@flashinfer_api
def moe_a2a_initialize(workspace: torch.Tensor, ep_rank: int, ep_size: int, max_num_tokens: int):
    return get_moe_alltoall_module().moe_a2a_initialize(workspace, ep_rank, ep_size, max_num_tokens)

@flashinfer_api
def moe_a2a_wrap_payload_tensor_in_workspace(workspace: torch.Tensor, leading_shape: list[int], slice_start: int, slice_end: int, dtype: torch.dtype) -> torch.Tensor:
    return result

@flashinfer_api
def moe_a2a_dispatch(token_selected_experts: torch.Tensor, input_payloads: list[torch.Tensor], workspace: torch.Tensor, metainfo: torch.Tensor, runtime_max_tokens_per_rank: int, ep_rank: int, ep_size: int, top_k: int, num_experts: int):
    return (output_payloads, combine_payload_offset)

@flashinfer_api
def moe_a2a_combine(payload: torch.Tensor, local_num_tokens: int, workspace: torch.Tensor, metainfo: torch.Tensor, runtime_max_tokens_per_rank: int, ep_rank: int, ep_size: int, top_k: int, combine_payload_offset: int, payload_in_workspace: bool=False) -> torch.Tensor:
    return get_moe_alltoall_module().moe_a2a_combine(payload, local_num_tokens, workspace, metainfo, runtime_max_tokens_per_rank, ep_rank, ep_size, top_k, combine_payload_offset, payload_in_workspace)

@flashinfer_api
def moe_a2a_sanitize_expert_ids(expert_ids: torch.Tensor, workspace: torch.Tensor, metainfo: torch.Tensor, ep_rank: int, invalid_expert_id: int):
    return get_moe_alltoall_module().moe_a2a_sanitize_expert_ids(expert_ids, workspace, metainfo, ep_rank, invalid_expert_id)

@flashinfer_api
def moe_a2a_get_workspace_size_per_rank(ep_size: int, max_num_tokens: int, total_dispatch_payload_size_per_token: int, combine_payload_size_per_token: int):
    return pad_up(aux_data_size, 128) + pad_up(ep_size * max_num_tokens * total_dispatch_payload_size_per_token, 128) + pad_up(ep_size * max_num_tokens * combine_payload_size_per_token, 128)

class MoeAlltoAll:
    """
    Manages MoE All-to-All operations with proper workspace allocation and synchronization.

    This class provides the throughput-optimized backend that supports multiple payloads
    per collective operation, explicit dispatch/combine phases, and workspace-backed tensors.

    Example:
        >>> moe_a2a = MoeAlltoAll(mapping, max_num_tokens=2048, top_k=2, num_experts=8)
        >>> recv = moe_a2a.dispatch(experts, [hidden, ids, scales], batch_size)
        >>> output = moe_a2a.combine(processed, batch_size)
    """
    _WORKSPACE_CACHE: dict[tuple[int, int, int, int], dict] = {}

    @classmethod
    def get_workspace(cls, workspace_size_per_rank: int, ep_rank: int, ep_size: int, max_num_tokens: int, mapping: Mapping) -> dict:
        key = (workspace_size_per_rank, ep_rank, ep_size, max_num_tokens)
        if key in cls._WORKSPACE_CACHE:
            return cls._WORKSPACE_CACHE[key]
        else:
            mnnvl_mem = MnnvlMemory(mapping, workspace_size_per_rank)
            workspace = mnnvl_mem.as_torch_strided_tensor(torch.uint8)
            metainfo = moe_a2a_initialize(workspace, ep_rank, ep_size, max_num_tokens)
            cls._WORKSPACE_CACHE[key] = {'workspace_size_per_rank': workspace_size_per_rank, 'max_num_tokens': max_num_tokens, 'ep_rank': ep_rank, 'ep_size': ep_size, 'mnnvl_mem': mnnvl_mem, 'workspace': workspace, 'metainfo': metainfo}
            return cls._WORKSPACE_CACHE[key]

    @staticmethod
    @flashinfer_api
    def get_moe_workspace_size_per_rank(ep_size: int, top_k: int, max_num_tokens: int, hidden_size: int, extra_payload_bytes_per_token: int=0) -> int:
        """Compute the per-rank workspace size for the MoE all-to-all primitive.

        Convenience wrapper around :func:`moe_a2a_get_workspace_size_per_rank`
        that derives the dispatch / combine payload sizes from
        ``hidden_size`` and ``top_k`` assuming 16-bit hidden states.  For a
        tighter bound on quantized models use
        :func:`moe_a2a_get_workspace_size_per_rank` directly.

        Parameters
        ----------
        ep_size : int
            Total expert-parallel world size.
        top_k : int
            Number of experts assigned per token.
        max_num_tokens : int
            Maximum number of tokens across all ranks.
        hidden_size : int
            Hidden dimension size.
        extra_payload_bytes_per_token : int
            Extra payload bytes per token to reserve (e.g. for quantization
            scales).  Defaults to ``0``.

        Returns
        -------
        int
            Required workspace size per rank, in bytes.
        """
        element_size = 2
        total_dispatch_payload_size_per_token = int(hidden_size * element_size) + top_k * 4 + top_k * 4 + extra_payload_bytes_per_token
        combine_payload_size_per_token = int(hidden_size * element_size)
        return moe_a2a_get_workspace_size_per_rank(ep_size, max_num_tokens, total_dispatch_payload_size_per_token, combine_payload_size_per_token)
    _METAINFO_INDEX: Optional[dict] = None

    @classmethod
    def _init_constants(cls):
        """Initialize constants from C++ if not already done."""
        if cls._METAINFO_INDEX is None:
            module = get_moe_alltoall_module()
            names, values = module.moe_a2a_get_metainfo_index_pairs()
            cls._METAINFO_INDEX = {}
            for name, value in zip(names, values, strict=True):
                clean_name = name.replace('MOE_A2A_', '') if name.startswith('MOE_A2A_') else name
                cls._METAINFO_INDEX[clean_name] = int(value)

    def __init__(self, mapping: Mapping, max_num_tokens: int, top_k: int, num_experts: int, workspace_size_per_rank: int=None, hidden_size: int=None, mnnvl_config: Optional[MnnvlConfig]=None):
        """Initialize :class:`MoeAlltoAll` and allocate the shared workspace.

        Parameters
        ----------
        mapping : Mapping
            Mapping object describing the parallel layout (must expose
            ``moe_ep_rank`` and ``moe_ep_size``).
        max_num_tokens : int
            Maximum number of tokens this rank will dispatch in any single
            call.
        top_k : int
            Number of experts assigned per token.
        num_experts : int
            Total number of experts (across all ranks).
        workspace_size_per_rank : int, optional
            Pre-computed workspace size in bytes per rank.  When ``None``,
            ``hidden_size`` must be provided and the workspace is sized via
            :meth:`get_moe_workspace_size_per_rank`.
        hidden_size : int, optional
            Hidden dimension size, used to derive
            ``workspace_size_per_rank`` when the latter is omitted.
        mnnvl_config : MnnvlConfig, optional
            Optional configuration for the underlying MNNVL communication
            backend.
        """
        self._init_constants()
        if workspace_size_per_rank is None:
            assert hidden_size is not None, 'hidden_size must be provided if workspace_size_per_rank is not provided'
            workspace_size_per_rank = self.get_moe_workspace_size_per_rank(mapping.moe_ep_size, top_k, max_num_tokens, hidden_size)
        MnnvlMemory.initialize()
        if mnnvl_config:
            MnnvlMemory.set_comm_from_config(mapping, mnnvl_config)
        self.workspace_size_per_rank = workspace_size_per_rank
        self.max_num_tokens = max_num_tokens
        self.ep_size = mapping.moe_ep_size
        self.ep_rank = mapping.moe_ep_rank
        self.top_k = top_k
        self.num_experts = num_experts
        if not isinstance(self.top_k, int) or self.top_k <= 0:
            raise ValueError('top_k must be a positive int')
        if not isinstance(self.num_experts, int) or self.num_experts <= 0:
            raise ValueError('num_experts must be a positive int')
        self._WORKSPACE = self.get_workspace(workspace_size_per_rank, self.ep_rank, self.ep_size, self.max_num_tokens, mapping)
        assert self._WORKSPACE['workspace_size_per_rank'] == workspace_size_per_rank, 'Workspace size mismatch'
        assert self._WORKSPACE['max_num_tokens'] == self.max_num_tokens, 'Max tokens mismatch'
        assert self._WORKSPACE['ep_rank'] == self.ep_rank, 'EP rank mismatch'
        assert self._WORKSPACE['ep_size'] == self.ep_size, 'EP size mismatch'
        self.mnnvl_mem = self._WORKSPACE['mnnvl_mem']
        self.workspace = self._WORKSPACE['workspace']
        self.metainfo = self._WORKSPACE['metainfo']
        self._state = _A2AState()

    def _reset_workspace(self):
        """Reset the workspace to free up its state. This is mainly used for testing. Use this with caution. This object is no longer usable after this."""
        torch.cuda.synchronize()
        del self._WORKSPACE
        del self._WORKSPACE_CACHE[self.workspace_size_per_rank, self.ep_rank, self.ep_size, self.max_num_tokens]
        self._state.phase = 'deleted'

    @flashinfer_api
    def dispatch(self, token_selected_experts: torch.Tensor, input_payloads: list[torch.Tensor], runtime_max_tokens_per_rank: int, invalid_token_expert_id: Optional[int]=None, expert_id_payload_index: Optional[int]=None) -> list[torch.Tensor]:
        """Run the MoE all-to-all dispatch phase.

        Parameters
        ----------
        token_selected_experts : torch.Tensor
            ``[local_num_tokens, top_k]`` ``int32`` tensor of expert
            assignments.
        input_payloads : list[torch.Tensor]
            Per-token payload tensors, each shaped ``[local_num_tokens, *]``.
        runtime_max_tokens_per_rank : int
            Maximum tokens per rank in this batch.  Must be ``<=``
            ``max_num_tokens`` used at construction.
        invalid_token_expert_id : int, optional
            If supplied, expert IDs not owned by the current rank are
            rewritten to this value.  Requires ``expert_id_payload_index``.
        expert_id_payload_index : int, optional
            Index into ``input_payloads`` that holds the expert IDs to
            sanitize.  Required when ``invalid_token_expert_id`` is set.

        Returns
        -------
        list[torch.Tensor]
            Workspace-backed receive tensors, one per ``input_payloads``
            entry, each shaped ``[ep_size, runtime_max_tokens_per_rank, *]``.
        """
        assert self._state.phase == 'idle', 'dispatch called twice without combine'
        assert runtime_max_tokens_per_rank <= self.max_num_tokens, 'runtime_max_tokens_per_rank exceeds max_num_tokens'
        recv_tensors, combine_payload_offset = moe_a2a_dispatch(token_selected_experts, input_payloads, self.workspace, self.metainfo, runtime_max_tokens_per_rank, self.ep_rank, self.ep_size, self.top_k, self.num_experts)
        self._state.local_num_tokens = token_selected_experts.size(0)
        self._state.combine_payload_offset = combine_payload_offset
        self._state.phase = 'dispatched'
        if invalid_token_expert_id is not None:
            assert expert_id_payload_index is not None, 'expert_id_payload_index required when invalid_token_expert_id is set'
            recv_expert_ids = recv_tensors[expert_id_payload_index]
            moe_a2a_sanitize_expert_ids(recv_expert_ids, self.workspace, self.metainfo, self.ep_rank, invalid_token_expert_id)
        return recv_tensors

    @flashinfer_api
    def combine(self, payload: torch.Tensor, runtime_max_tokens_per_rank: int, payload_in_workspace: bool=False) -> torch.Tensor:
        """Run the MoE all-to-all combine phase.

        Parameters
        ----------
        payload : torch.Tensor
            ``[ep_size, runtime_max_tokens_per_rank, elements_per_token]``
            output payload to scatter back to source ranks.
        runtime_max_tokens_per_rank : int
            Maximum tokens per rank in this batch (same value passed to
            :meth:`dispatch`).
        payload_in_workspace : bool
            ``True`` if ``payload`` is already a workspace-backed view (skips
            the staging copy).  Defaults to ``False``.

        Returns
        -------
        torch.Tensor
            ``[local_num_tokens, elements_per_token]`` combined tensor.
        """
        assert self._state.phase == 'dispatched', 'combine called before successful dispatch'
        assert runtime_max_tokens_per_rank <= self.max_num_tokens, 'runtime_max_tokens_per_rank exceeds max_num_tokens'
        output = moe_a2a_combine(payload, self._state.local_num_tokens, self.workspace, self.metainfo, runtime_max_tokens_per_rank, self.ep_rank, self.ep_size, self.top_k, self._state.combine_payload_offset, payload_in_workspace)
        self._state = _A2AState()
        return output

    @flashinfer_api
    def get_combine_payload_tensor_in_workspace(self, runtime_max_tokens_per_rank: int, hidden_size: int, dtype: torch.dtype) -> torch.Tensor:
        """Return a workspace-backed view to use as the combine payload.

        Zero-copy variant of :meth:`combine`: experts can write directly
        into the returned tensor and call :meth:`combine` with
        ``payload_in_workspace=True``.  Must be called after a successful
        :meth:`dispatch` and before :meth:`combine`.

        Parameters
        ----------
        runtime_max_tokens_per_rank : int
            Maximum tokens per rank in this batch.
        hidden_size : int
            Hidden dimension size.
        dtype : torch.dtype
            Element dtype of the resulting view.

        Returns
        -------
        torch.Tensor
            ``[ep_size, runtime_max_tokens_per_rank, hidden_size]``
            workspace-backed tensor.

        Raises
        ------
        RuntimeError
            If called before a successful :meth:`dispatch`.
        """
        if self._state.phase != 'dispatched':
            raise RuntimeError('get_combine_payload_tensor_in_workspace called before successful dispatch')
        element_size = torch.tensor([], dtype=dtype).element_size()
        return moe_a2a_wrap_payload_tensor_in_workspace(self.workspace[self.ep_rank, :], [self.ep_size, runtime_max_tokens_per_rank], self._state.combine_payload_offset, self._state.combine_payload_offset + self.ep_size * runtime_max_tokens_per_rank * hidden_size * element_size, dtype)
__all__ = ['MoeAlltoAll', 'moe_a2a_combine', 'moe_a2a_dispatch', 'moe_a2a_get_workspace_size_per_rank', 'moe_a2a_initialize', 'moe_a2a_sanitize_expert_ids', 'moe_a2a_wrap_payload_tensor_in_workspace']
