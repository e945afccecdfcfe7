# Excerpt of FlashInfer 0.7.4 (comm/mnnvl.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
logger = None
from .abstractions import CommBackend
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
        ...

    def __del__(self):
        ...

    @property
    def mapped(self) -> bool:
        return MnnvlMemory.allocated_map[self.ptr].mapped

    @property
    def fabric_handles(self) -> bool:
        return MnnvlMemory.allocated_map[self.ptr].handle_type == _FABRIC_HANDLE

    @property
    def local_mem_handle(self) -> int:
        return int(record.mem_handles[record.comm_rank])

    def as_torch_strided_tensor(self, dtype):
        return pack_strided_memory(self.ptr, self.segment_size, self.rank_stride, num_segments, dtype, MnnvlMemory.dev_id, owner=self)

    @staticmethod
    def initialize():
        ...

    @staticmethod
    def set_comm_from_config(mapping: Mapping, config: MnnvlConfig=None):
        ...

    @staticmethod
    def get_comm(mapping: Mapping):
        return MnnvlMemory.comm
        return comm

    @staticmethod
    def uses_fabric_handles(comm: CommBackend, dev_id: int) -> bool:
        return choose_mnnvl_handle_type(comm, dev_id)[0] == _FABRIC_HANDLE

    @staticmethod
    def get_allocation_prop(dev_id: int, handle_type: Any):
        return allocation_prop

    @staticmethod
    def get_allocation_granularity(dev_id: int):
        return MnnvlMemory.allocation_granularity
        return MnnvlMemory.allocation_granularity

    @staticmethod
    def _create_and_map_handles(comm: CommBackend, aligned_size: int, start_address: int, rank_stride: int, address_offset: int) -> Tuple[List[Any], Any]:
        return (mem_handles, handle_type)

    @staticmethod
    def new_mnnvl_memory_address(mapping: Mapping, size: int):
        ...

    @staticmethod
    def open_mnnvl_memory(mapping: Mapping, size: int):
        return (ptr, stride)

    @staticmethod
    def _unmap_and_release_handles(record: _MnnvlAllocationRecord) -> None:
        ...

    @staticmethod
    def close_mnnvl_memory(ptr: int):
        ...

    @staticmethod
    def support_nvlink(need_all_up: bool=True):
        return active_links == available_links and available_links > 0 if need_all_up else available_links > 0

    @staticmethod
    def supports_mnnvl() -> bool:
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

def _local_fabric_status():
    ...

def choose_mnnvl_handle_type():
    ...

def _create_and_import_handles():
    ...

def _format_rank_errors():
    ...

def allocate_mnnvl_handles():
    ...

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
