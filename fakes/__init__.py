"""The CPU fake of FlashInfer; ``fakes.flashinfer`` will mirror the real module paths.

Arrives with the fake-FlashInfer issue; this package is the layout's anchor.
"""
