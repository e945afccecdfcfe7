# Excerpt of FlashInfer 0.7.4 (comm/mnnvl.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
logger = None
from .mapping import Mapping
from .abstractions import CommBackend
from .comm_backend import TorchDistBackend
OMPI_COMM_TYPE_HOST = None
SIGNAL_PAD_SIZE = None
MNNVL_DEBUG = None

def round_up():
    ...

def create_tensor_from_cuda_memory():
    ...

def test_cuda_memory_access():
    ...

def alloc_and_copy_to_cuda():
    ...

@dataclass
class MnnvlConfig:
    comm_backend: Optional[CommBackend] = None
    allocation_granularity: int = 0
    fabric_page_size: int = 1 << 29

class _MnnvlAllocationRecord:
    ...

class MnnvlMemory:
    initialized: bool = False
    current_mem_offset: int = 0
    current_rank_stride: int = 0
    current_start_address: int = 0
    allocation_granularity: int = 0
    fabric_page_size: int = 1 << 29
    comm: Optional[CommBackend] = None
    dev_id: int = None
    allocated_map: Dict[int, Any] = {}
    address_refcnt: Dict[int, Any] = {}
    config: Optional[MnnvlConfig] = None

    def __init__(self, mapping: Mapping, size: int):
        self.mapping = mapping
        self.segment_size = size
        self.ptr, self.rank_stride = MnnvlMemory.open_mnnvl_memory(self.mapping, size)

    def __del__(self):
        if not sys.is_finalizing():
            if hasattr(self, 'ptr'):
                MnnvlMemory.close_mnnvl_memory(self.ptr)

    @property
    def mapped(self) -> bool:
        return MnnvlMemory.allocated_map[self.ptr].mapped

    @property
    def fabric_handles(self) -> bool:
        """True if the allocation is shared through FABRIC handles, False for
        POSIX file descriptors."""
        return MnnvlMemory.allocated_map[self.ptr].handle_type == _FABRIC_HANDLE

    @property
    def local_mem_handle(self) -> int:
        """This rank's ``CUmemGenericAllocationHandle`` backing the allocation."""
        record = MnnvlMemory.allocated_map[self.ptr]
        return int(record.mem_handles[record.comm_rank])

    def as_torch_strided_tensor(self, dtype):
        num_segments = MnnvlMemory.comm.Get_size()
        return pack_strided_memory(self.ptr, self.segment_size, self.rank_stride, num_segments, dtype, MnnvlMemory.dev_id, owner=self)

    @staticmethod
    def initialize():
        if not MnnvlMemory.initialized:
            _ = torch.empty(1, device='cuda')
            try:
                pynvml.nvmlDeviceGetCount()
            except pynvml.NVMLError_Uninitialized:
                pynvml.nvmlInit()
            MnnvlMemory.initialized = True

    @staticmethod
    def set_comm_from_config(mapping: Mapping, config: MnnvlConfig=None):
        MnnvlMemory.config = config or MnnvlConfig(comm_backend=MPIBackend())
        comm = config.comm_backend.Split(mapping.pp_rank * mapping.cp_size + mapping.cp_rank, mapping.tp_rank)
        MnnvlMemory.comm = comm

    @staticmethod
    def get_comm(mapping: Mapping):
        if MnnvlMemory.comm is not None:
            return MnnvlMemory.comm
        comm = MpiComm().Split(mapping.pp_rank * mapping.cp_size + mapping.cp_rank, mapping.tp_rank)
        MnnvlMemory.comm = comm
        return comm

    @staticmethod
    def uses_fabric_handles(comm: CommBackend, dev_id: int) -> bool:
        """Return True if MNNVL memory shared over ``comm`` starts with FABRIC
        handles.

        Collective over ``comm``. This is the precheck of
        :func:`choose_mnnvl_handle_type`: a FABRIC allocation that fails on a
        single host still falls back to POSIX file descriptors (see
        :func:`allocate_mnnvl_handles`), so :attr:`fabric_handles` of an
        allocation tells what it uses.
        """
        return choose_mnnvl_handle_type(comm, dev_id)[0] == _FABRIC_HANDLE

    @staticmethod
    def get_allocation_prop(dev_id: int, handle_type: Any):
        location = cuda.CUmemLocation()
        location.type = cuda.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        location.id = dev_id
        allocation_prop = cuda.CUmemAllocationProp()
        allocation_prop.type = cuda.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        allocation_prop.location = location
        allocation_prop.requestedHandleTypes = handle_type
        return allocation_prop

    @staticmethod
    def get_allocation_granularity(dev_id: int):
        """Return the recommended granularity of both FABRIC and POSIX file
        descriptor allocations, so an allocation keeps its size when it falls
        back from one handle type to the other."""
        if MnnvlMemory.allocation_granularity != 0:
            return MnnvlMemory.allocation_granularity
        option = cuda.CUmemAllocationGranularity_flags(cuda.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        granularity = 1
        for handle_type in (_FABRIC_HANDLE, _POSIX_FD_HANDLE):
            allocation_prop = MnnvlMemory.get_allocation_prop(dev_id, handle_type)
            try:
                handle_granularity = checkCudaErrors(cuda.cuMemGetAllocationGranularity(prop=allocation_prop, option=option))
            except RuntimeError:
                continue
            granularity = max(granularity, handle_granularity)
        MnnvlMemory.allocation_granularity = granularity
        return MnnvlMemory.allocation_granularity

    @staticmethod
    def _create_and_map_handles(comm: CommBackend, aligned_size: int, start_address: int, rank_stride: int, address_offset: int) -> Tuple[List[Any], Any]:
        """Back and map every rank's segment; return the handles and their type.

        Collective over ``comm``.
        """
        dev = checkCudaErrors(cuda.cuCtxGetDevice())
        dev_id = int(dev)
        assert dev_id == MnnvlMemory.dev_id, f'Different dev_id found dev_id={dev_id} but MnnvlMemory.dev_id={MnnvlMemory.dev_id}'
        mem_handles, handle_type = allocate_mnnvl_handles(comm, dev_id, lambda handle_type: (MnnvlMemory.get_allocation_prop(dev_id, handle_type), aligned_size))
        madesc = cuda.CUmemAccessDesc()
        madesc.location = MnnvlMemory.get_allocation_prop(dev_id, handle_type).location
        madesc.flags = cuda.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        for i, mem_handle in enumerate(mem_handles):
            rank_ptr = start_address + rank_stride * i + address_offset
            checkCudaErrors(cuda.cuMemMap(rank_ptr, aligned_size, 0, mem_handle, 0))
            checkCudaErrors(cuda.cuMemSetAccess(rank_ptr, aligned_size, [madesc], 1))
        return (mem_handles, handle_type)

    @staticmethod
    def new_mnnvl_memory_address(mapping: Mapping, size: int):
        page_count = (size + MnnvlMemory.fabric_page_size - 1) // MnnvlMemory.fabric_page_size
        current_rank_stride = page_count * MnnvlMemory.fabric_page_size
        logging.info(f'[MnnvlMemory] creating address with stride={current_rank_stride}')
        comm = MnnvlMemory.get_comm(mapping)
        comm_size = comm.Get_size()
        address_size = current_rank_stride * comm_size
        ptr = checkCudaErrors(cuda.cuMemAddressReserve(address_size, MnnvlMemory.fabric_page_size, 0, 0))
        MnnvlMemory.current_start_address = int(ptr)
        MnnvlMemory.current_rank_stride = current_rank_stride
        MnnvlMemory.current_mem_offset = 0

    @staticmethod
    def open_mnnvl_memory(mapping: Mapping, size: int):
        dev = checkCudaErrors(cuda.cuCtxGetDevice())
        dev_id = int(dev)
        if MnnvlMemory.dev_id is None:
            MnnvlMemory.dev_id = dev_id
        assert dev_id == MnnvlMemory.dev_id, f'Different dev_id found dev_id={dev_id} but MnnvlMemory.dev_id={MnnvlMemory.dev_id}'
        comm = MnnvlMemory.get_comm(mapping)
        comm_rank = comm.Get_rank()
        comm_size = comm.Get_size()
        all_rank_allocate_sizes = comm.allgather(size)
        assert len(all_rank_allocate_sizes) == comm_size
        assert all((x == size for x in all_rank_allocate_sizes)), 'Not all rank allocating same size.'
        granularity = MnnvlMemory.get_allocation_granularity(dev_id)
        aligned_size = (size + granularity - 1) // granularity * granularity
        if MnnvlMemory.current_mem_offset + aligned_size > MnnvlMemory.current_rank_stride:
            MnnvlMemory.new_mnnvl_memory_address(mapping, aligned_size)
        assert MnnvlMemory.current_mem_offset + aligned_size <= MnnvlMemory.current_rank_stride
        mem_handles, handle_type = MnnvlMemory._create_and_map_handles(comm, aligned_size, MnnvlMemory.current_start_address, MnnvlMemory.current_rank_stride, MnnvlMemory.current_mem_offset)
        ptr = MnnvlMemory.current_start_address + MnnvlMemory.current_mem_offset
        stride = MnnvlMemory.current_rank_stride
        MnnvlMemory.allocated_map[ptr] = _MnnvlAllocationRecord(comm=comm, comm_size=comm_size, comm_rank=comm_rank, aligned_size=aligned_size, mem_handles=mem_handles, start_address=MnnvlMemory.current_start_address, rank_stride=MnnvlMemory.current_rank_stride, address_offset=MnnvlMemory.current_mem_offset, handle_type=handle_type)
        MnnvlMemory.address_refcnt[MnnvlMemory.current_start_address] = MnnvlMemory.address_refcnt.get(MnnvlMemory.current_start_address, 0) + 1
        MnnvlMemory.current_mem_offset += aligned_size
        return (ptr, stride)

    @staticmethod
    def _unmap_and_release_handles(record: _MnnvlAllocationRecord) -> None:
        for i in range(record.comm_size):
            rank_ptr = record.start_address + i * record.rank_stride + record.address_offset
            checkCudaErrors(cuda.cuMemUnmap(rank_ptr, record.aligned_size))
            checkCudaErrors(cuda.cuMemRelease(record.mem_handles[i]))

    @staticmethod
    def close_mnnvl_memory(ptr: int):
        record = MnnvlMemory.allocated_map.pop(ptr)
        if record.mapped:
            MnnvlMemory._unmap_and_release_handles(record)
        MnnvlMemory.address_refcnt[record.start_address] -= 1
        if MnnvlMemory.address_refcnt[record.start_address] == 0:
            MnnvlMemory.address_refcnt.pop(record.start_address)
            device_ptr = cuda.CUdeviceptr(record.start_address)
            checkCudaErrors(cuda.cuMemAddressFree(device_ptr, record.comm_size * record.rank_stride))
            if record.start_address == MnnvlMemory.current_start_address:
                MnnvlMemory.current_start_address = 0
                MnnvlMemory.current_rank_stride = 0
                MnnvlMemory.current_mem_offset = 0

    @staticmethod
    def support_nvlink(need_all_up: bool=True):
        dev_id = torch.cuda.current_device()
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(dev_id)
            link_count = pynvml.NVML_NVLINK_MAX_LINKS
            active_links = 0
            available_links = 0
            for link_idx in range(link_count):
                try:
                    if pynvml.nvmlDeviceGetNvLinkCapability(handle, link_idx, pynvml.NVML_NVLINK_CAP_P2P_SUPPORTED):
                        is_active = pynvml.nvmlDeviceGetNvLinkState(handle, link_idx)
                        available_links += 1
                        if is_active:
                            active_links += 1
                except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                    continue
        finally:
            pynvml.nvmlShutdown()
        return active_links == available_links and available_links > 0 if need_all_up else available_links > 0

    @staticmethod
    def supports_mnnvl() -> bool:
        support_nvlink_and_all_up = MnnvlMemory.support_nvlink(True)
        return support_nvlink_and_all_up

def is_mnnvl_fabric_supported():
    ...

def is_multicast_supported():
    ...

def all_ranks_agree():
    ...

def all_ranks_support_mnnvl():
    ...
_FABRIC_HANDLE = None
_POSIX_FD_HANDLE = None
_IMEX_HINT = None
_fabric_fallback_warned = None

def _local_fabric_status(dev_id: int) -> Tuple[Optional[str], bytes]:
    """Return why this GPU cannot use FABRIC handles (``None`` if it can) and
    its NVML fabric cluster UUID (empty unless the fabric state is completed)."""
    try:
        supported = checkCudaErrors(cuda.cuDeviceGetAttribute(cuda.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev_id))
    except RuntimeError as exc:
        return (f'querying the FABRIC handle attribute failed: {exc}', b'')
    if not supported:
        return ('the driver does not support FABRIC handles', b'')
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(dev_id)
            fabric_info = pynvml.c_nvmlGpuFabricInfoV_t()
            pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(fabric_info))
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return (None, b'')
    if fabric_info.state < pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
        return (None, b'')
    return (None, bytes(fabric_info.clusterUuid))

