// Excerpt of FlashInfer 0.6.3 (data/csrc/nv_internal/tensorrt_llm/kernels/communicationKernels/moeAlltoAllKernels.h), Apache-2.0, (c) the FlashInfer authors:
// signatures, constants and return statements only, for the fake's contract test.
static constexpr int kMaxExperts = 256

static constexpr int kMaxTopK = 8

static constexpr int kMaxPayloads = 8

static constexpr int kMaxRanks = 64

