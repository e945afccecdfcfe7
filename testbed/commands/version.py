"""``a2a-testbed version``: the testbed's, torch's and Python's versions."""

from __future__ import annotations

import sys

NAME = "version"


def add_parser(sub) -> None:
    sub.add_parser(NAME, help="print the testbed, torch and Python versions")


def main(args) -> int:
    import torch

    from testbed import __version__

    print(f"a2a-testbed {__version__} (torch {torch.__version__}, Python {sys.version.split()[0]})")
    return 0
