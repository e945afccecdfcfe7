"""What the rank program records of FlashInfer and of the integration, one module per
instrumented API, each returning what it patched or wrapping what it is given."""
