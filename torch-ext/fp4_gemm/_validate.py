"""Every rule of the public API, checked before any launch.

A broken rule raises ValueError whose message states the rule, so a caller can fix the call without
reading the source. The kernels' TORCH_CHECKs are only a last guard behind this module.

Rules on device-side data (expert ids, valid counts, routing) are checked here when that data is on
the CPU. On a GPU, checking would need a host synchronization in the hot path, so the kernels clamp
or skip instead (never reading or writing out of bounds); with FP4_GEMM_DEBUG=1 in the environment
the data is copied to the host and checked before the launch.

Two rules look at buffers, not shapes: outputs must not share memory with any input or with each
other (`disjoint`: a kernel thread would read what another one writes), and what a function
allocates must fit the device's memory (`fits_in_memory`).

Host cost: the rules on metadata (types, dtypes, shapes, devices, contiguity, plain arguments) give
the same verdict for the same metadata, so each rule set runs once per distinct key (`checked`)
and later calls look the verdict up; what varies per call (a Python float's value,
buffer addresses, device data on the host) is checked on every call.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

import torch

from . import reference
from ._gemm import OUT_DTYPES
from .reference import BlockFormat

HALF_DTYPES = (torch.bfloat16, torch.float16)
BIAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SKINNY_WARPS = (2, 4, 8)
MAX_STAGES = 8
MROWS_MAX_M = 16
W4A16_K_ALIGNMENT = 32  # the adopted weight's rows are read whole 16-byte chunks at a time
M256_MIN_M = 512
VARIANTS = (0, 1, 2)  # default, widen, pingpong; -1 picks by shape
# flashrt's schedule ids (its Thor pipelines pass 7 for large-M shapes, 10 for compact decode ones),
# accepted as hints: both run the automatic choice, which picks the wide tile from 512 rows of A.
FLASHRT_VARIANTS = {7: -1, 10: -1}
MAX_PERMUTE_EXPERTS = 8192
INT32_MAX = 2**31 - 1
T = TypeVar("T")
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def fail(rule: str) -> NoReturn:
    raise ValueError(rule)


# ---- verdicts: the metadata rules of a call, checked once per key -------------------------------

_VERDICTS: dict[tuple, object] = {}
MAX_VERDICTS = 4096  # distinct call shapes remembered; then forgotten at once
_PLAIN_TENSORS = frozenset((torch.Tensor, torch.nn.Parameter))
# No value of one of these types equals a value of another (a bool or a float is keyed with its type,
# since True == 1 == 1.0).
_KEYED_AS_THEMSELVES = frozenset((type(None), str, int, torch.dtype))
_UNKNOWN = object()
_is_compiling = torch.compiler.is_compiling


def checked(rules: Callable[..., T], *args: object) -> T:
    """rules(*args): a call's metadata rules, raising ValueError at the first broken one and returning
    what the call needs (its shapes). The verdict is remembered under what it depends on: the rules,
    each tensor argument's dtype, shape, device and contiguity, each other argument's value (with its
    type where it may equal a value of another type: True == 1 == 1.0), so a call with the same key runs
    no rule again. Never remembered: a call that breaks a rule, calls while torch.compile traces, and
    calls with tensor subclasses (a FakeTensor's metadata is not a real tensor's). Runs on every call:
    set lookups, no chains of type tests."""
    if _is_compiling():
        return rules(*args)
    key = [rules]
    append = key.append
    for part in args:
        kind = type(part)
        if kind in _PLAIN_TENSORS:
            append((part.dtype, part.shape, part.device, part.is_contiguous()))
        elif part is None or kind in _KEYED_AS_THEMSELVES:
            append(part)
        elif isinstance(part, torch.Tensor):
            return rules(*args)
        else:
            append((kind, part))
    key = tuple(key)
    try:
        verdict = _VERDICTS.get(key, _UNKNOWN)
    except TypeError:  # an unhashable value (a list as a mode): the rules reject it
        return rules(*args)
    if verdict is _UNKNOWN:
        verdict = rules(*args)
        if len(_VERDICTS) >= MAX_VERDICTS:
            _VERDICTS.clear()
        _VERDICTS[key] = verdict
    return verdict


# os.environ's own dictionary, which every change through os.environ updates: os.environ.get of an
# unset variable raises and catches a KeyError, about a microsecond on every GPU call that checks.
_ENVIRON = os.environ._data
_DEBUG_KEY, _DEBUG_ON = os.environ.encodekey("FP4_GEMM_DEBUG"), os.environ.encodevalue("1")


def debug_checks() -> bool:
    """FP4_GEMM_DEBUG=1: synchronize and check device-side data before launching. Read at every call,
    so that it can be set while a process runs."""
    return _ENVIRON.get(_DEBUG_KEY) == _DEBUG_ON


def host_data(t: torch.Tensor) -> torch.Tensor | None:
    """The tensor on the host when its values may be checked: on the CPU, or on a GPU in debug mode;
    never while torch.compile traces (values are unknown there, as on a GPU)."""
    if not t.is_cpu and not debug_checks():
        return None
    if torch.compiler.is_compiling() or isinstance(t, torch._subclasses.FakeTensor):
        return None
    return t if t.is_cpu else t.cpu()


# ---- tensors ----------------------------------------------------------------------------------


def tensor(
    name: str,
    t: object,
    *,
    dtypes: Sequence[torch.dtype],
    shape: Sequence[int | None] | None = None,
    ndim: int | None = None,
) -> torch.Tensor:
    """A tensor argument: type, dtype, rank or shape (None = any extent), device kind, contiguity."""
    if not isinstance(t, torch.Tensor):
        fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        fail(f"{name} must have dtype {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if shape is not None:
        expected = tuple(shape)
        if t.dim() != len(expected) or any(e is not None and e != s for e, s in zip(expected, t.shape, strict=True)):
            shown = tuple("*" if e is None else e for e in expected)
            fail(f"{name} must have shape {shown}, got {tuple(t.shape)}")
    elif ndim is not None and t.dim() != ndim:
        fail(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if t.device.type not in ("cpu", "cuda"):
        fail(f"{name} must be a CPU or CUDA tensor, got device {t.device}")
    if not t.is_contiguous():
        fail(f"{name} must be contiguous")
    return t


def optional(name: str, t: object, **rules: object) -> torch.Tensor | None:
    return None if t is None else tensor(name, t, **rules)


def required(**arguments: object) -> None:
    for name, value in arguments.items():
        if value is None:
            fail(f"{name} is required by this function (got None)")


def same_device(**tensors: torch.Tensor | None) -> torch.device:
    given = {name: t for name, t in tensors.items() if t is not None}
    devices = {t.device for t in given.values()}
    if len(devices) > 1:
        fail(f"all tensors must be on one device, got {', '.join(f'{n}: {t.device}' for n, t in given.items())}")
    return next(iter(devices))


def scale_buffer(name: str, t: object, rows: int, nkb: int) -> torch.Tensor:
    """A swizzled scale buffer: uint8, contiguous, exactly the bytes of the SfAtom tiles (any shape)."""
    tensor(name, t, dtypes=(torch.uint8,), ndim=t.dim() if isinstance(t, torch.Tensor) else None)
    expected = reference.sf_bytes(rows, nkb)
    if t.numel() != expected:
        fail(
            f"{name} must hold the swizzled scales of {rows} rows x {nkb} blocks: "
            f"ceil({rows}/128) * ceil({nkb}/4) * 512 = {expected} bytes, got {t.numel()}"
        )
    return t


def positive_int(name: str, value: object, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        fail(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def number(name: str, value: object) -> float:
    """A Python float (an int is accepted) that the kernels can take as a float32: NaN and +-inf pass
    through as they are, a finite value beyond the float32 range would become inf there."""
    if type(value) is float and -FLOAT32_MAX <= value <= FLOAT32_MAX:  # the common case, at once
        return value
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        fail(f"{name} must be a Python float, got {type(value).__name__}")
    rule = f"{name} must be within the float32 range (|{name}| <= {FLOAT32_MAX:.8g})"
    try:
        result = float(value)
    except OverflowError:
        fail(f"{rule}, got an int of {value.bit_length()} bits")
    if math.isfinite(result) and abs(result) > FLOAT32_MAX:
        fail(f"{rule}, got {result!r}")
    return result


def sm_count(value: object) -> None:
    if not integer(value) or not (value == -1 or 1 <= value <= INT32_MAX):
        fail(f"sm_count must be -1 (all SMs) or a positive integer below 2**31, got {value!r}")


def multiple(name: str, value: int, of: int, why: str) -> None:
    if value <= 0 or value % of != 0:
        fail(f"{name} ({value}) must be a positive multiple of {of} ({why})")


def disjoint(
    outputs: tuple[torch.Tensor | None, ...],
    inputs: tuple[torch.Tensor | None, ...],
    names: tuple[str, ...],
    in_place: tuple[str, str] | None = None,
) -> None:
    """Outputs share no byte with any input or with each other: a kernel would race, one thread
    reading what another writes. `names`: the outputs' names, then the inputs' (for the message).
    `in_place` names the one (output, input) pair that may be the very same buffer (each element
    read, then written, by one thread). Contiguous tensors on one device: byte ranges decide (a fake
    tensor has none: nothing to check). Runs on every call: address comparisons only, until two
    ranges meet (`_shared` then names the pair, or lets the in-place pair be)."""
    if _is_compiling():
        return
    others = outputs[1:] + inputs
    for i, out in enumerate(outputs):
        if type(out) in _PLAIN_TENSORS:  # not None, not a fake tensor
            start = out.data_ptr()
            end = start + out.nbytes
            for t in others[i:]:
                if t is not None:
                    other_start = t.data_ptr()
                    if other_start < end and start < other_start + t.nbytes:
                        _shared(i, outputs, inputs, names, in_place)
                        break


def _shared(
    i: int,
    outputs: tuple[torch.Tensor | None, ...],
    inputs: tuple[torch.Tensor | None, ...],
    names: tuple[str, ...],
    in_place: tuple[str, str] | None,
) -> None:
    """Output i meets another buffer's byte range: raises for the first buffer it truly shares memory
    with (both non-empty), unless that is the in-place pair's very buffer."""
    out = outputs[i]
    start = out.data_ptr()
    end = start + out.nbytes
    for j, t in enumerate(outputs[i + 1 :] + inputs, i + 1):
        if t is not None:
            other_start = t.data_ptr()
            if other_start < end and start < other_start + t.nbytes and out.numel() and t.numel():
                same_bytes = (start, end) == (other_start, other_start + t.nbytes)
                overlap(names[i], names[j], same_bytes, in_place)


