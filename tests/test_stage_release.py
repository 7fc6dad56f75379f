"""A consumer frees a shared-memory stage only after its loads from it are complete.

The Hopper engine and the skinny tier stream operands through rings of stages that TMA writes (the
async proxy) and the consumers read with shared loads (the generic proxy). A consumer's mbarrier
arrive on the stage's "empty" barrier lets the producer issue the next TMA write into it. ptxas
schedules the last shared loads of a stage just before that arrive and their first uses after it,
and the arrive's release does not hold back the next TMA write for a load still in flight: the
engine's bf16-activation path then read rows of the next K tile (benchmarks/NOTES.md, "Open defect"
and its resolution). So every shared load issued before a consumer arrive is either consumed before
it or separated from it by a memory barrier (fence.proxy.async: MEMBAR + FENCE.VIEW.ASYNC).

Read from the sm_90a SASS of the built library; the kernels whose stage release follows the
retirement of the wgmmas that read the stage (a bf16 B from TMA, BSource::Bf16) have no such loads
and are left out."""

from __future__ import annotations

import re

import pytest
from conftest import variant_metadata
from machine_code import all_kernels

pytestmark = pytest.mark.machine_code

CONSUMER_ARRIVE = "SYNCS.ARRIVE.TRANS64.A1T0"  # the plain arrive (the producer's carries a byte count)
SHARED_LOAD = re.compile(r"\bLDS(?:\.\w+)*\s+R(\d+)")
REGISTER = re.compile(r"\bR(\d+)\b")
WINDOW = 96  # instructions looked at on each side of an arrive


def instructions(sass: str) -> list[str]:
    """The instruction text of each SASS line (predicate, opcode and operands, no address or encoding)."""
    found = []
    for line in sass.splitlines():
        match = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?);", line)
        if match:
            found.append(match.group(1).strip())
    return found


def loaded_registers(instruction: str) -> set[int]:
    match = SHARED_LOAD.search(instruction)
    if not match:
        return set()
    width = 4 if ".128" in instruction else 2 if ".64" in instruction else 1
    return {int(match.group(1)) + i for i in range(width)}


def unfenced_loads_used_after(code: list[str], arrive: int) -> set[int]:
    """Registers loaded from shared memory after the last memory barrier before `arrive` and read
    after it before being written again."""
    pending: set[int] = set()
    for instruction in code[max(0, arrive - WINDOW) : arrive]:
        if instruction.startswith("MEMBAR") or CONSUMER_ARRIVE in instruction:
            pending = set()
        pending |= loaded_registers(instruction)
    used = set()
    for instruction in code[arrive + 1 : arrive + 1 + WINDOW]:
        if not pending or instruction.startswith(("BRA", "EXIT", "RET")):
            break
        predicated = instruction.startswith("@")
        opcode, _, operands = instruction.split(" ", 1)[1 if predicated else 0].partition(" ")
        registers = [int(r) for r in REGISTER.findall(operands)]
        # A destination register comes first; stores and predicated writes only read theirs.
        writes = bool(registers) and not predicated and not opcode.startswith(("ST", "SYNCS", "BAR"))
        written = loaded_registers(instruction) or set(registers[:1]) if writes else set()
        used |= pending & set(registers[1:] if writes else registers)
        pending -= written
    return used


def consumer_kernels() -> dict[str, list[str]]:
    if "9.0a" not in variant_metadata()["backend"]["archs"]:
        pytest.skip("this build has no sm_90a code (built with --archs)")
    return {
        name: instructions(body)
        for name, body in all_kernels(90).items()
        if ("engine_kernel" in name and "BSourceE0" in name) or "skinny_gemm_kernel" in name
    }


def test_the_engine_and_the_skinny_kernels_are_read():
    names = consumer_kernels()
    assert sum("engine_kernel" in n for n in names) >= 10 and sum("skinny" in n for n in names) >= 10


def test_consumers_complete_their_shared_loads_before_freeing_a_stage():
    late = {}
    for name, code in consumer_kernels().items():
        for at, instruction in enumerate(code):
            if CONSUMER_ARRIVE in instruction:
                used = unfenced_loads_used_after(code, at)
                if used:
                    late.setdefault(name[:160], []).append(sorted(used))
    assert late == {}
