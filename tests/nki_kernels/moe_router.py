"""A mixture-of-experts router (current ``nki`` API): for each token, the top 8 of its expert
logits, their positions, and softmax weights over those 8. Tokens are on partitions; the
top 8 is one VectorE max8 and one nc_find_index8 per tile of 128 tokens; the weights are
one ScalarE exp with its sum, and a scale -- with the experts past the first 8 (top 16)
found by knocking the first 8 out with nc_match_replace8."""
import numpy as np
import nki
import nki.isa as nisa
import nki.language as nl

K = 8


@nki.jit
def moe_router(logits):
    """logits [tokens, experts] -> (weights [tokens, 8] fp32, experts [tokens, 8] uint32,
    next experts [tokens, 8] uint32: the 9th to 16th best)."""
    tokens, experts = logits.shape
    P = nl.tile_size.pmax
    weights = nl.ndarray((tokens, K), dtype=nl.float32, buffer=nl.shared_hbm)
    chosen = nl.ndarray((tokens, K), dtype=nl.uint32, buffer=nl.shared_hbm)
    runners_up = nl.ndarray((tokens, K), dtype=nl.uint32, buffer=nl.shared_hbm)
    for t in nl.affine_range(tokens // P):
        rows = nl.ds(t * P, P)
        x = nl.ndarray((P, experts), dtype=logits.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=logits[rows, :])
        top = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)
        nisa.max8(dst=top, src=x)
        idx = nl.ndarray((P, K), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=idx, data=x, vals=top)
        # softmax over the 8: exp(v - max) with its sum in one ScalarE pass, then a scale
        neg_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg_max, data=top[:, 0:1], op0=nl.multiply, operand0=-1.0)
        e = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=e, op=nl.exp, data=top, bias=neg_max, reduce_op=nl.add, reduce_res=total)
        w = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=w, data=e, op0=nl.divide, operand0=total)
        # the next 8: knock the first 8 out, then the top 8 of what is left
        rest = nl.ndarray((P, experts), dtype=logits.dtype, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=rest, data=x, vals=top, imm=-np.inf)
        top2 = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)
        nisa.max8(dst=top2, src=rest)
        idx2 = nl.ndarray((P, K), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=idx2, data=rest, vals=top2)
        nisa.dma_copy(dst=weights[rows, :], src=w)
        nisa.dma_copy(dst=chosen[rows, :], src=idx)
        nisa.dma_copy(dst=runners_up[rows, :], src=idx2)
    return weights, chosen, runners_up


def check():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((256, 64)).astype(np.float32)  # distinct values: one answer
    w, ids, ids2 = moe_router(logits)
    order = np.argsort(-logits, axis=1, kind="stable")
    np.testing.assert_array_equal(ids, order[:, :K])
    np.testing.assert_array_equal(ids2, order[:, K:2 * K])
    top = np.take_along_axis(logits, order[:, :K], axis=1).astype(np.float64)
    e = np.exp(top - top[:, :1])
    np.testing.assert_allclose(w, e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    print("moe_router: OK")


if __name__ == "__main__":
    check()