# The buffers of the GEMMs' disjoint checks: outputs, then inputs.
_NVFP4_GEMM_NAMES = ("out", "a_packed", "b_packed", "sfa", "sfb", "bias", "residual")
_NVFP4_OUT_NAMES = ("out_packed", "out_sfa", *_NVFP4_GEMM_NAMES[1:])
_W4A16_NAMES = ("out", "x", "weight", "scale", "global_scale", "workspace")
_HALOPS_NAMES = ("output", "input", "weight", "sfa", "sfb", "bias", "alpha", "expert_ids")
_MASKED_NAMES = (*_HALOPS_NAMES[:-1], "masked_m")


def overlap(name: str, other: str, same_bytes: bool, in_place: tuple[str, str] | None) -> None:
    """Output `name` shares memory with `other`: an error unless it is the in-place pair's very buffer."""
    if (name, other) == in_place and same_bytes:
        return
    allowed = f"; {in_place[0]} may be {in_place[1]} itself" if in_place else ""
    fail(f"{name} must not share memory with {other} (outputs overlap no input and no other output{allowed})")


_DEVICE_MEMORY: dict[torch.device, int | None] = {}


def device_memory(device: torch.device) -> int | None:
    """Bytes of memory of a device (CUDA: total_memory; the CPU: physical memory), read once; None
    where unknown (a fake CUDA tensor on a machine without one)."""
    if device not in _DEVICE_MEMORY:
        if device.type == "cuda":
            known = torch.cuda.is_available()
            _DEVICE_MEMORY[device] = torch.cuda.get_device_properties(device).total_memory if known else None
        else:
            _DEVICE_MEMORY[device] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return _DEVICE_MEMORY[device]