def choose_mnnvl_handle_type(comm: CommBackend, dev_id: int) -> Tuple[Any, bool]:
    """Choose FABRIC handles or POSIX file descriptors for MNNVL memory shared
    over ``comm``; return the handle type and whether the group is on a single
    host.

    Collective over ``comm``; every rank gets the same answer, which depends
    only on what the ranks report now. On one host, FABRIC is chosen when
    every GPU reports FABRIC support and POSIX file descriptors otherwise.
    Across hosts, every GPU must support FABRIC handles and report the same
    non-zero NVML fabric cluster UUID; otherwise this raises with each rank's
    reason, since file descriptors cannot cross hosts.
    """
    reason, cluster_uuid = _local_fabric_status(dev_id)
    status = comm.allgather((socket.gethostname(), reason, cluster_uuid))
    if len({host for host, _, _ in status}) == 1:
        if all((reason is None for _, reason, _ in status)):
            return (_FABRIC_HANDLE, True)
        return (_POSIX_FD_HANDLE, True)
    problems = []
    for rank, (host, reason, uuid) in enumerate(status):
        if reason is not None:
            problems.append(f'rank {rank} on {host}: {reason}')
        elif not any(uuid):
            problems.append(f'rank {rank} on {host}: the GPU is not in a completed NVLink fabric cluster (NVML clusterUuid unset)')
    if not problems and len({uuid for _, _, uuid in status}) > 1:
        problems = [f'rank {rank} on {host}: NVLink fabric cluster {uuid.hex()}' for rank, (host, _, uuid) in enumerate(status)]
        problems.insert(0, 'the ranks are in different NVLink domains')
    if problems:
        raise RuntimeError('[MNNVL] memory shared across hosts needs FABRIC handles within one NVLink domain:\n  ' + '\n  '.join(problems) + '\n' + _IMEX_HINT)
    return (_FABRIC_HANDLE, False)

