// Excerpt of FlashInfer 0.6.11 (data/csrc/nv_internal/tensorrt_llm/kernels/communicationKernels/moeAlltoAllKernels.h), Apache-2.0, (c) the FlashInfer authors:
// signatures, constants and return statements only, for the fake's contract test.
static constexpr int kMaxTopK = 22

static constexpr int kMaxPayloads = 4

static constexpr int kMaxRanks = 64

