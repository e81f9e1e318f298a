"""The compiler's fusion, without the device: plans, Programs and their numerics.

Programs built by the fuser are run with the numpy interpreter and compared to
CPU torch, so a fused Program that computes the wrong thing fails here.
"""

import collections

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilescope.compile._emit import emit_segments
from tilescope.compile._graph import trace_aten
from tilescope.compile._plan import plan_graph
from tilescope.sim import run_numerics, simulate


def fuse(fn, *args):
    gm = trace_aten(fn, *args)
    segments = plan_graph(gm)
    fused = [s for s in segments if s.kind in ("rowgroup", "matmul")]
    prog, stats = emit_segments(fused, "test", "trn1")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = {n.name: a.float().numpy().reshape(prog.buffers[n.name].shape)
              for n, a in zip(placeholders, args) if n.name in prog.buffers}
    for n, a in zip(placeholders, args):
        if n.name in prog.buffers and a.dtype == torch.bfloat16:
            import ml_dtypes
            inputs[n.name] = a.float().numpy().astype(ml_dtypes.bfloat16).reshape(prog.buffers[n.name].shape)
    out = run_numerics(prog, inputs)
    return segments, prog, stats, out


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _only(out):
    (v,) = out.values()
    return v.astype(np.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_naive_rmsnorm_is_one_row_group(dtype):
    x = torch.randn(300, 768).to(dtype)
    w = torch.randn(768).to(dtype)
    segments, prog, _, out = fuse(rmsnorm, x, w)
    assert [s.kind for s in segments] == ["rowgroup"]
    assert segments[0].names == ["pow_1", "mean", "add", "rsqrt", "mul", "mul_1"]
    ref = rmsnorm(x, w).float().numpy()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    np.testing.assert_allclose(_only(out), ref, **tol)


def test_softmax_and_layernorm_fuse_and_match():
    x = torch.randn(256, 512)
    segs, _, _, out = fuse(lambda x: torch.softmax(x, -1), x)
    assert [s.kind for s in segs] == ["rowgroup"]
    np.testing.assert_allclose(_only(out), torch.softmax(x, -1).numpy(), rtol=1e-5, atol=1e-7)
    w, b = torch.randn(512), torch.randn(512)
    ln = lambda x, w, b: torch.nn.functional.layer_norm(x, (512,), w, b)  # noqa: E731
    segs, prog, _, out = fuse(ln, x, w, b)
    assert [s.kind for s in segs] == ["rowgroup"]
    assert "bn_stats" in prog.summary_counts()
    np.testing.assert_allclose(_only(out), ln(x, w, b).numpy(), rtol=1e-4, atol=1e-4)


def test_matmul_with_epilogue_is_one_segment_with_a_tensore_stage():
    x, w, b = torch.randn(256, 384), torch.randn(384, 640) * 0.05, torch.randn(640)
    fn = lambda x, w, b: torch.nn.functional.gelu(x @ w + b)  # noqa: E731
    segs, prog, _, out = fuse(fn, x, w, b)
    assert [(s.kind, s.names) for s in segs] == [("matmul", ["mm", "add", "gelu"])]
    counts = prog.summary_counts()
    assert counts["matmul"] > 0 and counts["transpose"] > 0
    assert simulate(prog).summary.engine_busy_ns["TensorE"] > 0
    np.testing.assert_allclose(_only(out), fn(x, w, b).numpy(), rtol=1e-4, atol=1e-4)


def test_unfusable_reduction_stays_apart_with_a_reason():
    x = torch.randn(256, 64)
    segs = plan_graph(trace_aten(lambda x: (x * 2).sum(0), x))
    kinds = [(s.kind, s.reason) for s in segs]
    assert kinds[0][0] == "rowgroup"
    assert kinds[1][0] == "eager" and "cross-partition" in kinds[1][1]


def _many_live(n):
    def fn(x):
        vals = [x * float(k + 1) for k in range(n)]
        out = vals[0]
        for v in vals[1:]:
            out = out + v.exp()
        return out
    return fn


def test_rows_wider_than_the_sbuf_budget_are_cut_into_column_chunks():
    # 8 values of 64 KiB per partition live at once: more than the budget, so the rows are
    # streamed in column chunks and nothing round-trips HBM
    x = torch.randn(128, 16384)
    segs, prog, stats, out = fuse(_many_live(8), x)
    assert [s.kind for s in segs] == ["rowgroup"]
    assert not stats.spilled_values
    s = simulate(prog).summary
    assert s.hbm_read_bytes == s.hbm_write_bytes == x.numel() * 4
    np.testing.assert_allclose(_only(out), _many_live(8)(x).numpy(), rtol=1e-4, atol=1e-3)


def test_over_sbuf_graph_spills_and_stays_correct():
    # 32 values alive at once do not fit even in the narrowest column chunks: some are spilled
    x = torch.randn(128, 1024)
    segs, prog, stats, out = fuse(_many_live(32), x)
    assert [s.kind for s in segs] == ["rowgroup"]
    assert stats.spill_bytes > 0 and stats.spilled_values
    labels = {prog.provenance[i].label for i in prog.instr_prov}
    assert "spill" in labels and "spill reload" in labels
    np.testing.assert_allclose(_only(out), _many_live(32)(x).numpy(), rtol=1e-4, atol=1e-2)


UNARY = [torch.exp, torch.tanh, torch.sigmoid, torch.relu, lambda t: t * 0.5, lambda t: t + 1.0,
         torch.nn.functional.silu, torch.nn.functional.gelu]
REDUCE = [lambda t: t.mean(-1, keepdim=True), lambda t: t.amax(-1, keepdim=True),
          lambda t: t.sum(-1, keepdim=True)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 300), d=st.integers(1, 700),
    ops=st.lists(st.tuples(st.sampled_from(["unary", "reduce", "binary_w", "binary_prev"]),
                           st.integers(0, 7)), min_size=1, max_size=7),
)
def test_random_pointwise_and_reduction_graphs_fuse_into_one_pass(rows, d, ops):
    def fn(x, w):
        vals = [x]
        for kind, k in ops:
            cur = vals[-1]
            if kind == "unary":
                vals.append(UNARY[k % len(UNARY)](cur))
            elif kind == "reduce":
                vals.append(cur - REDUCE[k % len(REDUCE)](cur))
            elif kind == "binary_w":
                vals.append(cur * w)
            else:
                vals.append(cur + vals[k % len(vals)])
        return vals[-1]

    gen = torch.Generator().manual_seed(rows * 1000 + d)  # deterministic per example
    x = torch.randn(rows, d, generator=gen) * 0.5
    w = torch.randn(d, generator=gen) * 0.5
    segs, prog, stats, out = fuse(fn, x, w)
    assert [s.kind for s in segs] == ["rowgroup"]
    ref = fn(x, w).numpy()
    ours = _only(out).reshape(ref.shape)  # a pointwise-only group may tile the bytes as wider rows
    # Both are fp32 with different summation orders, and a random graph can amplify rounding
    # (x - sum(x) cancels, and chained reductions grow the magnitudes the rounding scales with):
    # judge both against float64 and allow the fused pass a small multiple of eager PyTorch's
    # worst error on this output (one element's eager error can be small by luck), plus the
    # magnitudes that went in.
    exact = fn(x.double(), w.double()).numpy()
    finite = np.abs(ref[np.isfinite(ref)])
    scale = max(1.0, float(finite.max()) if finite.size else 1.0, float(np.abs(x.numpy()).max()) * d)
    fin = np.isfinite(ref)
    np.testing.assert_array_equal(np.isfinite(ours), fin)  # overflow where eager overflows
    np.testing.assert_array_equal(ours[~fin], ref[~fin])
    eager_err = np.abs(ref[fin].astype(np.float64) - exact[fin])
    tol = 2e-4 * np.abs(exact[fin]) + 2e-6 * scale + 8 * (eager_err.max() if eager_err.size else 0.0)
    err = np.abs(ours[fin].astype(np.float64) - exact[fin])
    worst = int(np.argmax(err - tol)) if err.size else 0
    assert (err <= tol).all(), (
        f"fused error {err[worst]:.3g} exceeds {tol[worst]:.3g} at finite element {worst} "
        f"(exact {exact[fin][worst]:.6g}, eager {ref[fin][worst]:.6g}, fused {ours[fin][worst]:.6g})")
    s = simulate(prog).summary
    if not stats.spill_bytes:
        # each input is read once and the output written once: no intermediate touches HBM
        from tilescope.compile._plan import value_class

        w_bytes = 0
        if "w_1" in prog.buffers:  # w is broadcast into 128 partitions once, unless it is a row itself
            w_bytes = 128 * d * 4 if value_class((d,), rows, d) == "colvec" else rows * d * 4
        assert s.hbm_read_bytes == rows * d * 4 + w_bytes
        assert s.hbm_write_bytes == rows * d * 4


