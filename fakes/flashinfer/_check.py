"""The failure forms of the real FlashInfer, so the fake raises what it raises.

C++ ``TVM_FFI_ICHECK(cond) << msg`` reaches Python as ``RuntimeError`` (tvm-ffi maps the
unregistered ``InternalError`` kind to it) with the text ``Check failed: (cond) is false: msg``;
``TVM_FFI_LOG_AND_THROW(Kind)`` raises that kind with the bare message.
"""

from __future__ import annotations


def icheck(ok: bool, cond: str, msg: str = "") -> None:
    """Raise like ``TVM_FFI_ICHECK(cond) << msg`` when ``ok`` is false."""
    if not ok:
        raise RuntimeError(f"Check failed: ({cond}) is false: {msg}")


def icheck_eq(x, y, x_expr: str, y_expr: str, msg: str = "") -> None:
    """Raise like ``TVM_FFI_ICHECK_EQ(x, y) << msg`` when ``x != y``."""
    if x != y:
        raise RuntimeError(f"Check failed: {x_expr} == {y_expr} ({x} vs. {y}): {msg}")


def dl_name(dtype) -> str:
    """A torch dtype as tvm-ffi prints the DLPack type (``int32``, ``bfloat16``, ...)."""
    return str(dtype).removeprefix("torch.")


def check_input_type(t, dtype, name: str) -> None:
    """``CHECK_INPUT_TYPE(name, dl_<dtype>)``."""
    icheck_eq(dl_name(t.dtype), dl_name(dtype), f"{name}.dtype()", f"dl_{dl_name(dtype)}",
              f"Inconsistency of Tensor type: {name}")


def check_contiguous(t, name: str) -> None:
    """``CHECK_CONTIGUOUS(name)`` (on the fake, ``CHECK_INPUT``'s device half always holds)."""
    icheck(t.is_contiguous(), f"{name}.IsContiguous()", f"{name} must be contiguous")
