"""Loops traced once and replicated (tilescope.lang._loops) give the same Program as loops
traced iteration by iteration (TILESCOPE_TRACE_REPLICATE=0, the reference path): the same
instructions, operands, provenance, buffers and addresses, on the examples, the NKI test
kernels and kernels written to stress what replication must notice."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tilescope
import tilescope.isa as nisa
import tilescope.lang as tl
from tilescope.lang import TensorSpec as S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def canonical(p):
    """The Program with buffers named by first use (replica names differ from unrolled ones)."""
    ids: dict[str, int] = {}

    def cid(name):
        return ids.setdefault(name, len(ids))

    out = []
    for i, ins in enumerate(p.instructions):
        d = ins.to_json()
        for k, v in list(d.items()):
            if isinstance(v, dict) and "ap" in v:
                b, dt, off, dims = v["ap"]
                d[k] = (cid(b), dt, off, tuple(map(tuple, dims)))
            elif isinstance(v, dict) and "tuple" in v:
                d[k] = repr([(cid(x["ap"][0]),) + tuple(map(str, x["ap"][1:])) if isinstance(x, dict) and "ap" in x
                             else x for x in v["tuple"]])
        out.append((tuple(sorted(d.items(), key=str)), p.prov_of(i)))
    bufs = {}
    for name, k in ids.items():
        b = p.buffers[name]
        slot = p.slots[p.placement[name]] if name in p.placement else None
        bufs[k] = (b.memory, b.shape, b.dtype, b.role, b.site, slot.addr if slot else None)
    return out, bufs, sorted(p.outputs) == sorted(p.outputs)


def both(kernel, *args, monkeypatch, **kwargs):
    """(replicated, unrolled) Programs of one signature."""
    out = []
    for mode in ("1", "0"):
        monkeypatch.setenv("TILESCOPE_TRACE_REPLICATE", mode)
        kernel.cache_clear()
        out.append(kernel.program_for(*args, **kwargs).program)
    kernel.cache_clear()
    return out


def assert_same(kernel, *args, monkeypatch, replicated=True, **kwargs):
    rep, ref = both(kernel, *args, monkeypatch=monkeypatch, **kwargs)
    a, b = canonical(rep), canonical(ref)
    assert len(a[0]) == len(b[0])
    for i, (x, y) in enumerate(zip(a[0], b[0])):
        assert x == y, f"instruction {i}: {x} != {y}"
    assert a[1] == b[1]
    return rep


def _example(name):
    sys.path.insert(0, os.path.join(ROOT, "examples", name.split("/")[0]))
    try:
        import importlib

        return importlib.import_module(name.split("/")[1])
    finally:
        sys.path.pop(0)


def test_matmul_examples(monkeypatch):
    mk = _example("matmul/matmul_kernels")
    assert_same(mk.matmul_naive, *mk.inputs(1024, 1024, 2048, data=False), monkeypatch=monkeypatch)
    assert_same(mk.matmul_optimized, *mk.inputs(2048, 4096, 2048, data=False), monkeypatch=monkeypatch)


def test_norm_and_softmax_examples(monkeypatch):
    ln = _example("layernorm/layernorm_kernel")
    for k in (ln.layernorm_two_pass, ln.layernorm_bn_stats):
        assert_same(k, S((1000, 1000), "float32"), S((1000,), "float32"), S((1000,), "float32"),
                    monkeypatch=monkeypatch)
    sm = _example("softmax/softmax_kernel")
    kernels = [getattr(sm, n) for n in dir(sm) if isinstance(getattr(sm, n), tl.Kernel)]
    assert kernels
    for k in kernels:
        assert_same(k, S((1000, 700), "float32"), monkeypatch=monkeypatch)


@pytest.mark.parametrize("name", ["matmul", "flash_attention", "selective_scan", "rmsnorm", "layernorm"])
def test_nki_test_kernels(name, monkeypatch):
    from tilescope.nki import nki_imports

    sys.path.insert(0, os.path.join(ROOT, "tests", "nki_kernels"))
    try:
        with nki_imports():
            import importlib

            mod = importlib.import_module(name)
    finally:
        sys.path.pop(0)
    cases = {
        "matmul": lambda m: [(m.matmul_tiled, (S((512, 512), "bfloat16"), S((512, 2048), "bfloat16")), {}),
                             (m.matmul_blocked, (S((512, 512), "bfloat16"), S((512, 2048), "bfloat16")), {})],
        "flash_attention": lambda m: [(m.flash_attention, (S((64, 1024), "float32"), S((64, 1024), "float32"),
                                                           S((1024, 64), "float32")), {"causal": c})
                                      for c in (True, False)],
        "selective_scan": lambda m: [(m.selective_scan, (S((256, 96), "float32"), S((256, 96), "float32"),
                                                         S((256, 6), "float32"), S((6, 96), "float32"),
                                                         S((6, 96), "float32")), {})],
        "rmsnorm": lambda m: [(m.rmsnorm, (S((1024, 384), "float32"), S((384,), "float32")), {})],
        "layernorm": lambda m: [(m.layernorm, (S((1024, 1024), "float32"), S((1024,), "float32"),
                                               S((1024,), "float32")), {})],
    }[name](mod)
    for kernel, args, kwargs in cases:
        assert_same(kernel.kernel, *args, monkeypatch=monkeypatch, **kwargs)


# ---- kernels that test what replication must notice ------------------------------------------

@tilescope.kernel
def ragged(x, out):
    """A masked last tile: its guard changes on the last iteration."""
    n, d = x.shape
    i_p, i_f = tl.mgrid[0:128, 0:d]
    for t in tl.affine_range((n + 127) // 128):
        r = t * 128 + i_p
        v = tl.load(x[r, i_f], mask=(r < n))
        tl.store(out[r, i_f], tl.exp(v), mask=(r < n))


@tilescope.kernel
def special_cases(x, out):
    """Python branches on the index: first and last iterations differ."""
    n = x.shape[0] // 128
    acc = tl.zeros((128, x.shape[1]), tl.float32)
    for i in tl.sequential_range(n):
        t = tl.load(x[i * 128:(i + 1) * 128, :])
        if i == 0:
            acc[...] = tl.copy(t)
        elif i == n - 1:
            acc[...] = tl.maximum(acc, t)
        else:
            acc[...] = tl.add(acc, t)
    tl.store(out, acc)


@tilescope.kernel
def carried(x, out):
    """Each iteration reads the tile the previous one made (a rebound local)."""
    run = tl.zeros((128, x.shape[1]), tl.float32)
    for i in tl.sequential_range(x.shape[0] // 128):
        run = tl.add(run, tl.load(x[i * 128:(i + 1) * 128, :]))
    tl.store(out, run)


@tilescope.kernel
def index_after_loop(x, out):
    """The loop index and a body tile are used after the loop (their last iteration's)."""
    for i in tl.affine_range(x.shape[0] // 128):
        t = tl.load(x[i * 128:(i + 1) * 128, :])
        u = t * 2.0
        tl.store(out[i * 128:(i + 1) * 128, :], u)
    tl.store(out[i * 128:(i + 1) * 128, 0:1], tl.copy(u[:, 1:2]))


@tilescope.kernel
def python_state(x, out):
    """A counter and a list kept by the body: not a shift of the first iterations."""
    j = 0
    tiles = []
    for i in tl.affine_range(x.shape[0] // 128):
        tiles.append(tl.load(x[j * 128:(j + 1) * 128, :]))
        j += 1
    total = tiles[0]
    for t in tiles[1:]:
        total = total + t
    tl.store(out, total)


@tilescope.kernel
def nonaffine(x, out):
    """Index arithmetic that is not affine (i % 2, a list indexed by i): traced one by one."""
    scale = [1.0, -1.0]
    for i in tl.affine_range(x.shape[0] // 128):
        t = tl.load(x[i * 128:(i + 1) * 128, :])
        tl.store(out[i * 128:(i + 1) * 128, :], t * scale[i % 2])


@tilescope.kernel
def breaks(x, out):
    for i in tl.affine_range(x.shape[0] // 128):
        if i == 5:
            break
        tl.store(out[i * 128:(i + 1) * 128, :], tl.load(x[i * 128:(i + 1) * 128, :]))


@tilescope.kernel
def nested_blocks(x, out):
    """Nested loops over blocks of an SBUF tile, an inner loop whose range depends on the outer."""
    n, d = x.shape
    for b in tl.affine_range(n // 512):
        blk = tl.ndarray((4, tl.par_dim(128), d), tl.float32)
        for k in tl.affine_range(4):
            blk[k] = tl.load(x[b * 512 + k * 128:b * 512 + (k + 1) * 128, :])
        for k in tl.affine_range(4):
            tl.store(out[b * 512 + k * 128:b * 512 + (k + 1) * 128, :], blk[k] * float(2))
    for b in tl.affine_range(4):
        for k in tl.affine_range(b + 1):  # a range that depends on the outer index
            tl.store(out[k * 128:(k + 1) * 128, 0:8], tl.load(x[k * 128:(k + 1) * 128, 0:8]))


@tilescope.kernel
def first_fill(x, out):
    """Zeros made before the loops, first read in the first iteration (their memset is
    emitted there, once): the loops still replicate from iteration 2."""
    acc = tl.zeros((128, x.shape[1]), tl.float32)
    for a in tl.sequential_range(x.shape[0] // 512):
        for k in tl.sequential_range(4):
            acc[...] = tl.add(acc, tl.load(x[a * 512 + k * 128:a * 512 + (k + 1) * 128, :]))
    tl.store(out, acc)


@tilescope.kernel
def fill_read_once(x, out):
    """Zeros read only by the first iteration (``if i == 0``): its memset and its guard
    make iteration 0 unlike the others."""
    z = tl.zeros((128, x.shape[1]), tl.float32)
    for i in tl.affine_range(x.shape[0] // 128):
        t = tl.load(x[i * 128:(i + 1) * 128, :])
        if i == 0:
            t = tl.add(t, z)
        tl.store(out[i * 128:(i + 1) * 128, :], t)


@tilescope.kernel
def psum_bank_edge(a, b, out):
    """Matmuls written into slices of a 4-bank PSUM tile: the last slice crosses a bank, so
    its matmul goes to a tile of its own and is copied (a replica is not written where the
    traced iteration would not write)."""
    ps = tl.ndarray((128, 2048), tl.float32, buffer=tl.psum)
    at, bt = tl.load(a), tl.load(b)
    for i in tl.affine_range(4):
        ps[:, i * 320:i * 320 + 128] = nisa.nc_matmul(at, bt)
    tl.store(out, tl.copy(ps[:, 960:1088]))


@tilescope.kernel
def blocks_by_index(x, out):
    """Block views at loop indices (their views cached by structure, offsets summed from
    the index): ``k - 2`` counts from the end for k < 2, so its sign guard flips mid-loop."""
    n, d = x.shape
    i_p, i_f = tl.mgrid[0:128, 0:d]
    blk = tl.ndarray((n // 128, tl.par_dim(128), d), tl.float32)
    for k in tl.affine_range(n // 128):
        blk[k, i_p, i_f] = tl.load(x[k * 128 + i_p, i_f])
    for k in tl.affine_range(n // 128):
        tl.store(out[k * 128 + i_p, i_f], value=blk[k - 2, i_p, 2 * 0 + i_f])


KERNELS = [
    (ragged, (S((1000, 64), "float32"), S((1000, 64), "float32"))),
    (special_cases, (S((1280, 64), "float32"), S((128, 64), "float32"))),
    (carried, (S((1280, 64), "float32"), S((128, 64), "float32"))),
    (index_after_loop, (S((1280, 64), "float32"), S((1280, 64), "float32"))),
    (python_state, (S((1280, 64), "float32"), S((128, 64), "float32"))),
    (nonaffine, (S((1280, 64), "float32"), S((1280, 64), "float32"))),
    (breaks, (S((1280, 64), "float32"), S((1280, 64), "float32"))),
    (nested_blocks, (S((4096, 64), "float32"), S((4096, 64), "float32"))),
    (first_fill, (S((4096, 64), "float32"), S((128, 64), "float32"))),
    (fill_read_once, (S((1280, 64), "float32"), S((1280, 64), "float32"))),
    (psum_bank_edge, (S((128, 128), "float32"), S((128, 128), "float32"), S((128, 128), "float32"))),
    (blocks_by_index, (S((768, 64), "float32"), S((768, 64), "float32"))),
]


def test_block_views_at_loop_indices_match_numpy():
    x = np.random.default_rng(3).standard_normal((768, 64)).astype(np.float32)
    out = np.zeros_like(x)
    blocks_by_index.cache_clear()
    tilescope.simulate(blocks_by_index, x, out)
    blocks_by_index.cache_clear()
    np.testing.assert_array_equal(out, np.roll(x.reshape(6, 128, 64), 2, axis=0).reshape(768, 64))


@tilescope.kernel
def masked_block_views(x, out):
    """Views made from new index variables in every iteration (a fresh tl.arange), one of
    them broadcast onto another result axis than its own, and a mask on it."""
    n, d = x.shape
    i_p0, i_f0 = tl.mgrid[0:128, 0:d]
    blk = tl.ndarray((n // 128, tl.par_dim(128), d), tl.float32)
    for k in tl.affine_range(n // 128):
        blk[k, i_p0, i_f0] = tl.load(x[k * 128 + i_p0, i_f0])
    for k in tl.affine_range(n // 128):
        i_p = tl.arange(128)[:, None]
        j = tl.arange(d)  # (its own axis 0; axis 1 of the view)
        tl.store(out[k * 128 + i_p, j[None, :]], value=blk[k, i_p, j], mask=(j < 10))


def test_views_of_new_index_variables_match_numpy():
    x = np.random.default_rng(5).standard_normal((512, 64)).astype(np.float32)
    out = np.zeros_like(x)
    masked_block_views.cache_clear()
    tilescope.simulate(masked_block_views, x, out)
    masked_block_views.cache_clear()
    np.testing.assert_array_equal(out[:, :10], x[:, :10])
    assert not out[:, 10:].any()


_VIEWS: list = []


@tilescope.kernel
def views_of_fresh_variables(x, out):
    from tilescope.lang._semantic import _tile_index

    blk = tl.ndarray((4, tl.par_dim(128), 64), tl.float32)
    for k in (1, 1, 1):  # the second and third views are cache hits, each with new variables
        i_p = tl.arange(128)[:, None]
        j = tl.arange(64)
        for index in ((k, i_p, j), (k, i_p, j[None, :]), (k, i_p, 5 + j)):
            v, ref = blk[index], _tile_index(blk, index)
            _VIEWS.append(((v.offset, v.dims, v.checks, v.axis_vars), (ref.offset, ref.dims, ref.checks, ref.axis_vars)))
    blk[0, :, :] = tl.load(x)
    tl.store(out, blk[0])


def test_cached_views_are_those_of_the_full_index():
    """Views cached by the index's structure map each index variable to the call's own
    (every tl.arange makes new ones): the same offset, dims, checks and axes as uncached."""
    _VIEWS.clear()
    views_of_fresh_variables.cache_clear()
    views_of_fresh_variables.program_for(S((128, 64), "float32"), S((128, 64), "float32"))
    views_of_fresh_variables.cache_clear()
    assert len(_VIEWS) == 9
    for got, ref in _VIEWS:
        assert got == ref


@tilescope.kernel
def block_past_the_end(x, out):
    i_p, i_f = tl.mgrid[0:128, 0:64]
    blk = tl.ndarray((6, tl.par_dim(128), 64), tl.float32)
    for k in tl.affine_range(8):
        blk[k, i_p, i_f] = tl.load(x[i_p, i_f])
    tl.store(out[i_p, i_f], value=blk[0, i_p, i_f])


def test_a_block_index_past_the_end_is_refused_at_that_iteration(monkeypatch):
    from tilescope.errors import IndexRangeError

    for mode in ("1", "0"):
        monkeypatch.setenv("TILESCOPE_TRACE_REPLICATE", mode)
        block_past_the_end.cache_clear()
        with pytest.raises(IndexRangeError, match="index 6 is out of range for dimension size 6"):
            block_past_the_end.program_for(S((128, 64), "float32"), S((128, 64), "float32"))
    block_past_the_end.cache_clear()


@pytest.mark.parametrize("kernel, args", KERNELS, ids=[k.name for k, _ in KERNELS])
def test_replicated_equals_unrolled(kernel, args, monkeypatch):
    assert_same(kernel, *args, monkeypatch=monkeypatch)


@pytest.mark.parametrize("kernel, args", KERNELS, ids=[k.name for k, _ in KERNELS])
def test_replicated_values_match_numpy(kernel, args, monkeypatch):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(a.shape).astype(np.float32) for a in args]
    results = []
    for mode in ("1", "0"):
        monkeypatch.setenv("TILESCOPE_TRACE_REPLICATE", mode)
        kernel.cache_clear()
        outs = [a.copy() for a in arrays]
        tilescope.simulate(kernel, *outs)
        results.append(outs[-1])
    kernel.cache_clear()
    np.testing.assert_array_equal(results[0], results[1])


def test_a_replicated_program_read_back_has_its_hash(monkeypatch):
    """Replicas' buffers are named from their records (not spelt out); read back from the
    executable every name is spelt out: the hash (its names part too) is the same."""
    from tilescope.program import Program

    monkeypatch.setenv("TILESCOPE_TRACE_REPLICATE", "1")
    nested_blocks.cache_clear()
    p = nested_blocks.program_for(S((4096, 64), "float32"), S((4096, 64), "float32")).program
    nested_blocks.cache_clear()
    assert any(n is None for n in p.columns.names)
    back = Program.from_json(p.dumps())
    assert all(n is not None for n in back.columns.names)
    assert back.columns.names_digest() == p.columns.names_digest()
    assert back.hash == p.hash


def test_most_iterations_are_replicated_and_the_program_says_which(monkeypatch):
    mk = _example("matmul/matmul_kernels")
    monkeypatch.setenv("TILESCOPE_TRACE_REPLICATE", "1")
    mk.matmul_naive.cache_clear()
    p = mk.matmul_naive.program_for(*mk.inputs(1024, 1024, 2048, data=False)).program
    loops = p.meta["traced_loops"]
    assert loops and sum(lp["replicated"] for lp in loops) > 0
    assert all(lp["why_not"] is None for lp in loops), loops
    mk.matmul_naive.cache_clear()


def test_two_samples_suffice_when_the_first_iteration_is_like_the_others(monkeypatch):
    """Iterations 0 and 1 are traced, the rest written: also when iteration 0 emitted the
    memset of zeros made before the loop; iteration 2 is traced too only when iteration 0
    differs in what it does (a guard, an accumulation it starts)."""
    monkeypatch.setenv("TILESCOPE_TRACE_REPLICATE", "1")
    stats = {}
    for kernel, args in ((first_fill, (S((4096, 64), "float32"), S((128, 64), "float32"))),
                         (fill_read_once, (S((1280, 64), "float32"), S((1280, 64), "float32")))):
        kernel.cache_clear()
        for lp in kernel.program_for(*args).program.meta["traced_loops"]:
            stats[(kernel.name, lp["line"])] = (lp["iterations"], lp["replicated"])
        kernel.cache_clear()
    line = first_fill.fn.__code__.co_firstlineno  # (the decorator's line)
    assert stats[("first_fill", line + 5)] == (8, 6)  # a: 8 iterations, 2 traced
    assert stats[("first_fill", line + 6)] == (8, 4)  # k: 4 iterations in each of the 2 traced a's
    assert stats[("fill_read_once", fill_read_once.fn.__code__.co_firstlineno + 5)] == (10, 7)


def test_a_replica_that_would_break_a_limit_is_traced_instead(monkeypatch):
    monkeypatch.setenv("TILESCOPE_TRACE_REPLICATE", "1")
    psum_bank_edge.cache_clear()
    args = (S((128, 128), "float32"), S((128, 128), "float32"), S((128, 128), "float32"))
    p = psum_bank_edge.program_for(*args).program
    (loop,) = p.meta["traced_loops"]
    assert (loop["iterations"], loop["replicated"]) == (4, 1)  # iteration 2 written, 3 traced
    kinds = [type(i).__name__ for i in p.instructions]
    assert kinds.count("Matmul") == 4 and "TensorCopy" in kinds[kinds.index("Matmul") + 4:]
    psum_bank_edge.cache_clear()


def test_replica_limits_are_those_of_the_full_check():
    """The builder's array check of replicas (bounds, start partitions, PSUM banks) finds the
    first replica the full per-instruction check rejects, on random shifts of real rows."""
    from tilescope.errors import ProgramError
    from tilescope.program import TileBuilder
    from tilescope.program._checks import check_instruction
    from tilescope.program._instruction_columns import operands_of

    b = TileBuilder("limits")
    x = b.input("x", (1024, 512), "float32")
    s = b.sbuf((128, 2048), "float32", site="s")
    p = b.psum((128, 2048), "float32", site="p")
    w = b.sbuf((128, 128), "float32", site="w")
    b.dma_copy(s[0:32, 0:512], x[0:32, 0:512])
    b.tensor_scalar(s[0:32, 0:256], s[0:32, 256:512], "add", 1.0)
    b.matmul(p[:, 0:128], w, s[:, 0:128])
    tm, _, buf, off = (np.array(a) for a in b.rows(0, b.instruction_count))
    rng = np.random.default_rng(1)
    row_el = np.array([max(1, b.buffer(b.buffer_name(int(i))).row_elems) if i >= 0 else 1 for i in buf.ravel()])
    row_el = row_el.reshape(buf.shape)
    found = 0
    for _ in range(200):
        # shift operands by some partitions and columns, one step per replica
        parts = rng.choice([0] * 12 + [8, 32, -32, 64], size=off.shape)
        cols = rng.choice([0] * 12 + [16, 128, 300, -16], size=off.shape)
        step = parts * row_el + cols
        O = off[None] + np.arange(1, 7)[:, None, None] * step[None]
        first = b.first_bad_replica(tm, buf, O)
        # operands that do not move are the template's, already checked: leaving them out
        # finds the same replica
        assert b.first_bad_replica(tm, buf, O, fixed=step == 0) == first
        expect = None
        for k in range(len(O)):
            for i in range(len(tm)):
                ins = b.template(int(tm[i]))
                ops = operands_of(ins)
                new = {}
                for j, ap in enumerate(ops):
                    new[j] = type(ap)(ap.buffer, ap.dtype, int(O[k, i, j]), ap.dims)
                moved = _with_operands(ins, new)
                try:
                    check_instruction(moved, b._buffers, b.spec)
                except ProgramError:
                    expect = k
                    break
            if expect is not None:
                break
        assert first == expect
        found += expect is not None
    assert 20 < found < 180  # both outcomes drawn


def test_guards_are_checked_alike_on_short_and_long_loops():
    """How many iterations keep their guards' outcomes: integer arithmetic on short loops,
    arrays (Guard.holds) on long ones -- the same count on random guards."""
    from tilescope.lang._loops import Guard, _guards_hold

    class FakeLoop:
        pass

    rng = np.random.default_rng(4)
    found = set()
    for _ in range(300):
        loop, outer, inner = FakeLoop(), FakeLoop(), FakeLoop()
        loop.start, loop.step, loop.n = int(rng.integers(-4, 4)), int(rng.choice([1, 2, -1, 3])), int(rng.integers(3, 40))
        outer.x = int(rng.integers(-8, 8))
        guards = []
        for _ in range(int(rng.integers(1, 4))):
            lo = int(rng.integers(-3, 3))
            coefs = ((loop, int(rng.choice([1, -1, 2]))), (outer, int(rng.integers(-2, 3))),
                     (inner, int(rng.integers(-2, 3))))
            guards.append(Guard(coefs, int(rng.integers(-40, 40)), str(rng.choice(["<", "<=", ">", ">=", "==", "!="])),
                                bool(rng.integers(2)), ((inner, lo, lo + int(rng.integers(0, 3))),)))
        n = loop.n - 1
        xs = loop.start + np.arange(1, loop.n, dtype=np.int64) * loop.step
        ok = np.ones(n, dtype=bool)
        for g in guards:
            ok &= g.holds(loop, xs)
        bad = np.flatnonzero(~ok)
        expect = int(bad[0]) if len(bad) else n
        assert _guards_hold(guards, loop, 1) == expect
        found.add(expect == n)
    assert found == {True, False}


def test_quick_offset_check_agrees_with_the_full_check():
    """An instruction of a template already checked has only its offsets checked again
    (TileBuilder._offsets_ok); on random shifts of real rows that quick check passes exactly
    when the full per-instruction check does."""
    from tilescope.errors import ProgramError
    from tilescope.program import TileBuilder
    from tilescope.program._checks import check_instruction
    from tilescope.program._instruction_columns import operands_of

    b = TileBuilder("quick")
    x = b.input("x", (1024, 512), "float32")
    s = b.sbuf((128, 2048), "float32", site="s")
    p = b.psum((128, 2048), "float32", site="p")
    w = b.sbuf((96, 128), "float32", site="w")
    b.dma_copy(s[0:32, 0:512], x[0:32, 0:512])
    b.tensor_scalar(s[0:32, 0:256], s[0:32, 256:512], "add", 1.0)
    b.tensor_scalar(s[0:48, 0:256], s[0:48, 256:512], "add", 1.0)
    b.matmul(p[:, 0:128], w, s[0:96, 0:128])
    tm, _, buf, off = (np.array(a) for a in b.rows(0, b.instruction_count))
    rng = np.random.default_rng(2)
    outcomes = set()
    for _ in range(400):
        i = int(rng.integers(len(tm)))
        ins = b.template(int(tm[i]))
        ops = operands_of(ins)
        row_el = [max(1, b.buffer(ap.buffer).row_elems) for ap in ops]
        shift = [int(rng.choice([0, 0, 8, 32, -32, 64])) * r + int(rng.choice([0, 0, 16, 128, 300, -16, 1536]))
                 for r in row_el]
        moved = _with_operands(ins, {j: type(ap)(ap.buffer, ap.dtype, ap.offset + d, ap.dims)
                                     for j, (ap, d) in enumerate(zip(ops, shift))})
        try:
            check_instruction(moved, b._buffers, b.spec)
            ok = True
        except ProgramError:
            ok = False
        bufs, offs = b._row(operands_of(moved))
        assert b._offsets_ok(int(tm[i]), bufs, offs) == ok, (moved, shift)
        outcomes.add(ok)
    assert outcomes == {True, False}


def _with_operands(ins, new: dict):
    import dataclasses

    from tilescope.program._instruction_columns import operand_slots

    changes = {}
    for j, (name, sub) in enumerate(operand_slots(ins)):
        if sub is None:
            changes[name] = new[j]
        else:
            lst = list(changes.get(name, getattr(ins, name)))
            lst[sub] = new[j]
            changes[name] = tuple(lst)
    return dataclasses.replace(ins, **changes)