def test_linear_reads_the_weight_as_stored_and_transposes_it_on_tensore():
    x, w, b = torch.randn(200, 192), torch.randn(320, 192) * 0.05, torch.randn(320)
    fn = lambda x, w, b: torch.relu(torch.nn.functional.linear(x, w, b))  # noqa: E731
    gm = trace_aten(fn, x, w, b)
    segs = plan_graph(gm)
    assert [s.kind for s in segs] == ["view", "matmul"]  # t(w) is metadata only
    assert segs[1].b_transposed and not segs[1].a_transposed
    prog, _ = emit_segments(segs[1:], "linear", "trn1")
    # the transposed weight is read as stored: W[N, K], no copy before the matmul
    assert prog.buffers["t"].shape == (320, 192)
    out = run_numerics(prog, {"x_1": x.numpy(), "t": w.numpy(), "b_1": b.numpy().reshape(1, -1)})
    np.testing.assert_allclose(_only(out), fn(x, w, b).numpy(), rtol=1e-4, atol=1e-4)


def test_pointwise_group_on_a_narrow_last_dim_is_laid_out_as_wide_rows():
    x = torch.randn(16, 32, 32, 32)  # NCHW: W = 32 would make 16 KB tiles
    fn = lambda x: torch.relu(x * 2.0) + 1.0  # noqa: E731
    segs, prog, _, out = fuse(fn, x)
    np.testing.assert_allclose(_only(out).reshape(x.shape), fn(x).numpy(), rtol=1e-6)
    s = simulate(prog).summary
    assert s.hbm_read_bytes == s.hbm_write_bytes == x.numel() * 4
    # tiles of the eager lowering's size ([128, 2048]), not [128, 32] ones
    assert s.dma_transfers == 2 * x.numel() // (128 * 2048)


