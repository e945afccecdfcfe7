"""Fake ``flashinfer.tllm_enums``: the enums the all-to-all and the TRT-LLM MoE take."""

from enum import IntEnum

from fakes.flashinfer import profiles


class SfLayout(IntEnum):
    """Layout of scale factors for quantization."""

    layout_128x4 = 0
    layout_8x4 = 1
    layout_linear = 2


class WeightLayout(IntEnum):
    MajorK = 0  # [Mn, K]
    MajorMn = 1  # [K, Mn]
    BlockMajorK = 2  # [K / blockK, Mn, blockK], blockK = 128 bytes


# The per-release enums: members were added between releases and shifted the values after
# them (0.6.8's Unspecified is 8, 0.7.2's is 10), so an integer means what its release says.
# A release without an entry has its base's.
_ROUTING = ["Default", "Renormalize", "DeepSeekV3", "Llama4", "RenormalizeNaive", "TopK", "SigmoidRenorm", "MiniMax2"]
_ACTIVATION = ["Gelu", "Relu", "Silu", "Swiglu", "Geglu", "SwigluBias", "Relu2"]
_GATED = ("Swiglu", "Geglu", "SwigluBias", "SwigluStep", "GegluTanh", "Situ")
_FP8 = ["NoneFp8", "DeepSeekFp8", "MxFp8"]
_MEMBERS = {
    "0.6.7": {  # before SigmoidRenorm and MiniMax2
        "RoutingMethodType": _ROUTING[:6] + ["Unspecified"],
        "ActivationType": _ACTIVATION + ["Identity", "InvalidType"],
        "Fp8QuantizationType": _FP8,
    },
    "0.6.8": {
        "RoutingMethodType": _ROUTING + ["Unspecified"],
        "ActivationType": _ACTIVATION + ["Identity", "InvalidType"],
        "Fp8QuantizationType": _FP8,
    },
    "0.6.11": {
        "RoutingMethodType": _ROUTING + ["Sigmoid", "Unspecified"],
        "ActivationType": _ACTIVATION + ["Identity", "InvalidType"],
        "Fp8QuantizationType": _FP8,
    },
    "0.6.13": {
        "RoutingMethodType": _ROUTING + ["Sigmoid", "Unspecified"],
        "ActivationType": _ACTIVATION + ["SwigluStep", "Identity", "InvalidType"],
        "Fp8QuantizationType": _FP8,
    },
    "0.6.14": {
        "RoutingMethodType": _ROUTING + ["Sigmoid", "Unspecified"],
        "ActivationType": _ACTIVATION + ["SwigluStep", "GegluTanh", "Identity", "InvalidType"],
        "Fp8QuantizationType": _FP8,
    },
    "0.6.16": {
        "RoutingMethodType": _ROUTING + ["Sigmoid", "Unspecified"],
        "ActivationType": _ACTIVATION + ["SwigluStep", "GegluTanh", "Identity", "Situ", "InvalidType"],
        "Fp8QuantizationType": _FP8,
    },
    "0.6.18": {
        "RoutingMethodType": _ROUTING + ["Sigmoid", "TopKSigmoid", "Unspecified"],
        "ActivationType": _ACTIVATION + ["SwigluStep", "GegluTanh", "Identity", "Situ", "InvalidType"],
        "Fp8QuantizationType": _FP8,
    },
    "0.7.0": {
        "RoutingMethodType": _ROUTING + ["Sigmoid", "TopKSigmoid", "Unspecified"],
        "ActivationType": _ACTIVATION + ["SwigluStep", "GegluTanh", "Identity", "Situ", "InvalidType"],
        "Fp8QuantizationType": _FP8 + ["PerTensorFp8", "PerChannelFp8"],
    },
    "0.7.2": {
        "RoutingMethodType": _ROUTING + ["Sigmoid", "TopKSigmoid", "Unspecified"],
        "ActivationType": _ACTIVATION + ["SwigluStep", "GegluTanh", "Identity", "Situ", "InvalidType", "ClampedRelu2"],
        "Fp8QuantizationType": _FP8 + ["PerTensorFp8", "PerChannelFp8"],
    },
    "0.7.4": {
        "RoutingMethodType": _ROUTING + ["Sigmoid", "TopKSigmoid", "Unspecified"],
        "ActivationType": _ACTIVATION + ["SwigluStep", "GegluTanh", "Identity", "Situ", "InvalidType", "ClampedRelu2",
                                         "PowLU"],
        "Fp8QuantizationType": _FP8 + ["PerTensorFp8", "PerChannelFp8"],
    },
}


def _repr(self) -> str:
    return f"{type(self).__name__}.{self.name}"


def _is_gated(self) -> bool:
    """True for activations that consume a gate branch (SwiGLU family)."""
    return self.name in _GATED


_EVAL_SAFE = {"0.6.8": False, "0.6.14": True, "0.7.4": True}  # eval-safe repr and is_gated from 0.6.14 on


def _build(profile: str, name: str) -> type:
    cls = IntEnum(name, [(m, i) for i, m in enumerate(_MEMBERS[profile][name])], module=__name__)
    if profiles.pick(_EVAL_SAFE, profiles.PROFILES[profile]):
        cls.__repr__ = _repr
        if name == "ActivationType":
            cls.is_gated = property(_is_gated)
    return cls


_BY_PROFILE = {p: {n: _build(p, n) for n in members} for p, members in _MEMBERS.items()}


def __getattr__(name: str):
    table = profiles.pick(_BY_PROFILE)
    if name in table:
        return table[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(profiles.pick(_BY_PROFILE)))
