"""SGL-002, standalone: SGLang 0.5.23's FlashinferDispatcher on FlashInfer 0.7.4.

``sglang/srt/layers/moe/token_dispatcher/flashinfer.py`` imports ``MoeAlltoAll`` and
``moe_a2a_get_workspace_size_per_rank`` from ``flashinfer.comm`` in a ``try`` whose ``except
ImportError`` sets ``use_flashinfer = False``; FlashInfer 0.7.4 ships neither, so every
``FlashinferDispatcher`` raises ``ImportError: Flashinfer is not installed or does not support
A2A``. One process per release (the module decides at import), on the CPU fake imitating each
release's module layout.

    python examples/sglang_074_dispatcher_gone.py        # exit 1 while the finding holds
"""

import subprocess
import sys

PROBE = """
import sys
from testbed.integrations import sglang
sglang.prepare_environment()
import fakes.flashinfer
with fakes.flashinfer.install(sys.argv[1]):
    import sglang.srt.layers.moe.token_dispatcher.flashinfer as dispatcher
print(dispatcher.use_flashinfer)
"""


def main() -> int:
    broken = False
    for release in ("0.7.2", "0.7.4"):
        done = subprocess.run([sys.executable, "-c", PROBE, release], capture_output=True, text=True, check=True)
        ok = done.stdout.split()[-1] == "True"
        print(f"FlashInfer {release}: use_flashinfer = {ok}"
              + ("" if ok else ": every FlashinferDispatcher raises 'Flashinfer is not installed or does not support A2A'"))
        broken |= not ok
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
