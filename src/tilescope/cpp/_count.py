"""Instruction counts of a kernel run: what the device model's GpSimd compute estimate is made of.

The counting build of a library (:func:`tilescope.cpp._build.build_counting`) has a probe
call at the start of every basic block of the user's code; running a kernel there counts
how often each block executes (the runtime keys each block by its probe's return address).
This module reads the instructions of each block from the library's disassembly
(``objdump``), so a core's work is::

    instructions = sum over blocks of executions x instructions in the block
    cycles       = instructions x cycles_per_instruction
                   + memory operands x (tcm_access_cycles - 1)

A block runs from its probe's return address to the next probe, or to the first
unconditional jump or return (code after those belongs to another block); instructions of
a function before its first probe (the prologue) count with its entry block; padding
``nop``\\s are not work. The probe is a call, and a call clobbers every vector register, so
the counting build spills values to the stack around each probe that the real build keeps
in registers: moves between a register and the stack are not counted, and a stack operand
of an arithmetic instruction does not wait for the TCM. The counts depend only on the path
the kernel takes through its code, so the same operator on the same inputs gets the same
estimate on every run.

>>> costs = parse_disassembly(_EXAMPLE)
>>> sorted((hex(k), v) for k, v in costs.items())
[('0x16', (10, 0)), ('0x35', (9, 3)), ('0x68', (5, 0))]
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import numpy as np

from ._errors import CppError

__all__ = ["block_costs", "parse_disassembly", "count_work"]

PROBE = "__sanitizer_cov_trace_pc"
_FUNC = re.compile(r"^[0-9a-f]+ <(.+)>:$")
_INSN = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")
_ENDS_BLOCK = ("jmp", "ret", "ud2")
_NO_MEMORY = ("lea", "nop")
_STACK = re.compile(r"\(%rsp[),]")  # the stack pointer (%rbp is a general register at -O2)

_EXAMPLE = """
0000000000000000 <_Z4workPKfPfi>:
   0:	push   %r12
   2:	movslq %edx,%r12
   5:	push   %rbp
   6:	mov    %rsi,%rbp
   9:	push   %rbx
   a:	mov    %rdi,%rbx
   d:	sub    $0x10,%rsp
  11:	call   a0 <__sanitizer_cov_trace_pc>
  16:	test   %r12d,%r12d
  19:	jle    80 <_Z4workPKfPfi+0x80>
  1b:	movl   $0x0,0xc(%rsp)
  23:	lea    (%rbx,%r12,4),%r12
  27:	nopw   0x0(%rax,%rax,1)
  30:	call   a0 <__sanitizer_cov_trace_pc>
  35:	movss  (%rbx),%xmm0
  39:	add    $0x4,%rbx
  3d:	add    $0x4,%rbp
  41:	addss  %xmm0,%xmm0
  45:	addss  0x0(%rip),%xmm0
  4d:	movss  %xmm0,-0x4(%rbp)
  52:	addss  0xc(%rsp),%xmm0
  58:	movss  %xmm0,0xc(%rsp)
  5e:	cmp    %r12,%rbx
  61:	jne    30 <_Z4workPKfPfi+0x30>
  63:	call   a0 <__sanitizer_cov_trace_pc>
  68:	movss  0xc(%rsp),%xmm0
  6e:	add    $0x10,%rsp
  72:	pop    %rbx
  73:	pop    %rbp
  74:	pop    %r12
  76:	ret
  77:	nopw   0x0(%rax,%rax,1)
  80:	movl   $0x0,0xc(%rsp)
  88:	jmp    63 <_Z4workPKfPfi+0x63>
"""


def parse_disassembly(text: str) -> dict[int, tuple[int, int]]:
    """``{probe return offset: (instructions, memory operands)}`` from ``objdump -d`` text."""
    costs: dict[int, tuple[int, int]] = {}
    prologue = (0, 0)
    current: int | None = None
    starts_block = probed = False
    for line in text.splitlines():
        if _FUNC.match(line.strip()):
            prologue, current, starts_block, probed = (0, 0), None, False, False
            continue
        m = _INSN.match(line)
        if m is None:
            continue
        addr, op, args = int(m.group(1), 16), m.group(2), m.group(3)
        if op.startswith("call") and f"<{PROBE}" in args:
            current, starts_block = None, True
            continue
        if starts_block:  # the first instruction after a probe starts its block
            current, starts_block = addr, False
            costs[current] = (0, 0) if probed else prologue
            probed = True
        if op.startswith("nop") or (op == "xchg" and args.strip() == "%ax,%ax"):
            continue  # alignment padding
        stack = _STACK.search(args) is not None
        if stack and op.startswith("mov") and args.count(",") == 1:
            continue  # a spill or reload (see the module doc)
        is_mem = int("(" in args and not stack and not op.startswith(_NO_MEMORY))
        if current is not None:
            n, mem = costs[current]
            costs[current] = (n + 1, mem + is_mem)
            if op.startswith(_ENDS_BLOCK):
                current = None
        elif not probed:
            prologue = (prologue[0] + 1, prologue[1] + is_mem)
    return costs


@lru_cache(maxsize=32)
def _costs_cached(path: str, mtime_ns: int) -> dict[int, tuple[int, int]]:
    tool = shutil.which("objdump")
    if tool is None:
        raise CppError("objdump (GNU binutils) is needed to count a C++ kernel's instructions for its modeled "
                       "time: install binutils (it comes with g++)")
    proc = subprocess.run([tool, "-d", "--no-show-raw-insn", "-w", path], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CppError(f"objdump could not read {path}: {proc.stderr.strip()[:500]}")
    return parse_disassembly(proc.stdout)


def block_costs(library: str | Path) -> dict[int, tuple[int, int]]:
    """Instructions and memory operands of every counted block of a counting library."""
    p = Path(library)
    return _costs_cached(str(p), p.stat().st_mtime_ns)


def count_work(counts: np.ndarray, costs: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """``(instructions, memory operands)`` executed, from one core run's block counts
    (``COUNT_DTYPE`` records) and the library's :func:`block_costs`."""
    instructions = memory = 0
    for offset, n in zip(counts["offset"].tolist(), counts["count"].tolist()):
        i, m = costs.get(offset, (1, 0))
        instructions += n * i
        memory += n * m
    return instructions, memory
