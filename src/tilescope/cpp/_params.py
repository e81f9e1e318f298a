"""The C++ parameter names of an operator, for its torch schema and its messages.

The library knows each operator's ``m.def`` line, not the names of its functions'
parameters; they are read from the sources: the ``m.def("op", &shape, &kernel)`` call names
the kernel, whose definition gives them (the shape function's when the kernel's is not
found). Any doubt -- a parameter without a name, a count that differs from the operator's --
keeps the positional names ``a0, a1, ...``.

>>> src = '''Tensor k(const Tensor& boxes1, const Tensor& boxes2, double eps) { return boxes1; }
... TILESCOPE_LIBRARY(my, m) { m.def("op", &k_shape, &k); }'''
>>> names_from_text("op", "ttf", src, [src])
['boxes1', 'boxes2', 'eps']
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

__all__ = ["parameter_names", "names_from_text"]

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_TYPE_WORDS = {"const", "volatile", "Tensor", "double", "int64_t", "bool", "tilescope", "std", "struct"}


def _def_call(text: str, op: str) -> tuple[str, str] | None:
    m = re.search(r"\.\s*def\s*\(\s*\"" + re.escape(op) + r"\"\s*,\s*&?\s*([\w:]+)\s*,\s*&?\s*([\w:]+)", text)
    return (m.group(1), m.group(2)) if m else None


def _definition_params(texts: list[str], func: str) -> list[str | None] | None:
    """Parameter names of the definition of ``func`` (None where a parameter has no name)."""
    short = func.split("::")[-1]
    pattern = re.compile(r"\b" + re.escape(short) + r"\s*\(([^()]*)\)\s*(?:noexcept\s*)?\{")
    for text in texts:
        m = pattern.search(text)
        if m is None:
            continue
        body = m.group(1).strip()
        if body in ("", "void"):
            return []
        names = []
        for param in body.split(","):
            param = param.split("=", 1)[0].strip()
            words = re.findall(r"[A-Za-z_]\w*", param)
            last = words[-1] if words else None
            names.append(last if last and len(words) > 1 and last not in _TYPE_WORDS else None)
        return names
    return None


def names_from_text(op: str, kinds: str, def_text: str, sources: list[str]) -> list[str]:
    """Names for ``op``'s ``len(kinds)`` arguments from its ``m.def`` text and the sources."""
    fallback = [f"a{k}" for k in range(len(kinds))]
    call = _def_call(_COMMENTS.sub(" ", def_text), op)
    if call is None:
        return fallback
    texts = [_COMMENTS.sub(" ", t) for t in sources]
    for func in (call[1], call[0]):  # the kernel's, else the shape function's
        names = _definition_params(texts, func)
        if names is None or len(names) != len(kinds) or any(n is None for n in names):
            continue
        out = [n + "_" if keyword.iskeyword(n) or n == "self" else n for n in names]
        if len(set(out)) == len(out):
            return out
    return fallback


def parameter_names(op, sources: list[str | Path]) -> list[str]:
    """Names for the arguments of ``op`` (a :class:`~._abi.NativeOp`), read from ``sources``."""
    texts = []
    for path in dict.fromkeys([op.file, *map(str, sources)]):
        try:
            texts.append(Path(path).read_text(errors="replace"))
        except OSError:
            continue
    def_text = texts[0] if texts and Path(op.file).exists() else "\n".join(texts)
    return names_from_text(op.name, op.kinds, def_text, texts)