def test_groups_with_reductions_pack_narrow_rows_per_partition():
    x = torch.randn(16, 32, 32, 32)
    segs, prog, _, out = fuse(lambda x: torch.softmax(x, -1), x)
    np.testing.assert_allclose(_only(out).reshape(x.shape), torch.softmax(x, -1).numpy(), rtol=1e-5, atol=1e-6)
    # 16384 rows of 32: each tile holds 64 rows per partition, not one
    assert simulate(prog).summary.dma_transfers == 2 * 16384 // (128 * 64)


@pytest.mark.parametrize("name, fn", [
    ("log_softmax", lambda x: torch.log_softmax(x, -1)),
    ("softmax", lambda x: torch.softmax(x * 0.5, -1)),
    ("layer_norm", lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],))),
    ("sum_mean", lambda x: x.sum(-1, keepdim=True) * x.mean(-1, keepdim=True) + x.amax(-1, keepdim=True)),
])
def test_a_vocabulary_wide_row_is_reduced_in_column_chunks(name, fn):
    """Rows of 50257 (GPT-2's vocabulary) do not fit SBUF: each pass streams a row's column
    chunks; a max and the sum of exp(x - max) share one pass (online log-sum-exp)."""
    x = torch.randn(130, 50257)
    segs, prog, stats, out = fuse(fn, x)
    assert [s.kind for s in segs] == ["rowgroup"]
    np.testing.assert_allclose(_only(out), fn(x).numpy(), rtol=2e-4, atol=2e-5)
    assert not stats.spilled_values
    s = simulate(prog).summary
    passes = {"log_softmax": 2, "softmax": 2, "layer_norm": 2, "sum_mean": 1}[name]
    assert stats.passes == passes
    assert s.hbm_read_bytes == passes * x.numel() * 4  # each pass reads the rows once, nothing else


@pytest.mark.parametrize("m, k, n, linear, plan", [
    (64, 128, 50257, False, "a_resident"),    # a projection onto GPT-2's vocabulary
    (200, 96, 50257, True, "a_resident"),     # the same through nn.Linear: W [V, d] read as stored
    (128, 20000, 96, False, "k_stream"),      # a contraction over a vocabulary-sized dim
])
def test_matmuls_past_sbuf_tile_every_dim(m, k, n, linear, plan):
    from tilescope.lower._gemm import gemm_plan

    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) * 0.05 if linear else torch.randn(k, n, generator=g) * 0.05
    fn = (lambda x, w: torch.nn.functional.linear(x, w).relu()) if linear else (lambda x, w: (x @ w).relu())
    gm = trace_aten(fn, x, w)
    segs = [s for s in plan_graph(gm) if s.kind == "matmul"]
    prog, _ = emit_segments(segs, "mm", "trn1")
    assert gemm_plan(m, k, n, "float32", int(192 * 1024 * 0.4)).kind == plan
    feeds = {"x_1": x.numpy(), ("t" if linear else "w_1"): w.numpy()}
    np.testing.assert_allclose(_only(run_numerics(prog, feeds)), fn(x, w).numpy(), rtol=1e-3, atol=1e-3)
    s = simulate(prog).summary
    # every operand crosses HBM once (A.T kept on chip, B streamed in panels) where it fits
    if plan == "a_resident":
        assert s.hbm_read_bytes == (x.numel() + w.numel()) * 4


