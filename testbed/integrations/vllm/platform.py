"""vLLM's platform in the processes where the testbed stands in for the accelerators.

Registered as a vLLM platform plugin (entry point group ``vllm.platform_plugins``, which vLLM
consults in every process it or a test starts): it answers only where the process has the
accelerator stand-in (:data:`fakes.accelerator.DEVICES_ENV`, set by ``pytest --fake-devices`` and
``a2a-testbed engine-tests``), and elsewhere leaves vLLM to pick its platform as ever. vLLM
uses a plugin's platform where none of its own applies; ``VLLM_TARGET_DEVICE=cpu`` makes the
CPU's its own choice (0.34 on), so the stand-in is used without that variable.

The platform is vLLM's CPU platform with what a GPU host has and a CPU lacks:

- a config is checked as on a host with Triton (:func:`environment.checked_with_triton`): the
  x86 kernels it wants are the model runner's, which these processes do not run;
- the device communicator has the variable-size all-gather and reduce-scatter that vLLM's GPU
  communicator has (through NCCL) and its CPU communicator lacks, here over gloo;
- the device communicator builds the FlashInfer all-to-all manager its backend names, as
  vLLM's CUDA communicator does (its CPU communicator builds ``AgRsAll2AllManager`` for every
  backend but naive, whose dispatch raises on a CPU);
- where the release runs x86 CPUs only on its Triton-based model runner (0.34; triton-cpu has
  no wheel), the runner it runs on CPUs without Triton (``uses_standalone_cpu_model_runner``);
- ``VLLM_HAS_FLASHINFER_CUBIN=1``: FlashInfer's kernels are the fake's, with nothing to
  compile (without it ``has_flashinfer()`` looks for ``nvcc``);
- ``CPU_VISIBLE_MEMORY_NODES`` names one memory node per stand-in device, all node 0: vLLM's
  CPU platform takes a DP rank's "devices" to be NUMA nodes, and a data-parallel server
  gives DP rank ``d`` the ``d``-th (a one-node host has no node 1);
- ``VLLM_CPU_OMP_THREADS_BIND=nobind``: the stand-in devices share this host's cores, so no
  worker's threads are bound to cores of its own (bound, spinning OpenMP threads of several
  workers on two cores take turns by the scheduler's time slices).
"""

from __future__ import annotations

import functools
import os

from fakes.accelerator import DEVICES_ENV, parse_count


def plugin() -> str | None:
    """vLLM's platform-plugin hook: this module's :class:`StandInPlatform` where the process
    stands in for accelerators, else None (vLLM picks its own)."""
    if not os.environ.get(DEVICES_ENV):
        return None
    os.environ.setdefault("VLLM_HAS_FLASHINFER_CUBIN", "1")
    from vllm.utils.cpu_resource_utils import DEVICE_CONTROL_ENV_VAR

    os.environ.setdefault(DEVICE_CONTROL_ENV_VAR, ",".join("0" * parse_count(os.environ[DEVICES_ENV])))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return f"{__name__}.StandInPlatform"


def __getattr__(name: str):
    # The classes subclass vLLM's, so they are built when vLLM asks for them, not on import.
    if name == "StandInPlatform":
        return _platform()
    if name == "StandInCommunicator":
        return _communicator()
    raise AttributeError(name)


@functools.cache
def _platform():
    from vllm.platforms.cpu import CpuPlatform

    from testbed.integrations.vllm.environment import checked_with_triton

    check = CpuPlatform.check_and_update_config.__func__

    class StandInPlatform(CpuPlatform):
        if "uses_standalone_cpu_model_runner" in vars(CpuPlatform):
            @classmethod
            def uses_standalone_cpu_model_runner(cls) -> bool:
                from testbed.integrations.vllm import runner_kernels

                runner_kernels.register()
                return True

        @classmethod
        def check_and_update_config(cls, vllm_config) -> None:
            return checked_with_triton(check, cls, vllm_config)

        @classmethod
        def get_device_communicator_cls(cls) -> str:
            return f"{__name__}.StandInCommunicator"

    return StandInPlatform


@functools.cache
def _communicator():
    import torch
    import torch.distributed as dist
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    from testbed.integrations.vllm.adapter import cuda_manager
    from testbed.integrations.vllm.environment import fallback_warning_undone

    fallback_warning_undone()  # the FlashInfer manager is put back in __init__

    class StandInCommunicator(CpuCommunicator):
        """vLLM's CPU communicator with the GPU communicator's all-to-all manager for a
        FlashInfer backend, and its ``all_gatherv`` and ``reduce_scatterv`` (dim 0 and any dim,
        as ``CudaCommunicator`` takes them), over gloo."""

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            manager = cuda_manager(getattr(self, "all2all_backend", None), self.cpu_group) if self.use_all2all else None
            if manager is not None:
                self.all2all_manager = manager

        def all_gatherv(self, input_, dim: int = 0, sizes=None):
            if dim != 0:
                raise NotImplementedError("only dim 0 all-gatherv is supported")
            if isinstance(input_, (list, tuple)):
                return [self.all_gatherv(t, dim, sizes) for t in input_]
            sizes = list(sizes) if sizes is not None else [input_.shape[0]] * self.world_size
            assert len(sizes) == self.world_size and input_.shape[0] == sizes[self.rank_in_group], \
                f"{input_.shape[0]} != {sizes[self.rank_in_group]}"
            widest = max(sizes)
            padded = input_.new_zeros((widest,) + tuple(input_.shape[1:]))
            padded[: input_.shape[0]] = input_
            parts = [torch.empty_like(padded) for _ in sizes]
            dist.all_gather(parts, padded, group=self.device_group)
            return torch.cat([part[:size] for part, size in zip(parts, sizes)])

        def reduce_scatterv(self, input_, dim: int = -1, sizes=None):
            if dim < 0:
                dim += input_.dim()
            moved = input_.movedim(0, dim).contiguous()
            sizes = list(sizes) if sizes is not None else [moved.shape[0] // self.world_size] * self.world_size
            assert len(sizes) == self.world_size and sum(sizes) == moved.shape[0]
            dist.all_reduce(moved, group=self.device_group)
            start = sum(sizes[: self.rank_in_group])
            return moved[start: start + sizes[self.rank_in_group]].movedim(0, dim).contiguous()

    return StandInCommunicator
