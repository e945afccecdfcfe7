"""A second module claiming the toy's name (the registry refuses it)."""

from toy_integration import INTEGRATION  # noqa: F401
