"""Tiled bf16 matmul, the four steps of the public NKI matrix-multiplication tutorial.

``result[M, N] = lhsT[K, M].T @ rhs[K, N]`` in bf16 with fp32 accumulation.
``python examples/matmul/matmul_kernels.py`` runs K=4096, M=2048, N=2048 (a few seconds);
``--tutorial`` runs the tutorial's K=8192, M=4096, N=8192 (a few minutes: ~260k
instructions to trace). Every step does the same 2*K*M*N FLOPs on TensorE; what differs is
how data reaches it, and the modeled timelines show why each step is faster:

* ``matmul_naive`` (the tutorial's "tiled" kernel): for every 128 x 512 output tile and every
  128-deep K step it loads a [128, 128] lhsT tile and a [128, 512] rhs tile, then issues one
  matmul (183 ns of TensorE). Each input tensor's loads keep one DMA queue, and a queue issues one
  DMA per ~1.3 us (descriptor setup and semaphore-to-start, [dmabw]) while a [128, 512] bf16
  load has only ~0.58 us of data per DMA engine: the kernel is bound by DMA *issue*, one
  iteration per 1.3 us, TensorE busy 14% of the time.
* ``matmul_hoist_load`` (optimization 1): lhsT loaded once per output row of tiles, rhs still
  once per output tile -- the rhs queue still issues one 1 KiB-row DMA per matmul, so the
  model gives about the same time (hardware: 1.2x faster).
* ``matmul_block_free_dimension`` (optimization 2): 2 x 2 output tiles per block, so each rhs
  load serves two matmuls: half the DMAs, half the time.
* ``matmul_optimized`` (optimization 3): blocks of 2048 (M) x 1024 (N) x 1024 (K) loaded as
  [128, 1024] and [128, 2048] rows -- few, large DMAs whose data time exceeds the issue cost,
  each element reused 16 (rhs) or 2 (lhsT) times, partial sums of a K block accumulated in PSUM
  and added into SBUF by VectorE beside TensorE. TensorE runs back to back, LoadStationary in
  its background.

All times are modeled by tilescope's device model, not measured. At the tutorial's size the
model gives 43.8, 42.6, 21.4 and 7.1 ms (13.7%, 14.1%, 27.9% and 85.0% of TensorE peak); the
tutorial reports 51.80, 42.96, 22.07 and 6.97 ms (10.98%, 13.24%, 26.51%, 85.24% HFU) on trn1.
``benchmarks/fidelity.py`` prints the comparison and how it moves with each *assumed* preset
parameter (e.g. ``preset("trn1").replace(dma={"queue_policy": "free"})`` lets one tensor's
DMAs use every queue: the DMA-bound steps then run ~2x faster than hardware).
"""

from __future__ import annotations

import sys

import numpy as np

import tilescope
import tilescope.isa as nisa
import tilescope.lang as tl