def _create_and_import_handles(comm: CommBackend, prop: Any, size: int) -> Tuple[Optional[List[Any]], List[Optional[str]]]:
    """Make one attempt to back ``size`` bytes on every rank and import every
    peer's allocation.

    Collective over ``comm``. Returns the per-rank allocation handles (this
    rank's own at its index) and each rank's error, which is ``None`` on
    success. When any rank fails, the handles are ``None`` and everything this
    rank created or imported is released, so the caller can retry.
    """
    rank, size_of_group = (comm.Get_rank(), comm.Get_size())
    handle_type = prop.requestedHandleTypes
    local_handle = None
    exported = None
    error = None
    try:
        local_handle = checkCudaErrors(cuda.cuMemCreate(size, prop, 0))
        exported = checkCudaErrors(cuda.cuMemExportToShareableHandle(local_handle, handle_type, 0))
    except RuntimeError as exc:
        error = f'creating or exporting the allocation failed: {exc}'
    errors = list(comm.allgather(error))
    if any(errors):
        if exported is not None and handle_type == _POSIX_FD_HANDLE:
            os.close(int(exported))
        if local_handle is not None:
            checkCudaErrors(cuda.cuMemRelease(local_handle))
        return (None, errors)
    if handle_type == _FABRIC_HANDLE:
        shareable: Sequence[Any] = comm.allgather(exported.data)
    else:
        try:
            shareable = exchange_fds(comm, int(exported))
        except BaseException:
            os.close(int(exported))
            checkCudaErrors(cuda.cuMemRelease(local_handle))
            raise
    handles: List[Any] = [None] * size_of_group
    handles[rank] = local_handle
    error = None
    try:
        for peer in range(size_of_group):
            if peer != rank:
                try:
                    handles[peer] = checkCudaErrors(cuda.cuMemImportFromShareableHandle(shareable[peer], handle_type))
                except RuntimeError as exc:
                    error = f'importing the allocation of rank {peer} failed: {exc}'
                    break
    finally:
        if handle_type == _POSIX_FD_HANDLE:
            for fd in shareable:
                os.close(int(fd))
    errors = list(comm.allgather(error))
    if any(errors):
        for handle in handles:
            if handle is not None:
                checkCudaErrors(cuda.cuMemRelease(handle))
        return (None, errors)
    return (handles, errors)

