// Excerpt of FlashInfer 0.6.7.post2 (data/csrc/nv_internal/tensorrt_llm/kernels/communicationKernels/moeAlltoAllKernels.cu), Apache-2.0, (c) the FlashInfer authors:
// signatures, constants and return statements only, for the fake's contract test.
#define SWITCH_TOP_K(top_k, TOP_K, ...)             \
  switch (top_k) {                                  \
    case 8: {                                       \
      constexpr int TOP_K = 8;                      \
      __VA_ARGS__;                                  \
      break;                                        \
    }                                               \
    case 4: {                                       \
      constexpr int TOP_K = 4;                      \
      __VA_ARGS__;                                  \
      break;                                        \
    }                                               \
    case 2: {                                       \
      constexpr int TOP_K = 2;                      \
      __VA_ARGS__;                                  \
      break;                                        \
    }                                               \
    case 1: {                                       \
      constexpr int TOP_K = 1;                      \
      __VA_ARGS__;                                  \
      break;                                        \
    }                                               \
    default: {                                      \
      FLASHINFER_CHECK(false, "Unsupported top_k"); \
    }                                               \
  }