@pytest.mark.parametrize("m, k, n, linear", [
    (300, 768, 1000, True),   # nn.Linear: W [N, K] read 128 rows at a time, each row's K tiles at once
    (300, 2000, 640, True),   # K tiles in groups (a group's rows within the GEMM's budget)
    (260, 768, 700, False),   # A row-major [M, K]: its rows read at once, transposed per K tile
])
def test_row_major_gemm_operands_are_read_in_whole_row_runs(m, k, n, linear):
    """Operands transposed on TensorE (A row-major, a Linear weight W) are loaded 128 rows at a
    time over a group of K tiles in one transfer, not one transfer of 128-element runs per K
    tile: each transfer costs its queue the fixed issue time. Values as CPU; each operand still
    crosses HBM once."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) * 0.05 if linear else torch.randn(k, n, generator=g) * 0.05
    fn = (lambda x, w: torch.nn.functional.linear(x, w)) if linear else (lambda x, w: x @ w)
    segs = [s for s in plan_graph(trace_aten(fn, x, w)) if s.kind == "matmul"]
    prog, _ = emit_segments(segs, "mm", "trn1")
    feeds = {"x_1": x.numpy(), ("t" if linear else "w_1"): w.numpy()}
    np.testing.assert_allclose(_only(run_numerics(prog, feeds)), fn(x, w).numpy(), rtol=1e-3, atol=1e-3)
    assert simulate(prog).summary.hbm_read_bytes == (x.numel() + w.numel()) * 4
    loads = collections.Counter(i.src.buffer for i in prog.instructions if type(i).__name__ == "DmaCopy"
                                and prog.buffers[i.src.buffer].memory == "hbm")
    x_name = next(n for n in prog.buffers if n.startswith("x"))
    kt = -(-k // 128)
    per_load = max(1, int(192 * 1024 * 0.4) // 8 // (2 * 128 * 4))  # K tiles a transfer covers
    assert loads[x_name] == -(-m // 128) * -(-kt // per_load)
    if linear:
        w_name = next(n for n in prog.buffers if n != x_name and prog.buffers[n].role == "input")
        assert loads[w_name] == -(-n // 128) * -(-kt // per_load)


@pytest.mark.parametrize("b, t, d", [
    (2, 32, 64),     # narrow rows packed several to a partition (a divisor of the period)
    (3, 50, 768),    # a period that does not divide a tile: runs cut where it starts again
    (2, 160, 96),    # a period longer than a tile
    (5, 7, 48),      # a prime period
    (2, 12, 20000),  # rows cut into column chunks
])
def test_a_periodic_broadcast_fuses_and_reads_its_period(b, t, d):
    """``tok + pos``: pos [T, D] repeats every T rows of the [B*T, D] block. It joins the row
    group (no extra execution) and is read from its own T rows, not materialized B times."""
    g = torch.Generator().manual_seed(0)
    tok, pos, w = torch.randn(b, t, d, generator=g), torch.randn(t, d, generator=g), torch.randn(d, generator=g)
    fn = lambda tok, pos, w: torch.nn.functional.layer_norm(tok + pos, (d,), w)  # noqa: E731
    segs, prog, _, out = fuse(fn, tok, pos, w)
    assert [s.kind for s in segs] == ["rowgroup"]
    np.testing.assert_allclose(_only(out).reshape(tok.shape), fn(tok, pos, w).numpy(), rtol=1e-4, atol=1e-4)
    assert any(prog.provenance[k].label == "load (periodic)" for k in prog.instr_prov)
    # each row reads its row of the period once: the bytes of a pos materialized B times
    _, full, _, _ = fuse(lambda tok, pos, w: torch.nn.functional.layer_norm(tok + pos, (d,), w),
                         tok, pos.expand(b, t, d).contiguous(), w)
    assert simulate(prog).summary.hbm_read_bytes == simulate(full).summary.hbm_read_bytes


def test_rows_sized_operands_broadcast_along_trailing_dims_not_per_row():
    """A [T, D] operand of [B, T, D] with T * D == B * T (B == D) has one value per row by count
    only: torch aligns it with the trailing dims, and so does the fused Program."""
    g = torch.Generator().manual_seed(1)
    tok, pos = torch.randn(8, 4, 8, generator=g), torch.randn(4, 8, generator=g)
    fn = lambda tok, pos: (tok * pos).softmax(-1)  # noqa: E731
    segs, _, _, out = fuse(fn, tok, pos)
    assert [s.kind for s in segs] == ["rowgroup"]
    np.testing.assert_allclose(_only(out).reshape(tok.shape), fn(tok, pos).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, fn", [
    ((2, 32, 4, 16), lambda x: x.transpose(1, 2) * 2.0 + 1.0),          # heads moved before the sequence
    ((2, 40, 3, 64), lambda x: torch.softmax(x.transpose(1, 2), -1)),   # runs of 40 rows, k = 1
    ((6, 600, 2), lambda x: x.transpose(1, 2).exp()),                    # a strided last dim: copied first
])
def test_a_group_reads_a_transposed_input_by_its_strides(shape, fn):
    """A transposed view feeding a row group is read where it is, one transfer per run of rows
    that follow each other in memory -- not copied to a contiguous tensor first."""
    from tilescope.compile._emit import row_layout, layout_span

    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    gm = trace_aten(fn, x)
    segments = plan_graph(gm)
    fused = [s for s in segments if s.kind == "rowgroup"]
    prog, _ = emit_segments(fused, "test", "trn1")
    (inp,) = fused[0].inputs
    strided = prog.meta["read_strided"]
    if x.transpose(1, 2).stride()[-1] != 1:
        assert strided == []  # the runtime makes it contiguous; the Program reads it so
        return
    assert strided == [inp.name]
    dims = row_layout(inp, tuple(inp.meta["val"].shape), shape[-1])
    feeds = {inp.name: x.reshape(1, -1)[:, :layout_span(dims, shape[-1])].numpy()}
    np.testing.assert_allclose(_only(run_numerics(prog, feeds)).reshape(fn(x).shape), fn(x).numpy(),
                               rtol=1e-5, atol=1e-6)
    assert any(prog.provenance[k].label == "load (strided)" for k in prog.instr_prov)


@pytest.mark.parametrize("d", [64, 700, 20000])
def test_an_expanded_per_row_value_stays_in_the_group(d):
    """``r.expand(x.shape)`` (as autograd writes norm backwards) is a stride-0 view of the per-row
    value on chip: the group keeps it instead of leaving the expand out."""
    x = torch.randn(300, d, generator=torch.Generator().manual_seed(0))
    fn = lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6).expand(x.shape) + 1.0  # noqa: E731
    segs, _, _, out = fuse(fn, x)
    assert [s.kind for s in segs] == ["rowgroup"]
    np.testing.assert_allclose(_only(out), fn(x).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, perm", [
    ((4, 3, 197, 64), (0, 2, 1, 3)),        # ViT's head merge: [b, h, n, hd] -> [b, n, h, hd]
    ((3, 4, 3, 197, 64), (1, 3, 0, 2, 4)),  # its qkv gradient: [3, b, h, n, hd] -> [b, n, 3, h, hd]
])
def test_a_transposed_input_in_short_runs_is_read_a_box_of_partitions_per_transfer(shape, perm):
    """A transposed input whose rows follow each other only in runs of 3 (the heads of a token):
    each partition holds whole runs and one multi-dim transfer reads the partitions of a box of
    the dims left (128 tokens), dealt over the DMA queues -- not one transfer per run. Values as
    CPU; modeled time within 2x of the same group on a contiguous input (before: 9x)."""
    from tilescope.compile._emit import layout_span, row_layout

    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    fn = lambda t: t.permute(perm) * 2.0  # noqa: E731
    segments = [s for s in plan_graph(trace_aten(fn, x)) if s.kind == "rowgroup"]
    prog, _ = emit_segments(segments, "test", "trn1")
    (inp,) = segments[0].inputs
    dims = row_layout(inp, tuple(segments[0].nodes[-1].meta["val"].shape), shape[-1])
    feeds = {inp.name: x.reshape(1, -1)[:, :layout_span(dims, shape[-1])].numpy()}
    np.testing.assert_allclose(_only(run_numerics(prog, feeds)).reshape(fn(x).shape), fn(x).numpy())
    loads = [i for i, k in enumerate(prog.instr_prov) if prog.provenance[k].label == "load (strided)"]
    tiles = -(-x.numel() // shape[-1] // (128 * 3))
    assert len(loads) <= 2 * tiles
    assert len({prog.instructions[i].queue for i in loads}) > 1
    (contiguous,) = [s for s in plan_graph(trace_aten(lambda t: t * 2.0, fn(x).contiguous())) if s.kind == "rowgroup"]
    base, _ = emit_segments([contiguous], "contiguous", "trn1")
    assert simulate(prog).summary.total_ns < 2 * simulate(base).summary.total_ns


def test_tiles_use_the_partitions_of_the_device_preset():
    """The row tiles take their partition count from the preset (not a hard-coded 128)."""
    import dataclasses

    from tilescope.spec import preset

    x, w = torch.randn(300, 700), torch.randn(700)
    segments = [s for s in plan_graph(trace_aten(rmsnorm, x, w)) if s.kind == "rowgroup"]
    for lanes in (64, 128):
        spec = dataclasses.replace(preset("trn1"), partitions=lanes)
        prog, _ = emit_segments(segments, "test", spec)
        out = run_numerics(prog, {"x_1": x.numpy(), "w_1": w.numpy().reshape(1, -1)})
        np.testing.assert_allclose(_only(out), rmsnorm(x, w).numpy(), rtol=1e-4, atol=1e-4)
        assert max(b.shape[0] for b in prog.buffers.values() if b.memory == "sbuf") == lanes


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("keep", [True, False])
def test_a_projection_and_its_log_softmax_fuse_with_an_online_log_sum_exp(bias, keep):
    """``log_softmax(linear(h, W))``: the row reductions join the matmul's segment. Each output
    block's max and sum of exp(x - max) update per-row running values straight from PSUM. The
    second pass needs the logits again: ``keep`` writes them once in the first pass and reads
    them back (the product made once); otherwise the second pass makes the product again (h
    and W read per pass) and the logits never cross HBM. Both beat the product's round trip of
    the plain plan (matmul, then a two-pass row group) in HBM traffic; values as CPU."""
    g = torch.Generator().manual_seed(0)
    h, w, b = torch.randn(200, 96, generator=g), torch.randn(5000, 96, generator=g) * 0.05, torch.randn(5000, generator=g)
    fn = (lambda h, w, b: torch.log_softmax(torch.nn.functional.linear(h, w, b), -1)) if bias else \
        (lambda h, w: torch.log_softmax(torch.nn.functional.linear(h, w), -1))
    args = (h, w, b) if bias else (h, w)
    gm = trace_aten(fn, *args)
    fused = [s for s in plan_graph(gm, reductions=True) if s.kind in ("rowgroup", "matmul")]
    assert [s.kind for s in fused] == ["matmul"] and "amax" in " ".join(fused[0].names)
    fused[0].keep_product = keep
    prog, stats = emit_segments(fused, "ce", "trn1")
    feeds = {"h_1": h.numpy(), "t": w.numpy(), "b_1": b.numpy().reshape(1, -1)}
    out = run_numerics(prog, {k: v for k, v in feeds.items() if k in prog.buffers})
    np.testing.assert_allclose(_only(out), fn(*args).numpy(), rtol=1e-4, atol=1e-4)
    s = simulate(prog).summary
    assert stats.passes == 2
    logits = h.shape[0] * w.shape[0] * 4
    assert stats.kept_bytes == (logits if keep else 0) and len(stats.kept_values) == keep
    assert s.hbm_write_bytes == logits * (2 if keep else 1)  # (the logits, once) and the log-probabilities
    operands = (h.numel() + w.numel()) * 4
    if bias:  # read once into every partition, held whole
        operands += b.numel() * 4 * 128
    assert s.hbm_read_bytes <= (operands + logits if keep else 2 * operands)
    plain = [s for s in plan_graph(gm) if s.kind in ("rowgroup", "matmul")]
    assert [s.kind for s in plain] == ["matmul", "rowgroup"]
    base, _ = emit_segments(plain, "plain", "trn1")
    b0 = simulate(base).summary
    assert s.hbm_read_bytes + s.hbm_write_bytes < b0.hbm_read_bytes + b0.hbm_write_bytes
    assert s.total_ns < (0.9 if keep or not bias else 0.95) * b0.total_ns