# Excerpt of FlashInfer 0.6.17 (comm/abstractions.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
@runtime_checkable
class CommBackend(Protocol):

    def Get_rank(self) -> int:
        ...

    def Get_size(self) -> int:
        ...

    def allgather(self, data: Any) -> tuple[Any, ...]:
        ...

    def bcast(self, data: Any, root: int) -> Any:
        ...

    def barrier(self) -> None:
        ...

    def Split(self, color: int, key: int) -> 'CommBackend':
        ...
