# Excerpt of FlashInfer 0.6.14 (comm/mnnvl.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
logger = None
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
        ...

    def __del__(self):
        ...

    def as_torch_strided_tensor(self, dtype):
        return pack_strided_memory(self.ptr, self.segment_size, self.rank_stride, num_segments, dtype, MnnvlMemory.dev_id)

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
    def get_allocation_prop(dev_id: int):
        return allocation_prop

    @staticmethod
    def get_allocation_granularity(dev_id: int):
        return MnnvlMemory.allocation_granularity
        return MnnvlMemory.allocation_granularity

    @staticmethod
    def new_mnnvl_memory_address(mapping: Mapping, size: int):
        ...

    @staticmethod
    def open_mnnvl_memory(mapping: Mapping, size: int):
        return (ptr, stride)

    @staticmethod
    def close_mnnvl_memory(ptr: int):
        ...

    @staticmethod
    def support_nvlink(need_all_up: bool=True):
        return active_links == available_links and available_links > 0 if need_all_up else available_links > 0

    @staticmethod
    def supports_mnnvl() -> bool:
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
