# Excerpt of FlashInfer 0.7.0.post1 (comm/mnnvl.py), Apache-2.0, (c) the FlashInfer authors:
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

    def as_torch_strided_tensor(self, dtype):
        num_segments = MnnvlMemory.comm.Get_size()
        return pack_strided_memory(self.ptr, self.segment_size, self.rank_stride, num_segments, dtype, MnnvlMemory.dev_id)

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
    _fabric_supported: bool | None = None

    @staticmethod
    def _probe_fabric_supported(dev_id: int) -> bool:
        """Return True if this rank's GPU supports FABRIC handles and is part of a fabric cluster."""
        try:
            return is_mnnvl_fabric_supported(dev_id)
        except Exception:
            return False

    @staticmethod
    def _resolve_fabric_support(comm: CommBackend, dev_id: int) -> bool:
        """AND-reduce per-rank FABRIC support and cache the result.

        All ranks must take the same handle-exchange path or the collective deadlocks.
        """
        if MnnvlMemory._fabric_supported is not None:
            return MnnvlMemory._fabric_supported
        local_supported = MnnvlMemory._probe_fabric_supported(dev_id)
        agreed = all_ranks_agree(comm, local_supported)
        if agreed != local_supported:
            logger.warning(f"[MnnvlMemory] FABRIC support probe disagrees across ranks (local={local_supported}); falling back to {('FABRIC' if agreed else 'POSIX fd')} on all ranks to keep the handle-exchange path consistent.")
        MnnvlMemory._fabric_supported = agreed
        return agreed

    @staticmethod
    def get_allocation_prop(dev_id: int):
        location = cuda.CUmemLocation()
        location.type = cuda.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        location.id = dev_id
        allocation_prop = cuda.CUmemAllocationProp()
        allocation_prop.type = cuda.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        allocation_prop.location = location
        use_fabric = MnnvlMemory._fabric_supported if MnnvlMemory._fabric_supported is not None else MnnvlMemory._probe_fabric_supported(dev_id)
        if use_fabric:
            allocation_prop.requestedHandleTypes = cuda.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC
        else:
            allocation_prop.requestedHandleTypes = cuda.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        return allocation_prop

    @staticmethod
    def get_allocation_granularity(dev_id: int):
        if MnnvlMemory.allocation_granularity != 0:
            return MnnvlMemory.allocation_granularity
        allocation_prop = MnnvlMemory.get_allocation_prop(dev_id)
        option = cuda.CUmemAllocationGranularity_flags(cuda.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        granularity = checkCudaErrors(cuda.cuMemGetAllocationGranularity(prop=allocation_prop, option=option))
        MnnvlMemory.allocation_granularity = granularity
        return MnnvlMemory.allocation_granularity

    @staticmethod
    def _create_and_map_handles(comm: CommBackend, aligned_size: int, start_address: int, rank_stride: int, address_offset: int) -> List[Any]:
        dev = checkCudaErrors(cuda.cuCtxGetDevice())
        dev_id = int(dev)
        assert dev_id == MnnvlMemory.dev_id, f'Different dev_id found dev_id={dev_id} but MnnvlMemory.dev_id={MnnvlMemory.dev_id}'
        comm_rank = comm.Get_rank()
        comm_size = comm.Get_size()
        allocation_prop = MnnvlMemory.get_allocation_prop(dev_id)
        allocated_mem_handle = checkCudaErrors(cuda.cuMemCreate(aligned_size, allocation_prop, flags=0))
        exported_fabric_handle = checkCudaErrors(cuda.cuMemExportToShareableHandle(allocated_mem_handle, allocation_prop.requestedHandleTypes, 0))
        if allocation_prop.requestedHandleTypes == cuda.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC:
            all_handles_data: Sequence[Any] = comm.allgather(exported_fabric_handle.data)
        else:
            exported_fd = int(exported_fabric_handle)
            try:
                local_host = socket.gethostname()
                all_hosts = comm.allgather(local_host)
                if len(set(all_hosts)) != 1:
                    raise RuntimeError(f'[MnnvlMemory] POSIX fd exchange via SCM_RIGHTS requires all ranks to share the same host, but got differing hostnames: {all_hosts}. Multi-node MNNVL requires a fabric-capable GPU setup (CU_MEM_HANDLE_TYPE_FABRIC).')
                all_handles_data = exchange_fds(comm, exported_fd)
            except BaseException:
                os.close(exported_fd)
                raise
        madesc = cuda.CUmemAccessDesc()
        madesc.location = allocation_prop.location
        madesc.flags = cuda.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        mem_handles = [None] * comm_size
        try:
            for i, remote_handle_data in enumerate(all_handles_data):
                rank_ptr = start_address + rank_stride * i + address_offset
                if i == comm_rank:
                    mem_handles[i] = allocated_mem_handle
                    checkCudaErrors(cuda.cuMemMap(rank_ptr, aligned_size, 0, allocated_mem_handle, 0))
                else:
                    imported_mem_handle = checkCudaErrors(cuda.cuMemImportFromShareableHandle(remote_handle_data, allocation_prop.requestedHandleTypes))
                    mem_handles[i] = imported_mem_handle
                    checkCudaErrors(cuda.cuMemMap(rank_ptr, aligned_size, 0, imported_mem_handle, 0))
                checkCudaErrors(cuda.cuMemSetAccess(rank_ptr, aligned_size, [madesc], 1))
        finally:
            if allocation_prop.requestedHandleTypes == cuda.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
                for shareable_fd in all_handles_data:
                    os.close(int(shareable_fd))
        return mem_handles

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
        MnnvlMemory._resolve_fabric_support(comm, dev_id)
        granularity = MnnvlMemory.get_allocation_granularity(dev_id)
        aligned_size = (size + granularity - 1) // granularity * granularity
        if MnnvlMemory.current_mem_offset + aligned_size > MnnvlMemory.current_rank_stride:
            MnnvlMemory.new_mnnvl_memory_address(mapping, aligned_size)
        assert MnnvlMemory.current_mem_offset + aligned_size <= MnnvlMemory.current_rank_stride
        mem_handles = MnnvlMemory._create_and_map_handles(comm, aligned_size, MnnvlMemory.current_start_address, MnnvlMemory.current_rank_stride, MnnvlMemory.current_mem_offset)
        ptr = MnnvlMemory.current_start_address + MnnvlMemory.current_mem_offset
        stride = MnnvlMemory.current_rank_stride
        MnnvlMemory.allocated_map[ptr] = _MnnvlAllocationRecord(comm=comm, comm_size=comm_size, comm_rank=comm_rank, aligned_size=aligned_size, mem_handles=mem_handles, start_address=MnnvlMemory.current_start_address, rank_stride=MnnvlMemory.current_rank_stride, address_offset=MnnvlMemory.current_mem_offset)
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
        handle = pynvml.nvmlDeviceGetHandleByIndex(dev_id)
        link_count = pynvml.NVML_NVLINK_MAX_LINKS
        active_links = 0
        available_links = 0
        for link_idx in range(link_count):
            try:
                if pynvml.nvmlDeviceGetNvLinkCapability(handle, link_idx, pynvml.NVML_NVLINK_CAP_P2P_SUPPORTED):
                    available_links += 1
                    is_active = pynvml.nvmlDeviceGetNvLinkState(handle, link_idx)
                    if is_active:
                        active_links += 1
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                continue
        return active_links == available_links and available_links > 0 if need_all_up else available_links > 0

    @staticmethod
    def supports_mnnvl() -> bool:
        support_nvlink_and_all_up = MnnvlMemory.support_nvlink(True)
        return support_nvlink_and_all_up

def is_mnnvl_fabric_supported(device_idx: int) -> bool:
    fabric_handle_supported = checkCudaErrors(cuda.cuDeviceGetAttribute(cuda.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, device_idx))
    if fabric_handle_supported == 0:
        return False
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_idx)
        fabric_info = pynvml.c_nvmlGpuFabricInfoV_t()
        pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(fabric_info))
        return fabric_info.state >= pynvml.NVML_GPU_FABRIC_STATE_COMPLETED and any(fabric_info.clusterUuid)
    finally:
        pynvml.nvmlShutdown()

def is_multicast_supported():
    ...

def all_ranks_agree(comm: CommBackend, local: bool) -> bool:
    """AND-reduce a per-rank boolean over the group (True iff every rank is True)."""
    return all(comm.allgather(local))

def all_ranks_support_mnnvl():
    ...

class HandleExchanger:
    ...

def make_handle_exchanger():
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
