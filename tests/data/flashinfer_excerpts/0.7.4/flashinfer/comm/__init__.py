# Excerpt of FlashInfer 0.7.4 (comm/__init__.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .mapping import Mapping

def __getattr__():
    ...
