"""The start-up hook of the processes a testbed run starts (:mod:`fakes.spawned`): where
``A2A_FAKE_FLASHINFER_EVERYWHERE`` names a FlashInfer release, its fake is installed before
the process imports anything else (first, where ``A2A_FAKE_STACKS_DIR`` names a directory, its
stacks on SIGUSR1: :mod:`fakes.stacks`); without it, nothing. Then the ``sitecustomize`` this
directory shadows, if any, runs as it would have."""

import importlib.machinery
import importlib.util
import os
import sys


def _shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[__name__] = module
        spec.loader.exec_module(module)


if os.environ.get("A2A_FAKE_FLASHINFER_EVERYWHERE"):
    try:
        from fakes.stacks import on_signal  # first: a watchdog may ask for stacks while the rest imports

        on_signal()
        from fakes.spawned import install_here
    except ImportError as e:  # the testbed is not importable from this interpreter
        sys.stderr.write(f"A2A_FAKE_FLASHINFER_EVERYWHERE is set, but this Python ({sys.executable}) cannot "
                         f"import the testbed's fake: {e}\n")
        sys.stderr.flush()
        os._exit(2)
    install_here()
_shadowed()