@tilescope.kernel
def matmul_naive(lhsT, rhs, result):
    """The tutorial's basic tiled matmul: two loads per matmul, nothing reused."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TILE_M = tl.tile_size.gemm_stationary_fmax  # 128
    TILE_K = tl.tile_size.pmax  # 128
    TILE_N = tl.tile_size.gemm_moving_fmax  # 512
    for m in tl.affine_range(M // TILE_M):
        for n in tl.affine_range(N // TILE_N):
            res_psum = tl.zeros((TILE_M, TILE_N), tl.float32, buffer=tl.psum)
            for k in tl.affine_range(K // TILE_K):
                lhsT_tile = tl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=tl.sbuf)
                rhs_tile = tl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=tl.sbuf)
                lhsT_tile[...] = tl.load(lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
                rhs_tile[...] = tl.load(rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
                res_psum += tl.matmul(lhsT_tile, rhs_tile, transpose_x=True)
            res_sb = tl.copy(res_psum, dtype=result.dtype)
            tl.store(result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], value=res_sb)


@tilescope.kernel
def matmul_hoist_load(lhsT, rhs, result):
    """The tutorial's optimization 1: each lhsT column of tiles loaded once per m, each rhs
    column of tiles once per (m, n) -- fewer, but still [128, 512] (1 KiB-row) loads."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TILE_M = tl.tile_size.gemm_stationary_fmax  # 128
    TILE_K = tl.tile_size.pmax  # 128
    TILE_N = tl.tile_size.gemm_moving_fmax  # 512
    i_lhsT = tl.mgrid[0:TILE_K, 0:TILE_M]
    i_rhs = tl.mgrid[0:TILE_K, 0:TILE_N]
    i_res = tl.mgrid[0:TILE_M, 0:TILE_N]
    for m in tl.affine_range(M // TILE_M):
        lhsT_tiles = tl.ndarray((K // TILE_K, tl.par_dim(TILE_K), TILE_M), dtype=lhsT.dtype, buffer=tl.sbuf)
        for k in tl.affine_range(K // TILE_K):
            lhsT_tiles[k, i_lhsT.p, i_lhsT.x] = tl.load(lhsT[k * TILE_K + i_lhsT.p, m * TILE_M + i_lhsT.x])
        for n in tl.affine_range(N // TILE_N):
            rhs_tiles = tl.ndarray((K // TILE_K, tl.par_dim(TILE_K), TILE_N), dtype=rhs.dtype, buffer=tl.sbuf)
            for k in tl.affine_range(K // TILE_K):
                rhs_tiles[k, i_rhs.p, i_rhs.x] = tl.load(rhs[k * TILE_K + i_rhs.p, n * TILE_N + i_rhs.x])
            res_psum = tl.zeros((TILE_M, TILE_N), tl.float32, buffer=tl.psum)
            for k in tl.affine_range(K // TILE_K):
                res_psum[...] += tl.matmul(lhsT_tiles[k, i_lhsT.p, i_lhsT.x], rhs_tiles[k, i_rhs.p, i_rhs.x],
                                           transpose_x=True)
            res_sb = tl.copy(res_psum, dtype=result.dtype)
            tl.store(result[m * TILE_M + i_res.p, n * TILE_N + i_res.x], value=res_sb)


@tilescope.kernel
def matmul_block_free_dimension(lhsT, rhs, result, TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=2):
    """The tutorial's optimization 2: blocks of 2 x 2 output tiles, so each loaded rhs
    column serves two lhsT columns (half the rhs traffic of the previous step)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TILE_M = tl.tile_size.gemm_stationary_fmax  # 128
    TILE_K = tl.tile_size.pmax  # 128
    TILE_N = tl.tile_size.gemm_moving_fmax  # 512
    i_lhsT = tl.mgrid[0:TILE_K, 0:TILE_M]
    i_rhs = tl.mgrid[0:TILE_K, 0:TILE_N]
    i_res = tl.mgrid[0:TILE_M, 0:TILE_N]
    BLOCK_M, BLOCK_N = TILE_M * TILES_IN_BLOCK_M, TILE_N * TILES_IN_BLOCK_N
    for m in tl.affine_range(M // BLOCK_M):
        lhsT_tiles = tl.ndarray((TILES_IN_BLOCK_M, K // TILE_K, tl.par_dim(TILE_K), TILE_M), dtype=lhsT.dtype,
                                buffer=tl.sbuf)
        for bm in tl.affine_range(TILES_IN_BLOCK_M):
            for k in tl.affine_range(K // TILE_K):
                lhsT_tiles[bm, k, i_lhsT.p, i_lhsT.x] = tl.load(
                    lhsT[k * TILE_K + i_lhsT.p, (m * TILES_IN_BLOCK_M + bm) * TILE_M + i_lhsT.x])
        for n in tl.affine_range(N // BLOCK_N):
            rhs_tiles = tl.ndarray((TILES_IN_BLOCK_N, K // TILE_K, tl.par_dim(TILE_K), TILE_N), dtype=rhs.dtype,
                                   buffer=tl.sbuf)
            for bn in tl.affine_range(TILES_IN_BLOCK_N):
                for k in tl.affine_range(K // TILE_K):
                    rhs_tiles[bn, k, i_rhs.p, i_rhs.x] = tl.load(
                        rhs[k * TILE_K + i_rhs.p, (n * TILES_IN_BLOCK_N + bn) * TILE_N + i_rhs.x])
            for bm in tl.affine_range(TILES_IN_BLOCK_M):
                for bn in tl.affine_range(TILES_IN_BLOCK_N):
                    res_psum = tl.zeros((TILE_M, TILE_N), tl.float32, buffer=tl.psum)
                    for k in tl.affine_range(K // TILE_K):
                        res_psum += tl.matmul(lhsT_tiles[bm, k, i_lhsT.p, i_lhsT.x],
                                              rhs_tiles[bn, k, i_rhs.p, i_rhs.x], transpose_x=True)
                    res_sb = tl.copy(res_psum, dtype=result.dtype)
                    tl.store(result[(m * TILES_IN_BLOCK_M + bm) * TILE_M + i_res.p,
                                    (n * TILES_IN_BLOCK_N + bn) * TILE_N + i_res.x], value=res_sb)


@tilescope.kernel
def matmul_optimized(lhsT, rhs, result, TILES_IN_BLOCK_M=16, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=8):
    """The tutorial's fully optimised matmul: blocked loads, operands reused from SBUF."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TILE_M = tl.tile_size.gemm_stationary_fmax  # 128
    TILE_K = tl.tile_size.pmax  # 128
    TILE_N = tl.tile_size.gemm_moving_fmax  # 512
    BLOCK_M, BLOCK_N, BLOCK_K = TILE_M * TILES_IN_BLOCK_M, TILE_N * TILES_IN_BLOCK_N, TILE_K * TILES_IN_BLOCK_K
    NUM_BLOCK_M, NUM_BLOCK_N, NUM_BLOCK_K = M // BLOCK_M, N // BLOCK_N, K // BLOCK_K

    for n in tl.affine_range(NUM_BLOCK_N):
        result_tiles = tl.zeros((NUM_BLOCK_M, TILES_IN_BLOCK_M, TILES_IN_BLOCK_N, tl.par_dim(TILE_M), TILE_N),
                                dtype=lhsT.dtype, buffer=tl.sbuf)
        for k in tl.sequential_range(NUM_BLOCK_K):
            # rhs block: TILES_IN_BLOCK_K rows of [128, BLOCK_N] -- large DMAs
            i_rhs = tl.mgrid[0:TILE_K, 0:BLOCK_N]
            rhs_tiles = tl.ndarray((TILES_IN_BLOCK_K, tl.par_dim(TILE_K), BLOCK_N), dtype=rhs.dtype, buffer=tl.sbuf)
            for bk_r in tl.affine_range(TILES_IN_BLOCK_K):
                rhs_tiles[bk_r, i_rhs.p, i_rhs.x] = tl.load(
                    rhs[(TILES_IN_BLOCK_K * k + bk_r) * TILE_K + i_rhs.p, BLOCK_N * n + i_rhs.x])

            for m in tl.affine_range(NUM_BLOCK_M):
                i_lhsT = tl.mgrid[0:TILE_K, 0:BLOCK_M]
                lhsT_tiles = tl.ndarray((TILES_IN_BLOCK_K, tl.par_dim(TILE_K), BLOCK_M), dtype=lhsT.dtype,
                                        buffer=tl.sbuf)
                for bk_l in tl.affine_range(TILES_IN_BLOCK_K):
                    lhsT_tiles[bk_l, i_lhsT.p, i_lhsT.x] = tl.load(
                        lhsT[(TILES_IN_BLOCK_K * k + bk_l) * TILE_K + i_lhsT.p, BLOCK_M * m + i_lhsT.x])

                i_lhsT_mm = tl.mgrid[0:TILE_K, 0:TILE_M]
                i_rhs_mm = tl.mgrid[0:TILE_K, 0:TILE_N]
                i_res_mm = tl.mgrid[0:TILE_M, 0:TILE_N]
                for bn in tl.affine_range(TILES_IN_BLOCK_N):
                    for bm in tl.affine_range(TILES_IN_BLOCK_M):
                        res_tile = tl.zeros((TILE_M, TILE_N), dtype=tl.float32, buffer=tl.psum)
                        for bk in tl.affine_range(TILES_IN_BLOCK_K):
                            res_tile[...] += nisa.nc_matmul(
                                lhsT_tiles[bk, i_lhsT_mm.p, bm * TILE_M + i_lhsT_mm.x],
                                rhs_tiles[bk, i_rhs_mm.p, bn * TILE_N + i_rhs_mm.x])
                        # partial sums of this K block: PSUM -> SBUF accumulator (VectorE)
                        result_tiles[m, bm, bn, i_res_mm.p, i_res_mm.x] += res_tile[i_res_mm.p, i_res_mm.x]

        # copy the results out, [128, BLOCK_N] rows at a time (fewer, larger DMAs)
        for m in tl.affine_range(NUM_BLOCK_M):
            for bm in tl.affine_range(TILES_IN_BLOCK_M):
                i_res = tl.mgrid[0:TILE_K, 0:TILE_N]
                i_res_packed = tl.mgrid[0:TILE_K, 0:BLOCK_N]
                result_packed = tl.ndarray((TILE_K, BLOCK_N), dtype=result_tiles.dtype, buffer=tl.sbuf)
                for bn in tl.affine_range(TILES_IN_BLOCK_N):
                    result_packed[i_res.p, bn * TILE_N + i_res.x] = tl.copy(result_tiles[m, bm, bn, i_res.p, i_res.x])
                tl.store(result[(TILES_IN_BLOCK_M * m + bm) * TILE_K + i_res_packed.p, BLOCK_N * n + i_res_packed.x],
                         value=result_packed[i_res_packed.p, i_res_packed.x])


def inputs(K: int, M: int, N: int, seed: int = 0, data: bool = True):
    """bf16 ``lhsT [K, M]``, ``rhs [K, N]`` and an output buffer ``[M, N]`` (uninitialised
    arrays when ``data`` is False: enough for modeled timing with ``numerics=False``)."""
    bf16 = tl.TensorSpec
    if not data:
        return bf16((K, M), "bfloat16"), bf16((K, N), "bfloat16"), bf16((M, N), "bfloat16")
    import ml_dtypes

    rng = np.random.default_rng(seed)
    lhsT = rng.standard_normal((K, M), dtype=np.float32).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((K, N), dtype=np.float32).astype(ml_dtypes.bfloat16)
    return lhsT, rhs, np.zeros((M, N), ml_dtypes.bfloat16)


STEPS = ("matmul_naive", "matmul_hoist_load", "matmul_block_free_dimension", "matmul_optimized")
PUBLISHED_MS = (51.80, 42.96, 22.07, 6.97)  # the tutorial's table, trn1, at its own size


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    tutorial = "--tutorial" in argv
    K, M, N = (8192, 4096, 8192) if tutorial else (4096, 2048, 2048)
    print(f"bf16 matmul [{M}, {K}] @ [{K}, {N}] on the modeled trn1 core (all times modeled)\n")
    totals = []
    for name, pub in zip(STEPS, PUBLISHED_MS):
        kernel = globals()[name]
        r = tilescope.simulate(kernel, *inputs(K, M, N, data=False), numerics=False)
        s = r.summary
        totals.append(s.total_ns)
        published = f"; tutorial on trn1: {pub:.2f} ms" if tutorial else ""
        print(f"{kernel.name}: {s.total_us / 1000:.2f} ms, TensorE {s.mfu:.1%} of peak{published}, "
              f"{s.instructions:,} instructions, {s.dma_transfers:,} DMAs of {s.average_dma_bytes / 1024:.0f} KiB "
              f"on average; busy: " + ", ".join(f"{k} {v / s.total_ns:.0%}" for k, v in s.engine_busy_ns.items()))
        print(r.timeline.text(width=64))
        print()
    print("step to step (modeled): " + ", ".join(f"{a / b:.2f}x" for a, b in zip(totals, totals[1:]))
          + f"; tiled -> optimized {totals[0] / totals[-1]:.1f}x"
          + (f" (tutorial: {', '.join(f'{a / b:.2f}x' for a, b in zip(PUBLISHED_MS, PUBLISHED_MS[1:]))}; "
             f"{PUBLISHED_MS[0] / PUBLISHED_MS[-1]:.1f}x)" if tutorial else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
