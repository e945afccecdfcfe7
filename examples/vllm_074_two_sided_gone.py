"""VLLM-002, standalone: vLLM 0.33.0's two-sided backend on FlashInfer 0.7.4.

vLLM's ``FlashInferNVLinkTwoSidedManager.__init__`` asserts
``has_flashinfer_nvlink_two_sided()``, which probes ``flashinfer.comm.trtllm_alltoall.MnnvlMoe``;
FlashInfer 0.7.4 ships no ``comm/trtllm_alltoall.py``. One process, on the CPU fake imitating each
release's module layout.

    python examples/vllm_074_two_sided_gone.py        # exit 1 while the finding holds
"""

import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_HAS_FLASHINFER_CUBIN", "1")

import fakes.flashinfer  # noqa: E402


def main() -> int:
    broken = False
    for release in ("0.7.2", "0.7.4"):
        with fakes.flashinfer.install(release):
            import vllm.utils.flashinfer as probes

            probes.has_flashinfer_nvlink_two_sided.cache_clear()
            probes.has_flashinfer_comm.cache_clear()
            ok = probes.has_flashinfer_nvlink_two_sided()
        print(f"FlashInfer {release}: has_flashinfer_nvlink_two_sided() = {ok}"
              + ("" if ok else ": FlashInferNVLinkTwoSidedManager asserts 'flashinfer all2all module not found'"))
        broken |= not ok
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
