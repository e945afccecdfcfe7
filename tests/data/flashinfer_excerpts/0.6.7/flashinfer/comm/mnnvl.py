# Excerpt of FlashInfer 0.6.7 (comm/mnnvl.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
logger = None
from .mapping import Mapping
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

class CommBackend(ABC):

    @abstractmethod
    def Get_rank(self) -> int:
        ...

    @abstractmethod
    def Get_size(self) -> int:
        ...

    @abstractmethod
    def allgather(self, data: int) -> List[int]:
        ...

    @abstractmethod
    def bcast(self, data: Any, root: int) -> Any:
        ...

    @abstractmethod
    def barrier(self) -> None:
        ...

    @abstractmethod
    def Split(self, color: int, key: int) -> 'CommBackend':
        ...

def lazy_import_mpi():
    ...

class MpiComm:
    ...

class MPIBackend:
    ...

class TorchDistBackend:
    ...

@dataclass
class MnnvlConfig:
    comm_backend: Optional[CommBackend] = None
    allocation_granularity: int = 0
    fabric_page_size: int = 1 << 29

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
            MnnvlMemory.close_mnnvl_memory(self.ptr)

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

    @staticmethod
    def get_allocation_prop(dev_id: int):
        location = cuda.CUmemLocation()
        location.type = cuda.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        location.id = dev_id
        allocation_prop = cuda.CUmemAllocationProp()
        allocation_prop.type = cuda.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        arch = platform.machine().lower()
        is_on_aarch64 = 'aarch64' in arch
        if is_on_aarch64:
            allocation_prop.requestedHandleTypes = cuda.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC
        else:
            allocation_prop.requestedHandleTypes = cuda.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        allocation_prop.location = location
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
        allocation_prop = MnnvlMemory.get_allocation_prop(dev_id)
        allocated_mem_handle = checkCudaErrors(cuda.cuMemCreate(aligned_size, allocation_prop, flags=0))
        exported_fabric_handle = checkCudaErrors(cuda.cuMemExportToShareableHandle(allocated_mem_handle, allocation_prop.requestedHandleTypes, 0))
        if allocation_prop.requestedHandleTypes == cuda.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC:
            all_handles_data = comm.allgather(exported_fabric_handle.data)
        else:
            all_handles_data = comm.allgather(exported_fabric_handle)
            all_pids = comm.allgather(os.getpid())
            libc = ctypes.CDLL(None, use_errno=True)
            syscall = libc.syscall
            SYS_pidfd_open = 434
            SYS_pidfd_getfd = 438
            pidfds = []
            for pid in all_pids:
                pidfd = syscall(SYS_pidfd_open, pid, 0)
                if pidfd < 0:
                    err = ctypes.get_errno()
                    raise RuntimeError(f'pidfd_open({pid}) failed with errno {err}: {os.strerror(err)}')
                pidfds.append(pidfd)
            remote_fds = []
            for pidfd, fd in zip(pidfds, all_handles_data, strict=True):
                remote_fd = syscall(SYS_pidfd_getfd, pidfd, fd, 0)
                if remote_fd < 0:
                    err = ctypes.get_errno()
                    error_msg = f'pidfd_getfd(pidfd={pidfd}, fd={fd}) failed with errno {err}: {os.strerror(err)}.'
                    if err == 1:
                        error_msg += ' Permission denied. If running in a container, try adding --cap-add=SYS_PTRACE to your docker run command.'
                    else:
                        error_msg += ' This may be due to kernel version (requires Linux 5.6+).'
                    raise RuntimeError(error_msg)
                remote_fds.append(remote_fd)
            all_handles_data = remote_fds
        madesc = cuda.CUmemAccessDesc()
        madesc.location = allocation_prop.location
        madesc.flags = cuda.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        mem_handles = [None] * comm_size
        for i, remote_handle_data in enumerate(all_handles_data):
            rank_ptr = MnnvlMemory.current_start_address + MnnvlMemory.current_rank_stride * i + MnnvlMemory.current_mem_offset
            if i == comm_rank:
                mem_handles[i] = allocated_mem_handle
                checkCudaErrors(cuda.cuMemMap(rank_ptr, aligned_size, 0, allocated_mem_handle, 0))
            else:
                imported_mem_handle = checkCudaErrors(cuda.cuMemImportFromShareableHandle(remote_handle_data, allocation_prop.requestedHandleTypes))
                mem_handles[i] = imported_mem_handle
                checkCudaErrors(cuda.cuMemMap(rank_ptr, aligned_size, 0, imported_mem_handle, 0))
            checkCudaErrors(cuda.cuMemSetAccess(rank_ptr, aligned_size, [madesc], 1))
        ptr = MnnvlMemory.current_start_address + MnnvlMemory.current_mem_offset
        stride = MnnvlMemory.current_rank_stride
        MnnvlMemory.allocated_map[ptr] = (mapping, aligned_size, mem_handles, MnnvlMemory.current_start_address, MnnvlMemory.current_rank_stride, MnnvlMemory.current_mem_offset)
        MnnvlMemory.address_refcnt[MnnvlMemory.current_start_address] = MnnvlMemory.address_refcnt.get(MnnvlMemory.current_start_address, 0) + 1
        MnnvlMemory.current_mem_offset += aligned_size
        return (ptr, stride)

    @staticmethod
    def close_mnnvl_memory(ptr: int):
        mapping, aligned_size, mem_handles, start_address, rank_stride, address_offset = MnnvlMemory.allocated_map.pop(ptr)
        comm = MnnvlMemory.get_comm(mapping)
        comm_size = comm.Get_size()
        for i in range(comm_size):
            rank_ptr = start_address + i * rank_stride + address_offset
            checkCudaErrors(cuda.cuMemUnmap(rank_ptr, aligned_size))
            checkCudaErrors(cuda.cuMemRelease(mem_handles[i]))
        MnnvlMemory.address_refcnt[start_address] -= 1
        if MnnvlMemory.address_refcnt[start_address] == 0:
            MnnvlMemory.address_refcnt.pop(start_address)
            device_ptr = cuda.CUdeviceptr(start_address)
            checkCudaErrors(cuda.cuMemAddressFree(device_ptr, comm_size * rank_stride))
            if start_address == MnnvlMemory.current_start_address:
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
            except pynvml.NVMLError_NotSupported:
                continue
        return active_links == available_links and available_links > 0 if need_all_up else available_links > 0

    @staticmethod
    def supports_mnnvl() -> bool:
        support_nvlink_and_all_up = MnnvlMemory.support_nvlink(True)
        return support_nvlink_and_all_up

class IpcSocket:
    ...

class HandleExchanger:
    ...

class FabricHandleExchanger:
    ...

class PosixFDHandleExchanger:
    ...

def is_mnnvl_fabric_supported():
    ...

class SymmDeviceMemory:
    ...

class McastGPUBuffer:
    ...
