"""Which source lines assign a *fresh* value into a tile.

``t[...] = tl.load(x[...])`` should be one DMA straight into ``t``, not a DMA into
a temporary tile and a copy. That is only safe when nothing else can see the
temporary: when the right-hand side is an expression that makes a new value
(a call, an operator) rather than a name that the kernel may read again. This
is a property of the source, so it is read from the source (once per file): a
line qualifies when every assignment on it is ``target[...] = <call or
operator>`` or ``target (op)= <call or operator>``, and the value's producing
instruction must come from that same statement (so ``t[...] = f(u)``
returning an existing tile ``u`` copies). Where the source cannot be read,
nothing qualifies and assignments copy (same values, more instructions).

>>> import textwrap
>>> src = textwrap.dedent('''
...     t[...] = tl.exp(x)
...     t[...] = y
...     acc += tl.matmul(a, b)
... ''')
>>> fresh_lines_of_source(src)
{2: (2, 2), 4: (4, 4)}
"""

from __future__ import annotations

import ast
import linecache

__all__ = ["fresh_lines", "fresh_lines_of_source"]

_FRESH_VALUES = (ast.Call, ast.BinOp, ast.UnaryOp, ast.Compare)
_cache: dict[tuple, dict[int, tuple[int, int]]] = {}


def fresh_lines_of_source(source: str) -> dict[int, tuple[int, int]]:
    """Line -> (first, last) line of the qualifying statement that covers it."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    good: dict[int, tuple[int, int]] = {}
    bad: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            ok = isinstance(node.value, _FRESH_VALUES) and all(isinstance(t, ast.Subscript) for t in node.targets)
        elif isinstance(node, ast.AugAssign):
            ok = isinstance(node.value, _FRESH_VALUES)
        else:
            continue
        span = (node.lineno, node.end_lineno or node.lineno)
        for line in range(span[0], span[1] + 1):
            if ok:
                good[line] = span
            else:
                bad.add(line)
    return {line: span for line, span in good.items() if line not in bad}


def fresh_lines(filename: str) -> dict[int, tuple[int, int]]:
    """Lines of ``filename`` whose assignments store fresh values, with their statement's
    line span (cached per file version)."""
    lines = linecache.getlines(filename)
    key = (filename, len(lines), hash(tuple(lines[:1])) if lines else 0)
    hit = _cache.get(key)
    if hit is None:
        hit = _cache[key] = fresh_lines_of_source("".join(lines)) if lines else {}
    return hit
