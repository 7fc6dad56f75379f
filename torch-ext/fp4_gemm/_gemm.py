"""One description of a GEMM call: the arguments of the registered `gemm` op, by name.

`GemmCall` is the Python side of csrc/gemm/problem.h's GemmProblem (the binding's describe_gemm turns
one into the other): the operands and their formats, the grouping, the epilogue (alpha, bias,
residual, activation, output encoding) and how it runs (schedule, variant, sm_count, warps, stages,
splits, pdl), which never changes what it computes. Every public GEMM function validates its
arguments and runs one GemmCall; capabilities() asks the backends about the calls they build
(`GemmCall.backends`), and tests describe a kind of problem with `described_call`. The public
functions build their GemmCall once per distinct metadata (with the validation verdict,
_validate.checked) and remember its packed fields (`GemmCall.codes`); later calls of that kind
run the op (`op_entry`) with them on their own tensors, building nothing.

The op takes the call's tensors, alpha_scale and two packed integers, `kind` (formats, layout,
grouping, activation, output format) and `knobs` (schedule, variant, sm_count, warps, stages, splits,
pdl): `GemmCall.op_arguments` packs them and `GemmCall.from_op_arguments` unpacks them, by the binding's
table (ops.gemm_packing, ops.gemm_names). Packing costs a dictionary lookup per call; the dispatcher
parses 13 arguments instead of one per field, a large part of a call's host cost.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch

from . import reference
from ._ops import ops

Tensor = torch.Tensor
OptTensor = torch.Tensor | None

# bf16/fp16 output formats -> their dtype (NVFP4 outputs are packed uint8 plus flat scales)
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# The `gemm` op: GEMM_OP(a, b, sfa, sfb, group_index, alpha, bias, residual, out, out_scales, kind,
# alpha_scale, knobs).
GEMM_OP = ops.gemm.default
_GEMM_BACKENDS = ops.gemm_backends.default
# The same op called through its dispatcher handle (OperatorHandle::callBoxed, as torch's own
# CustomOp calls its ops): it skips OpOverload.__call__'s scan of every argument for
# __torch_function__ overrides, 0.7 of the op call's 3.2 us on the 2-core CPU. Dispatch modes,
# autograd and the profiler see the call as before; torch.compile traces GEMM_OP.
_GEMM_BOXED = functools.partial(torch._C._dispatch_call_boxed, GEMM_OP._handle)


def op_entry() -> Callable[..., None]:
    """The `gemm` op's entry for calls of a metadata being validated now: GEMM_OP while torch.compile
    traces, its dispatcher handle otherwise. The public functions remember it with the call's `codes()`
    (_validate.checked remembers nothing while tracing) and call it, on a call with rows of A and of
    B (GemmCall.run's rule), with the op's arguments."""
    return GEMM_OP if torch.compiler.is_compiling() else _GEMM_BOXED


class GemmCall(NamedTuple):
    """The `gemm` op's arguments in schema order (torch_binding.cpp): `ops.gemm(*call)` runs it.

    out = encode(act(alpha_scale * alpha[g] * A @ B[g]^T + bias + residual)) (docs/FORMATS.md). The
    names a string field takes are csrc/gemm/problem.h's (kOperandFormatNames, kActivationNames, ...).
    """

    a: Tensor  # A [M, K]: stored values (E4M3 bytes or packed 4-bit codes), or bf16 values
    b: Tensor  # B [N, K] or [groups, N, K], stored values (b_interleaved: the streaming layout)
    sfa: OptTensor  # A's swizzled scales; None for a bf16 A
    sfb: Tensor  # B's swizzled scales, over all groups' rows
    a_format: str = "nvfp4"  # mxfp8 | mxfp4 | nvfp4 | e0m3 | bf16
    b_format: str = "nvfp4"  # mxfp8 | mxfp4 | nvfp4 | e0m3
    b_interleaved: bool = False
    grouping: str = "dense"  # dense | batched | contiguous | masked
    group_index: OptTensor = None  # int32: expert id per row (contiguous), valid rows per group (masked)
    group_rows: int = 0  # rows of A per group (batched, masked)
    alpha: OptTensor = None  # float32 on the call's device: one value, or one per group
    alpha_scale: float = 1.0
    bias: OptTensor = None  # [N] or [groups, N]
    residual: OptTensor = None  # [M, N] of the output type
    activation: str = "none"  # kActivationNames: none, gelu, relu2, geglu, ...
    out: OptTensor = None  # required: [M, N_out] of the output type, or packed E2M1 [M, N_out / 2]
    out_scales: OptTensor = None  # the swizzled scales of an NVFP4 output
    out_format: str = "bf16"  # bf16 | fp16 | nvfp4 | nvfp4_from_fp16
    schedule: str = "auto"  # auto | streamk | m256
    variant: int = -1
    sm_count: int = -1
    warps: int = 0
    stages: int = 0
    splits: int = 0
    pdl: bool = True

    def run(self) -> None:
        """Launches the op; a call without rows of A or of B computes nothing and launches nothing."""
        if self.a.numel() == 0 or self.b.numel() == 0:
            return
        GEMM_OP(*self.op_arguments())

    def run_on(self, backend: str) -> None:
        """Launches the op on the named backend (GemmCall.backends' names), which must serve the call on
        its device: tests hold each backend to the reference, also where dispatch would pick another."""
        ops.gemm_on(backend, *self.op_arguments())

    def backends(self, cc: int) -> list[str]:
        """Every backend of this build that can serve this call on compute capability cc (90, 100, ...),
        dispatch's choice first; [] when none can. Meta tensors stand for aligned buffers."""
        chosen, *others = _GEMM_BACKENDS(cc, *self.op_arguments())
        return [chosen, *others] if chosen else others

    def backend(self, cc: int) -> str:
        """The backend dispatch picks on compute capability cc ("" = the reference)."""
        return _GEMM_BACKENDS(cc, *self.op_arguments())[0]

    def op_arguments(self) -> tuple:
        """The `gemm` op's arguments: the tensors, `kind`, alpha_scale and `knobs` (the module docstring).
        ValueError for a field the op cannot take (an unknown name, an integer out of its range)."""
        kind, knobs = self.codes()
        return (
            self.a, self.b, self.sfa, self.sfb, self.group_index, self.alpha, self.bias, self.residual, self.out,
            self.out_scales, kind, self.alpha_scale, knobs,
        )  # fmt: skip

    def codes(self) -> tuple[int, int]:
        """The op's packed `kind` and `knobs` integers of this call: they depend on its fields other than
        the tensors only, so a caller may remember them for calls of the same kind (`op_entry`)."""
        kind_fields = (
            self.a_format, self.b_format, self.b_interleaved, self.grouping, self.group_rows, self.activation,
            self.out_format,
        )  # fmt: skip
        kind = _KIND_CODES.get(kind_fields)
        if kind is None:
            kind = _pack("kind", dict(zip(_KIND_NAMES, kind_fields, strict=True)))
            _remember(_KIND_CODES, kind_fields, kind)
        knob_fields = (self.schedule, self.variant, self.sm_count, self.warps, self.stages, self.splits, self.pdl)
        knobs = _KNOB_CODES.get(knob_fields)
        if knobs is None:
            knobs = _pack("knobs", dict(zip(_KNOB_NAMES, knob_fields, strict=True)))
            _remember(_KNOB_CODES, knob_fields, knobs)
        return kind, knobs

    @classmethod
    def from_op_arguments(
        cls,
        a: Tensor,
        b: Tensor,
        sfa: OptTensor,
        sfb: Tensor,
        group_index: OptTensor,
        alpha: OptTensor,
        bias: OptTensor,
        residual: OptTensor,
        out: Tensor,
        out_scales: OptTensor,
        kind: int,
        alpha_scale: float,
        knobs: int,
    ) -> GemmCall:
        """The call a `gemm` op's arguments describe (op_arguments' inverse)."""
        fields = _unpack("kind", kind) | _unpack("knobs", knobs)
        return cls(
            a, b, sfa, sfb, group_index=group_index, alpha=alpha, alpha_scale=alpha_scale, bias=bias,
            residual=residual, out=out, out_scales=out_scales, **fields,
        )  # fmt: skip


# The binding's packing table: "kind.<field>" / "knobs.<field>" -> (shift, bits, offset), and each
# named field's names by code.
_PACKING = {name: field for name, *field in zip(*ops.gemm_packing(), strict=True)}
_KIND_NAMES = ("a_format", "b_format", "b_interleaved", "grouping", "group_rows", "activation", "out_format")
_KNOB_NAMES = GemmCall._fields[GemmCall._fields.index("schedule") :]
_NAMED = ("a_format", "b_format", "grouping", "activation", "out_format", "schedule")
_CODES = {field: {name: code for code, name in enumerate(ops.gemm_names(field))} for field in _NAMED}
_NAMES = {field: {code: name for name, code in codes.items()} for field, codes in _CODES.items()}
# Packed codes of the kinds (with their group_rows) and knobs seen: few, but bounded.
_KIND_CODES: dict[tuple, int] = {}
_KNOB_CODES: dict[tuple, int] = {}
_MAX_CODES = 4096


def _remember(codes: dict[tuple, int], fields: tuple, code: int) -> None:
    if len(codes) >= _MAX_CODES:
        codes.clear()
    codes[fields] = code


def _pack(packed: str, fields: dict[str, object]) -> int:
    """fields packed into the op's `kind` or `knobs` integer (the binding's gemm_packing)."""
    code = 0
    for field, value in fields.items():
        shift, bits, offset = _PACKING[f"{packed}.{field}"]
        if field in _CODES:
            if not isinstance(value, str) or value not in _CODES[field]:
                raise ValueError(f"GemmCall.{field} must be one of {sorted(_CODES[field])}, got {value!r}")
            value = _CODES[field][value]
        elif not isinstance(value, int) or not 0 <= value + offset < 1 << bits:
            span = f"[{-offset}, {(1 << bits) - offset})"
            raise ValueError(f"GemmCall.{field} must be an integer in {span}, got {value!r}")
        code |= (value + offset) << shift
    return code


def _unpack(packed: str, code: int) -> dict[str, object]:
    """The fields of the op's `kind` or `knobs` integer, by GemmCall field name (_pack's inverse)."""
    fields: dict[str, object] = {}
    prefix = f"{packed}."
    for name, (shift, bits, offset) in _PACKING.items():
        if name.startswith(prefix):
            field = name[len(prefix) :]
            value = (code >> shift & (1 << bits) - 1) - offset
            default = GemmCall._field_defaults.get(field)
            fields[field] = _NAMES[field][value] if field in _NAMES else type(default)(value)
    return fields


def gemm_outputs(m: int, n_out: int, out_format: str, device: torch.device) -> tuple[Tensor, OptTensor]:
    """A fresh output: bf16/fp16 [m, n_out], or NVFP4 packed [m, n_out / 2] and its flat scales."""
    if out_format.startswith("nvfp4"):
        return packed_outputs(m, n_out, device)
    return torch.empty(m, n_out, dtype=OUT_DTYPES[out_format], device=device), None


def packed_outputs(rows: int, cols: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Packed NVFP4 values [rows, cols / 2] and a flat scale buffer of sfa_size_bytes(rows, cols)."""
    return (
        torch.empty(rows, cols // 2, dtype=torch.uint8, device=device),
        torch.empty(reference.sf_bytes(rows, cols // reference.NVFP4.group), dtype=torch.uint8, device=device),
    )


def _meta(*shape: int, dtype: torch.dtype = torch.uint8) -> Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _meta_values(rows: int, k: int, format_name: str) -> tuple[Tensor, OptTensor]:
    """Stored values [rows, K] of a format (bf16: plain, no scales) and their swizzled scales, on meta."""
    if format_name == "bf16":
        return _meta(rows, k, dtype=torch.bfloat16), None
    fmt = reference.FORMATS[format_name]
    dtype = torch.float8_e4m3fn if fmt.element_bits == 8 else torch.uint8
    return _meta(rows, fmt.stored_cols(k), dtype=dtype), _meta(reference.sf_bytes(rows, k // fmt.group))


def described_call(
    a_format: str = "nvfp4",
    b_format: str | None = None,
    *,
    m: int,
    n: int,
    k: int,
    grouping: str = "dense",
    groups: int = 8,
    bias: torch.dtype | None = None,
    residual: bool = False,
    alpha: bool = False,
    activation: str = "none",
    out_format: str = "bf16",
    **fields: object,
) -> GemmCall:
    """A call of this kind on meta tensors (no memory) for GemmCall.backends. Dense: A [m, k], B [n, k].
    Grouped: `groups` groups of m rows each (batched: A [groups, m, k]; contiguous: each expert's rows
    in turn), with the group fields the public functions set. `bias`: its dtype ([N], or [groups, N]
    when grouped); `residual`, `alpha`: whether they are given. Other fields as GemmCall's."""
    grouped = grouping != "dense"
    count = groups if grouped else 1
    rows = m * count
    a, sfa = _meta_values(rows, k, a_format)
    b, sfb = _meta_values(count * n, k, b_format or a_format)
    sfb = _meta(0) if sfb is None else sfb  # a bf16 B (the engine's bf16 GEMM) has no scales either
    if grouped:
        b = b.reshape(count, n, -1)
    n_out = n // 2 if activation == "geglu" else n
    if out_format.startswith("nvfp4"):
        out, out_scales = _meta(rows, n_out // 2), _meta(reference.sf_bytes(rows, n_out // reference.NVFP4.group))
    else:
        out, out_scales = _meta(rows, n_out, dtype=OUT_DTYPES[out_format]), None
    residual_values = _meta(rows, n, dtype=out.dtype) if residual else None
    if grouping == "batched":  # batch_gemm's [B, M, ...] operands and output
        a, out = a.reshape(count, m, -1), out.reshape(count, m, -1)
    group_index = {"contiguous": rows, "masked": count}.get(grouping)
    return GemmCall(
        a, b, sfa, sfb, a_format, b_format or a_format,
        grouping=grouping,
        group_index=None if group_index is None else _meta(group_index, dtype=torch.int32),
        group_rows=m if grouping in ("batched", "masked") else 0,
        alpha=_meta(count, dtype=torch.float32) if alpha else None,
        bias=None if bias is None else _meta(*((count, n) if grouped else (n,)), dtype=bias),
        residual=residual_values,
        activation=activation, out=out, out_scales=out_scales, out_format=out_format, **fields,
    )  # fmt: skip
