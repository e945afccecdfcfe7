"""Fake ``flashinfer.quantization``: the weight-layout helpers FlashInfer exports at its root."""