def _format_rank_errors():
    ...

def allocate_mnnvl_handles(comm: CommBackend, dev_id: int, make_prop: Callable[[Any], Tuple[Any, int]]) -> Tuple[List[Any], Any]:
    """Back MNNVL memory on every rank and import every peer's allocation.

    ``make_prop(handle_type)`` returns the ``CUmemAllocationProp`` and the size
    to allocate with that handle type. Collective over ``comm``. Returns the
    per-rank allocation handles (this rank's own at its index) and the handle
    type used: the one :func:`choose_mnnvl_handle_type` picks or, when FABRIC
    handles fail on a single host (e.g. without an IMEX channel), POSIX file
    descriptors. Each call decides on its own, so every allocation over a host
    without usable FABRIC handles tries them first.
    """
    global _fabric_fallback_warned
    handle_type, single_host = choose_mnnvl_handle_type(comm, dev_id)
    prop, size = make_prop(handle_type)
    handles, errors = _create_and_import_handles(comm, prop, size)
    if handles is not None:
        return (handles, handle_type)
    failure = _format_rank_errors(errors)
    if handle_type == _FABRIC_HANDLE and single_host:
        log = logger.debug if _fabric_fallback_warned else logger.warning
        _fabric_fallback_warned = True
        log('[MNNVL] FABRIC handles failed on this host; using POSIX file descriptors instead:\n%s\n%s', failure, _IMEX_HINT)
        handle_type = _POSIX_FD_HANDLE
        prop, size = make_prop(handle_type)
        handles, errors = _create_and_import_handles(comm, prop, size)
        if handles is not None:
            return (handles, handle_type)
        failure = _format_rank_errors(errors)
    kind = 'FABRIC' if handle_type == _FABRIC_HANDLE else 'POSIX file descriptor'
    hint = '\n' + _IMEX_HINT if handle_type == _FABRIC_HANDLE else ''
    raise RuntimeError(f'[MNNVL] allocating memory shared through {kind} handles failed:\n{failure}{hint}')

class HandleExchanger:
    ...

def _handle_is_fabric():
    ...

def handle_allgather():
    ...

def handle_broadcast():
    ...

def handle_cleanup():
    ...

def handle_close():
    ...

class SymmDeviceMemory:
    ...

class McastGPUBuffer:
    ...