def fits_in_memory(what: str, nbytes: int, device: torch.device) -> None:
    """What a function allocates must fit the device's memory (else the allocator fails, or on the CPU
    the system's memory runs out)."""
    if torch.compiler.is_compiling():
        return
    limit = device_memory(device)
    if limit is not None and nbytes > limit:
        fail(f"{what} would need {nbytes} bytes, more than the memory of {device} ({limit} bytes)")


def packed_bytes(rows: int, cols: int) -> int:
    """Bytes of packed NVFP4 values [rows, cols / 2] and their flat scales."""
    return rows * cols // 2 + reference.sf_bytes(rows, -(-cols // 16))


# ---- quantizers -------------------------------------------------------------------------------


def mode_format(mode: object) -> BlockFormat:
    if not isinstance(mode, str) or mode not in reference.MODES:
        fail(f"mode must be one of {sorted(reference.MODES)}, got {mode!r}")
    return reference.MODES[mode]


def quantize_input(name: str, x: object, dtypes: Sequence[torch.dtype], group: int) -> torch.Tensor:
    tensor(name, x, dtypes=dtypes, ndim=2)
    multiple(f"{name}.shape[1] (K)", x.shape[1], group, f"blocks of {group}")
    return x


def group_wise_quant(
    input: object, mode: object, use_swizzle: object, use_pdl: object
) -> tuple[str, tuple[int, int], torch.dtype, tuple[int, int]]:
    """group_wise_quant's rules; returns its recipe, the values' shape and dtype and the scales' shape."""
    return checked(_group_wise_quant, input, mode, use_swizzle, use_pdl)


def _group_wise_quant(
    input: torch.Tensor, mode: str, use_swizzle: object, use_pdl: object
) -> tuple[str, tuple[int, int], torch.dtype, tuple[int, int]]:
    fmt = mode_format(mode)
    boolean("use_swizzle", use_swizzle)
    boolean("use_pdl", use_pdl)
    tensor("input", input, dtypes=HALF_DTYPES, ndim=2)
    multiple("input.shape[1] (K)", input.shape[1], fmt.group, f"blocks of {fmt.group} in mode {mode!r}")
    rows, k = input.shape
    cols, nkb = fmt.stored_cols(k), k // fmt.group
    fits_in_memory("the quantized values and scales", rows * cols + reference.sf_bytes(rows, nkb), input.device)
    dtype = torch.float8_e4m3fn if fmt.element_bits == 8 else torch.uint8
    scale_shape = reference.swizzled_scale_shape(rows, nkb) if use_swizzle else (rows, nkb)
    return fmt.name, (rows, cols), dtype, scale_shape


def fp4_quantizer(x: object, dtype: torch.dtype, packed: object, sfa: object) -> None:
    """A flashrt-style quantizer: x [rows, K]; caller buffers both or neither (packed [rows, K/2], flat scales)."""
    checked(_fp4_quantizer, x, dtype, packed, sfa)
    if packed is not None:
        disjoint((packed, sfa), (x,), ("packed", "sfa", "x"))


