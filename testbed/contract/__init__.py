"""``a2a-testbed contract``: the fake's surface checked against a real FlashInfer release,
read as source (``ast`` for Python, patterns for the C++ constants); nothing imports CUDA."""

from testbed.contract.compare import Report, compare, format_report, profile_for
from testbed.contract.source import SourceError, open_source

__all__ = ["Report", "SourceError", "compare", "format_report", "open_source", "profile_for"]
