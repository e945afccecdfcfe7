"""The CPU fake of FlashInfer (``fakes.flashinfer`` mirrors the real module paths), the
shared memory it lives in (``fakes.arena``), and what carries it into the processes a run or a
test session starts (``fakes.spawned``, ``fakes.accelerator``, ``fakes.stacks``,
``fakes.pytest_plugin``)."""