def _fp4_quantizer(x: object, dtype: torch.dtype, packed: object, sfa: object) -> None:
    quantize_input("x", x, (dtype,), 16)
    if (packed is None) != (sfa is None):
        fail("pass both packed and sfa, or neither")
    rows, cols = x.shape
    if packed is None:
        fits_in_memory("the packed values and scales", packed_bytes(rows, cols), x.device)
        return
    tensor("packed", packed, dtypes=(torch.uint8,), shape=(rows, cols // 2))
    scale_buffer("sfa", sfa, rows, cols // 16)
    same_device(x=x, packed=packed, sfa=sfa)


def alignment(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value % 16 != 0:
        fail(f"alignment must be a positive multiple of 16, got {value!r}")
    return value


def aligned_dim(dim: int, align: int) -> int:
    """dim rounded up to a multiple of align."""
    return -(-dim // align) * align


def padded_quantizer(x: object, align: object) -> None:
    checked(_padded_quantizer, x, align)


def _padded_quantizer(x: object, align: object) -> None:
    tensor("x", x, dtypes=(torch.bfloat16,), ndim=2)
    alignment(align)
    rows, k = x.shape
    fits_in_memory("the padded values and scales", packed_bytes(rows, aligned_dim(k, align)), x.device)


def pack_weight(weight: object, bias: object, align: object, mse: object) -> None:
    checked(_pack_weight, weight, bias, align, mse)


def _pack_weight(weight: object, bias: object, align: object, mse: object) -> None:
    tensor("weight", weight, dtypes=(torch.bfloat16,), ndim=2)
    alignment(align)
    boolean("mse", mse)
    optional("bias", bias, dtypes=(torch.bfloat16,), shape=(weight.shape[0],))
    same_device(weight=weight, bias=bias)
    n, k = aligned_dim(weight.shape[0], align), aligned_dim(weight.shape[1], align)
    fits_in_memory("the padded weight, scales and bias", packed_bytes(n, k) + 2 * n, weight.device)


def dequantizer(packed: object, sfa: object, out: object) -> None:
    checked(_dequantizer, packed, sfa, out)
    if out is not None:
        disjoint((out,), (packed, sfa), ("out", "packed", "sfa"))


def _dequantizer(packed: object, sfa: object, out: object) -> None:
    tensor("packed", packed, dtypes=(torch.uint8,), ndim=2)
    rows, cols = packed.shape[0], packed.shape[1] * 2
    multiple("K (2 * packed.shape[1])", cols, 16, "NVFP4 blocks of 16")
    scale_buffer("sfa", sfa, rows, cols // 16)
    optional("out", out, dtypes=(torch.float16,), shape=(rows, cols))
    same_device(packed=packed, sfa=sfa, out=out)
    if out is None:
        fits_in_memory("the float16 output", 2 * rows * cols, packed.device)


# ---- flashrt-style GEMMs ----------------------------------------------------------------------


def integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def boolean(name: str, value: object) -> None:
    if not isinstance(value, bool):
        fail(f"{name} must be a bool, got {type(value).__name__}")


def variant(value: object, *, allow_auto: bool = True) -> int:
    """The variant that runs: one of capabilities()['variants'] (-1 only where allow_auto), or a
    flashrt schedule id, which maps to its FLASHRT_VARIANTS hint."""
    allowed = ((-1,) if allow_auto else ()) + VARIANTS
    if integer(value) and value in FLASHRT_VARIANTS:
        return FLASHRT_VARIANTS[value]
    if not integer(value) or value not in allowed:
        flashrt = tuple(FLASHRT_VARIANTS)
        fail(f"variant must be one of {allowed} (capabilities()['variants']) or a flashrt id {flashrt}, got {value!r}")
    return value


def nvfp4_gemm(
    a: object,
    b: object,
    sfa: object,
    sfb: object,
    alpha: object,
    bias: object,
    residual: object,
    activation: str,
    out_format: str,
    out: object,
    out_scales: object,
) -> tuple[int, int, float]:
    """Operands, epilogue tensors and caller outputs of a flashrt-style GEMM without a decode tier;
    returns (M, N_out) and alpha as the float the kernels take. (The GEMMs themselves remember
    nvfp4_gemm_rules' verdict with their op fields and check nvfp4_gemm_buffers per call.)"""
    m, n_out, _ = checked(
        nvfp4_gemm_rules, a, b, sfa, sfb, bias, residual, activation, out_format, out, out_scales, None
    )  # fmt: skip
    return m, n_out, nvfp4_gemm_buffers(alpha, a, b, sfa, sfb, bias, residual, out, out_scales)


def nvfp4_gemm_buffers(
    alpha: object, a: object, b: object, sfa: object, sfb: object, bias: object, residual: object, out: object,
    out_scales: object,
) -> float:  # fmt: skip
    """The per-call rules of a flashrt-style GEMM (after nvfp4_gemm_rules): alpha as the float the
    kernels take, which it returns, and caller outputs that share no memory with the inputs."""
    alpha = number("alpha", alpha)
    if out_scales is not None:
        disjoint((out, out_scales), (a, b, sfa, sfb, bias, residual), _NVFP4_OUT_NAMES)
    elif out is not None:
        disjoint((out,), (a, b, sfa, sfb, bias, residual), _NVFP4_GEMM_NAMES, in_place=("out", "residual"))
    return alpha


def nvfp4_gemm_rules(
    a: object,
    b: object,
    sfa: object,
    sfb: object,
    bias: object,
    residual: object,
    activation: str,
    out_format: str,
    out: object,
    out_scales: object,
    tier_rules: Callable[[object, object, object, object], None] | None,
    warps: object = 0,
    stages: object = 0,
) -> tuple[int, int, int]:
    """The metadata rules of the flashrt-style GEMMs, a decode tier's own rules first (`tier_rules`:
    mrows, gemv or gemv_standard, on its warps and stages); returns (M, N_out, K). Run through
    `checked`."""
    if tier_rules is not None:
        tier_rules(a, b, warps, stages)
    m, n, k = packed_shape(a, b)
    if b.shape[1] * 2 != k:
        fail(f"a_packed and b_packed must have the same K: a gives {k}, b gives {b.shape[1] * 2}")
    multiple("K", k, 16, "NVFP4 blocks of 16")
    if m < 1 or n < 1:
        fail(f"M and N must be >= 1, got M={m}, N={n}")
    scale_buffer("sfa", sfa, m, k // 16)
    scale_buffer("sfb", sfb, n, k // 16)
    n_out = n
    if activation == "geglu":
        multiple("N of the interleaved GeGLU weight", n, 2, "gate and up rows alternate")
        n_out = n // 2
    optional("bias", bias, dtypes=BIAS_DTYPES, shape=(n,))
    if out_format.startswith("nvfp4"):
        multiple("the output width", n_out, 16, "NVFP4 output blocks of 16")
        if (out is None) != (out_scales is None):
            fail("pass both out_packed and out_sfa, or neither")
        optional("out_packed", out, dtypes=(torch.uint8,), shape=(m, n_out // 2))
        if out_scales is not None:
            scale_buffer("out_sfa", out_scales, m, n_out // 16)
    else:
        dtype = OUT_DTYPES[out_format]
        optional("residual", residual, dtypes=(dtype,), shape=(m, n))
        optional("out", out, dtypes=(dtype,), shape=(m, n_out))
    device = same_device(a=a, b=b, sfa=sfa, sfb=sfb, bias=bias, residual=residual, out=out, out_scales=out_scales)
    if out is None:
        nbytes = packed_bytes(m, n_out) if out_format.startswith("nvfp4") else 2 * m * n_out
        fits_in_memory("the output", nbytes, device)
    return m, n_out, k


def skinny_knobs(warps: object, stages: object) -> None:
    if not integer(warps) or warps not in SKINNY_WARPS:
        fail(f"warps must be one of {SKINNY_WARPS}, got {warps!r}")
    if not isinstance(stages, int) or isinstance(stages, bool) or not 1 <= stages <= MAX_STAGES:
        fail(f"stages must be an integer in [1, {MAX_STAGES}], got {stages!r}")


def packed_shape(a: object, b: object) -> tuple[int, int, int]:
    """(M, N, K) of packed operands, after checking they are 2-D uint8 tensors."""
    tensor("a_packed", a, dtypes=(torch.uint8,), ndim=2)
    tensor("b_packed", b, dtypes=(torch.uint8,), ndim=2)
    return a.shape[0], b.shape[0], a.shape[1] * 2


def mrows(a: object, b: object, warps: object, stages: object) -> None:
    m, n, k = packed_shape(a, b)
    skinny_knobs(warps, stages)
    if not 1 <= m <= MROWS_MAX_M:
        fail(f"fp4_w4a4_gemm_warpsplit_mrows_bf16 needs 1 <= M <= {MROWS_MAX_M}, got M={m}")
    multiple("N", n, 8, "the multi-row tier reads 8 weight rows at a time")
    multiple("K", k, 64 * warps, "64 * warps: each warp takes whole 64-element slices")


def _one_row(function: str, a: object, b: object, warps: object, stages: object) -> tuple[int, int]:
    """The rules every M = 1 GEMV shares: packed operands, its knobs, one row of A; returns (N, K)."""
    m, n, k = packed_shape(a, b)
    skinny_knobs(warps, stages)
    if m != 1:
        fail(f"{function} serves M = 1 only, got M={m}")
    return n, k


def gemv(a: object, b: object, warps: object, stages: object) -> None:
    n, k = _one_row("fp4_w4a4_gemv_warpsplit_interleaved_bf16", a, b, warps, stages)
    multiple("N", n, reference.STREAM_TILE_ROWS, "the streaming layout tiles 8 rows")
    multiple("K", k, reference.STREAM_TILE_K, "the streaming layout tiles 64 elements")


def repack(b: object, out: object) -> None:
    """out may overlap b: the op goes through a copy."""
    checked(_repack, b, out)


def _repack(b: object, out: object) -> None:
    tensor("b_packed", b, dtypes=(torch.uint8,), ndim=2)
    multiple("N", b.shape[0], reference.STREAM_TILE_ROWS, "the streaming layout tiles 8 rows")
    multiple("K", b.shape[1] * 2, reference.STREAM_TILE_K, "the streaming layout tiles 64 elements")
    optional("out", out, dtypes=(torch.uint8,), shape=tuple(b.shape))
    same_device(b_packed=b, out=out)


def m256_buffers(workspace: torch.Tensor, operands: tuple) -> None:
    """The M >= 512 tier's per-call rule (after m256_rules): its workspace shares no memory with
    `operands` = (a, b, sfa, sfb, out)."""
    disjoint((workspace,), operands, ("workspace", "a_packed", "b_packed", "sfa", "sfb", "out"))


def m256_rules(a: torch.Tensor, workspace: object, required: int) -> None:
    """The M >= 512 tier's metadata rules (inside the GEMM's verdict): M, and a caller workspace of at
    least `required` bytes."""
    m = a.shape[0]
    if m < M256_MIN_M:
        fail(f"nvfp4_gemm_m256_bf16 needs M >= {M256_MIN_M}, got M={m}")
    if workspace is None:
        fail("nvfp4_gemm_m256_bf16 needs a caller workspace of nvfp4_gemm_m256_workspace_size(...) bytes")
    tensor(
        "workspace",
        workspace,
        dtypes=(torch.uint8,),
        ndim=workspace.dim() if isinstance(workspace, torch.Tensor) else None,
    )
    if workspace.numel() < required:
        fail(f"workspace must hold at least {required} bytes, got {workspace.numel()}")
    same_device(a_packed=a, workspace=workspace)


def e0m3_a_format(value: object) -> str:
    if not integer(value) or value not in (0, 1):
        fail(f"a_format must be 1 (E2M1 activations) or 0 (E0M3 activations), got {value!r}")
    return "nvfp4" if value == 1 else "e0m3"


def gemv_standard(a: object, b: object, warps: object, stages: object) -> None:
    _one_row("fp4_w4a4_gemv_warpsplit_bf16", a, b, warps, stages)


# ---- the W4A16 tier (bf16 activations, NVFP4 weights) ------------------------------------------


def device(name: str, value: object) -> torch.device:
    """A torch.device, or what torch.device accepts (a string such as "cuda:0", a device index)."""
    try:
        return value if isinstance(value, torch.device) else torch.device(value)
    except (RuntimeError, TypeError):
        fail(f"{name} must be a torch.device or a device string such as 'cuda:0', got {value!r}")


def adopt_w4a16(weight_packed: object, weight_scale: object, weight_scale_2: object) -> tuple[int, int]:
    """ModelOpt NVFP4 tensors of one layer; returns (N, K)."""
    tensor("weight_packed", weight_packed, dtypes=(torch.uint8,), ndim=2)
    n, k = weight_packed.shape[0], 2 * weight_packed.shape[1]
    if n < 1 or k < 1:
        fail(f"weight_packed must have N >= 1 rows and K >= 1 elements, got {tuple(weight_packed.shape)}")
    multiple("K", k, W4A16_K_ALIGNMENT, "whole 16-byte rows of packed weight (and 16-element NVFP4 blocks)")
    tensor("weight_scale", weight_scale, dtypes=(torch.float8_e4m3fn, torch.uint8), shape=(n, k // 16))
    tensor("weight_scale_2", weight_scale_2, dtypes=(torch.float32,))
    if weight_scale_2.numel() != 1:
        fail(f"weight_scale_2 must hold one float32 (the global scale), got {weight_scale_2.numel()} values")
    same_device(weight_packed=weight_packed, weight_scale=weight_scale, weight_scale_2=weight_scale_2)
    return n, k


def w4a16_gemm_buffers(
    x: object, weight: object, scale: object, global_scale: object, workspace: object, out: object
) -> None:
    """nvfp4_w4a16_marlin_bf16's per-call rule (after w4a16_gemm_rules): out shares no memory with the inputs."""
    disjoint((out,), (x, weight, scale, global_scale, workspace), _W4A16_NAMES)


def w4a16_gemm_rules(
    x: object, weight: object, scale: object, global_scale: object, workspace: object, out: object
) -> None:
    """nvfp4_w4a16_marlin_bf16's metadata rules (run through `checked`): bf16 x [M, K], the adopted
    weight, its scales and global scale, the workspace, a caller out."""
    tensor("x", x, dtypes=(torch.bfloat16,), ndim=2)
    tensor("weight", weight, dtypes=(torch.uint8,), ndim=2)
    m, k, n = x.shape[0], x.shape[1], weight.shape[0]
    if m < 1:
        fail(f"x must have M >= 1 rows, got {m}")
    if weight.shape[1] * 2 != k:
        fail(f"x and weight must have the same K: x gives {k}, weight gives {weight.shape[1] * 2}")
    multiple("K", k, W4A16_K_ALIGNMENT, "whole 16-byte rows of packed weight (and 16-element NVFP4 blocks)")
    scale_buffer("scale", scale, n, k // 16)
    tensor("global_scale", global_scale, dtypes=(torch.float32,), shape=(1,))
    if workspace is None:
        fail("workspace is required: allocate_w4a16_marlin_workspace(device) once, before graph capture")
    tensor("workspace", workspace, dtypes=(torch.int32,), ndim=1)
    optional("out", out, dtypes=(torch.bfloat16,), shape=(m, n))
    same_device(x=x, weight=weight, scale=scale, global_scale=global_scale, workspace=workspace, out=out)
    if out is None:
        fits_in_memory("the output", 2 * m * n, x.device)


# ---- halops-style GEMMs -----------------------------------------------------------------------


def gemm_mode_format(mode: object) -> BlockFormat:
    """The weight format of a halops GEMM mode: the w8a8/w4a4 modes, or the weight-only w4a16 ones."""
    modes = reference.MODES | reference.W4A16_MODES
    if not isinstance(mode, str) or mode not in modes:
        fail(f"mode must be one of {sorted(modes)}, got {mode!r}")
    return modes[mode]


def _operands(mode: str, input: object, weight: object, input_rank: int, weight_rank: int) -> tuple[BlockFormat, int]:
    fmt = gemm_mode_format(mode)
    dtype = torch.float8_e4m3fn if fmt.element_bits == 8 else torch.uint8
    weight_only = mode in reference.W4A16_MODES
    tensor("input", input, dtypes=(torch.bfloat16,) if weight_only else (dtype,), ndim=input_rank)
    tensor("weight", weight, dtypes=(dtype,), ndim=weight_rank)
    k = input.shape[-1] if weight_only else input.shape[-1] * 8 // fmt.element_bits
    if weight.shape[-1] * 8 // fmt.element_bits != k:
        fail(f"input and weight must have the same K: {tuple(input.shape)} vs {tuple(weight.shape)}")
    multiple("K", k, fmt.group, f"blocks of {fmt.group} in mode {mode!r}")
    return fmt, k


def _epilogue(mode: str, alpha: object, groups: int, bias: object, bias_shape: tuple[int, ...]) -> None:
    optional("alpha", alpha, dtypes=(torch.float32,), shape=(groups,))
    if mode == "w4a4-nvfp4" and alpha is None:
        fail("alpha (float32 tensor) is required in mode 'w4a4-nvfp4': it carries 1 / (global scale of A * of B)")
    optional("bias", bias, dtypes=(torch.bfloat16,), shape=bias_shape)


def halops_gemm_data(
    grouping: str,
    groups: int,
    input: object,
    weight: object,
    sfa: object,
    sfb: object,
    output: object,
    bias: object,
    alpha: object,
    group_index: object,
    max_m: object,
) -> None:
    """The per-call rules of the halops GEMMs (after halops_gemm_rules, which gives `groups`): the
    device data where it may be read (expert ids, valid counts) and an output that shares no memory
    with the inputs."""
    if grouping == "contiguous":
        expert_ids(group_index, groups)
    elif grouping == "masked":
        valid_counts("masked_m", group_index, max_m)
    inputs = (input, weight, sfa, sfb, bias, alpha, group_index)
    disjoint((output,), inputs, _MASKED_NAMES if grouping == "masked" else _HALOPS_NAMES)


def halops_gemm_rules(*parts: object) -> tuple[str, str, int, int]:
    """The metadata rules of dense_gemm, batch_gemm, group_contiguous_gemm and group_masked_gemm, run
    through `checked` on (grouping, mode, input, weight, sfa, sfb, output, bias, alpha, sm_count,
    group_index, max_m, use_pdl); returns the formats of A and B (GemmCall's names: "bf16" for the
    w4a16 modes' activations), the number of weight matrices and the rows of A per group (batched:
    each item's, masked: max_m; 0 otherwise)."""
    grouping, mode, input, weight, sfa, sfb, output, bias, alpha, sm, group_index, max_m, use_pdl = parts
    sm_count(sm)
    boolean("use_pdl", use_pdl)
    if grouping == "batched":
        fmt, k = _operands(mode, input, weight, 3, 3)
        groups, rows, n = input.shape[0], input.shape[0] * input.shape[1], weight.shape[1]
        if weight.shape[0] != groups:
            fail(f"weight must have one matrix per batch item: {weight.shape[0]} != {groups}")
        out_shape, bias_shape = (groups, input.shape[1], n), (groups, n)
    elif grouping == "dense":
        fmt, k = _operands(mode, input, weight, 2, 2)
        groups, rows, n = 1, input.shape[0], weight.shape[0]
        out_shape, bias_shape = (rows, n), (n,)
    else:
        fmt, k = _operands(mode, input, weight, 2, 3)
        groups, rows, n = weight.shape[0], input.shape[0], weight.shape[1]
        out_shape, bias_shape = (rows, n), (groups, n)
    if mode in reference.W4A16_MODES:
        if sfa is not None:
            fail(f"sfa must be None in mode {mode!r}: its bf16 activations have no scales")
    else:
        scale_buffer("sfa", sfa, rows, k // fmt.group)
    scale_buffer("sfb", sfb, groups * n, k // fmt.group)
    tensor("output", output, dtypes=(torch.bfloat16,), shape=out_shape)
    _epilogue(mode, alpha, groups, bias, bias_shape)
    if grouping == "contiguous":
        tensor("expert_ids", group_index, dtypes=(torch.int32,), shape=(rows,))
    if grouping == "masked":
        positive_int("max_m_per_expert", max_m)
        if rows != groups * max_m:
            fail(f"input must have num_experts * max_m_per_expert = {groups} * {max_m} rows, got {rows}")
        tensor("masked_m", group_index, dtypes=(torch.int32,), shape=(groups,))
    same_device(input=input, weight=weight, sfa=sfa, sfb=sfb, output=output, bias=bias, alpha=alpha, index=group_index)
    group_rows = input.shape[1] if grouping == "batched" else max_m if grouping == "masked" else 0
    return "bf16" if mode in reference.W4A16_MODES else fmt.name, fmt.name, groups, group_rows


def expert_ids(ids: torch.Tensor, experts: int) -> None:
    host = host_data(ids)
    if host is None:
        return
    if ((host < -1) | (host >= experts)).any():
        fail(f"expert_ids must lie in [0, {experts}) or be -1 (padding row)")
    real = host[host >= 0]
    if (real[1:] < real[:-1]).any():
        fail("expert_ids must be sorted in non-decreasing order (ignoring -1 padding rows)")
    runs = torch.unique_consecutive(host)
    runs = runs[runs >= 0]
    if (runs[1:] == runs[:-1]).any():  # grouped kernels take each expert's rows as one range
        fail("expert_ids: each expert's rows must be consecutive (-1 padding rows only before, between or after them)")


def valid_counts(name: str, counts: torch.Tensor, maximum: int) -> None:
    host = host_data(counts)
    if host is not None and ((host < 0) | (host > maximum)).any():
        fail(f"{name} must lie in [0, {maximum}] (the rows each group owns)")


# ---- MoE data movement ------------------------------------------------------------------------


def swiglu_quant(input: object, counts: object, is_fp4: object) -> None:
    rows_per_group = checked(_swiglu_quant, input, counts, is_fp4)
    valid_counts("token_nums_per_expert", counts, rows_per_group)


def _swiglu_quant(input: object, counts: object, is_fp4: object) -> int:
    """The metadata rules of fused_swiglu_quant; returns the rows each group has."""
    boolean("is_fp4", is_fp4)
    group = 16 if is_fp4 else 32
    tensor("input", input, dtypes=(torch.bfloat16,), ndim=2)
    multiple("input.shape[1] (2 * hidden_size)", input.shape[1], 2 * group, f"gate and up halves of blocks of {group}")
    tensor("token_nums_per_expert", counts, dtypes=(torch.int32,), ndim=1)
    experts = counts.shape[0]
    if experts < 1 or input.shape[0] % experts != 0:
        fail(f"input rows ({input.shape[0]}) must be num_experts ({experts}) * rows per expert")
    same_device(input=input, token_nums_per_expert=counts)
    rows, hidden = input.shape[0], input.shape[1] // 2
    nbytes = rows * hidden * (4 if is_fp4 else 8) // 8 + reference.sf_bytes(rows, hidden // group)
    fits_in_memory("the quantized values and scales", nbytes, input.device)
    return rows // experts


def permute(x: object, scale: object, topk_ids: object, experts: object, max_token_num: object) -> None:
    checked(_permute, x, scale, topk_ids, experts, max_token_num)
    host = host_data(topk_ids)
    if host is not None and debug_checks():  # overflow is legal (counts report it); debug mode flags it
        routed = host[(host >= 0) & (host < experts)]
        most = int(torch.bincount(routed, minlength=experts).max()) if routed.numel() else 0
        if most > max_token_num:
            fail(f"an expert receives {most} tokens, more than max_token_num = {max_token_num}")


def _permute(x: object, scale: object, topk_ids: object, experts: object, max_token_num: object) -> None:
    tensor("x", x, dtypes=(torch.float8_e4m3fn, torch.bfloat16), ndim=2)
    tokens, hidden = x.shape
    tensor("scale", scale, dtypes=(torch.int32, torch.uint8), ndim=2)
    if scale.dtype == torch.int32:
        multiple("hidden", hidden, 512, "int32 broadcast scales hold 4 bytes of 128-element groups")
        tensor("scale", scale, dtypes=(torch.int32,), shape=(tokens, hidden // 512))
    else:
        multiple("hidden", hidden, 128, "uint8 direct scales fill whole 4-block SfAtom columns")
        tensor("scale", scale, dtypes=(torch.uint8,), shape=(tokens, hidden // 32))
    tensor("topk_ids", topk_ids, dtypes=(torch.int64,), ndim=2)
    if topk_ids.shape[0] != tokens:
        fail(f"topk_ids must have one row per token ({tokens}), got {tuple(topk_ids.shape)}")
    positive_int("num_local_experts", experts)
    if experts > MAX_PERMUTE_EXPERTS:
        fail(
            f"num_local_experts must be <= {MAX_PERMUTE_EXPERTS} (one shared-memory counter per expert), got {experts}"
        )
    positive_int("max_token_num", max_token_num, 128)
    multiple("max_token_num", max_token_num, 128, "whole 128-row scale tiles per expert")
    same_device(x=x, scale=scale, topk_ids=topk_ids)
    rows = experts * max_token_num
    nbytes = (
        rows * hidden * x.element_size() + reference.sf_bytes(rows, hidden // 32) + 4 * (topk_ids.numel() + experts)
    )
    fits_in_memory(f"the permuted rows (num_local_experts * max_token_num = {rows})", nbytes, x.device)
