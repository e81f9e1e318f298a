"""Tiled and blocked matmul (current ``nki`` API): ``result = lhsT.T @ rhs`` in bf16 with
fp32 PSUM accumulation. ``nc_matmul(dst=...)`` infers the accumulate flag; the blocked
kernel keeps TILES_N output tiles in one PSUM tensor of TILES_N banks."""
import numpy as np
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def matmul_tiled(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    TM, TK, TN = nl.tile_size.gemm_stationary_fmax, nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        for n in nl.affine_range(N // TN):
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                a = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                nisa.dma_copy(dst=b, src=rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)
            res = nl.ndarray((TM, TN), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], src=res)
    return result


@nki.jit
def matmul_blocked(lhsT, rhs, TILES_M=2, TILES_N=2):
    K, M = lhsT.shape
    _, N = rhs.shape
    TM, TK, TN = 128, 128, 512
    BM, BN = TM * TILES_M, TN * TILES_N
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // BM):
        lhs_block = nl.ndarray((K // TK, nl.par_dim(TK), BM), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(K // TK):
            nisa.dma_copy(dst=lhs_block[k], src=lhsT[k * TK:(k + 1) * TK, m * BM:(m + 1) * BM])
        for n in nl.affine_range(N // BN):
            rhs_block = nl.ndarray((K // TK, nl.par_dim(TK), BN), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(K // TK):
                nisa.dma_copy(dst=rhs_block[k], src=rhs[k * TK:(k + 1) * TK, n * BN:(n + 1) * BN])
            for bm in nl.affine_range(TILES_M):
                acc = nl.ndarray((TM, TILES_N, TN), dtype=nl.float32, buffer=nl.psum)   # TILES_N banks
                for bn in nl.affine_range(TILES_N):
                    for k in nl.affine_range(K // TK):
                        nisa.nc_matmul(dst=acc[:, bn, :], stationary=lhs_block[k, :, bm * TM:(bm + 1) * TM],
                                       moving=rhs_block[k, :, bn * TN:(bn + 1) * TN])
                out_tile = nl.ndarray((TM, BN), dtype=result.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=out_tile, src=acc.reshape((TM, BN)))
                nisa.dma_copy(dst=result[m * BM + bm * TM:m * BM + (bm + 1) * TM, n * BN:(n + 1) * BN],
                              src=out_tile)
    return result


def check():
    import ml_dtypes

    rng = np.random.default_rng(6)
    K, M, N = 512, 512, 2048
    lhsT = rng.standard_normal((K, M)).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((K, N)).astype(ml_dtypes.bfloat16)
    ref = lhsT.astype(np.float32).T @ rhs.astype(np.float32)
    for kernel in (matmul_tiled, matmul_blocked):
        got = kernel(lhsT, rhs).astype(np.float32)
        np.testing.assert_allclose(got, ref, rtol=2e-2, atol=0.5)
    print("matmul: OK")


if __name__ == "__main__":
    check()
