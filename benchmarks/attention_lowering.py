"""Attention on the modeled core: the flash-style Programs at model shapes, against their bounds.

For each shape (bf16, preset trn1), forward and backward, it prints (all times *modeled*):
  * time: the Program's modeled duration (the simulator, one execution)
  * bound: max(FLOPs at TensorE's peak, HBM bytes at the DMA/HBM peak), from the spec's fields;
    FLOPs are useful FLOPs: only the scored (query, key) pairs (causal: the lower triangle), the
    attention's own math (``useful_flops``, the model zoo's definition), not the kernel's extra
    scoring pass, mask and stabiliser matmuls
  * x bound: time / bound (the issue's target: <= 2x at large shapes)
  * % PE: achieved useful FLOP/s as a share of TensorE's peak (target: >= 50%)
  * port floor: the time the PSUM port alone needs -- every score passes VectorE (max) and
    ScalarE (exp) in the forward, ScalarE (exp, dP - D, dS^T copy) in the backward, and those
    engines share the port on NeuronCore-v2 [arch] (v3 lifts it [arch2]) -- the engine floor of
    this algorithm on this core: PSUM is the only place TensorE writes, so each score crosses the
    port at least twice forward (NKI's own flash kernel: one copy of S, one of P^T) and three
    times backward (S, dP and dS^T)
  * ceiling: % PE at the port floor (what this algorithm could reach with nothing else on the port)
  * bound by: the busiest engine of the timeline

and a second line read from the trace, which explains the gap: the PSUM port's busy time (the
ScalarE and VectorE instructions that read or write PSUM; on v2 they serialize) and its share
of the run, the other engines' busy time, and for head dims under 128 the share of TensorE's rows
that Q K^T (and the backward's S and dP) can use: its matmuls pass ``E`` of 128 rows, so the peak
those matmuls can reach is E/128 of TensorE's; "row-limited" is TensorE's time at that peak.

Then HF GPT-2's eager attention (matmul, scale, where with the causal bias, softmax, matmul) on
the sim device, priced by the per-op lowerings, beside the fused forward of the same shape.

Run: .venv/bin/python benchmarks/attention_lowering.py [--quick | --zoo] [--preset trn2] [--dtype float32]

``--zoo`` runs the model zoo's large attention shapes instead (``--zoo --dtype float32``: as the zoo runs them).

``--dtype float32`` is the model zoo's dtype: TensorE runs fp32 at a quarter of its bf16 rate, so
there the kernel is bound by TensorE's own instructions, not the port: "its instructions' ceiling"
is the useful FLOPs' time at peak over TensorE's busy time (what the kernel reaches if TensorE
never waits).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from tilescope.lower import TensorMeta, contiguous_strides
from tilescope.lower._attention import attention_backward, attention_forward, scored_pairs, useful_flops
from tilescope.sim import simulate
from tilescope.spec import preset

SPEC = preset(sys.argv[sys.argv.index("--preset") + 1] if "--preset" in sys.argv else "trn1")
DT = sys.argv[sys.argv.index("--dtype") + 1] if "--dtype" in sys.argv else "bfloat16"

# (name, B, Hq, Hkv, L, E, causal, mask): model-sized heads
SHAPES = [
    ("ViT-B/16", 8, 12, 12, 197, 64, False, None),
    ("BERT-base, padding", 4, 12, 12, 512, 64, False, "row"),
    ("GPT-2 small", 2, 12, 12, 1024, 64, True, None),
    ("GPT-2 medium seq 2048", 1, 16, 16, 2048, 64, True, None),
    ("d=128, seq 2048", 1, 16, 16, 2048, 128, False, None),
    ("Llama GQA 32/8, d=128", 1, 32, 8, 2048, 128, True, None),
]
QUICK = [s for s in SHAPES if s[0] in ("ViT-B/16", "GPT-2 small", "d=128, seq 2048")]
# the model zoo's large configs (examples/models/zoo.py SIZES["large"]): one layer's attention each
ZOO = [
    ("zoo ViT", 4, 3, 3, 197, 64, False, None),
    ("zoo GPT-2", 2, 12, 12, 512, 64, True, None),
    ("zoo Llama GQA 12/4", 2, 12, 4, 512, 64, True, None),
    ("zoo BERT, padding", 2, 12, 12, 512, 64, False, "row"),
    ("zoo nanoGPT", 2, 6, 6, 256, 64, True, None),
]


def meta(shape, dtype=DT):
    return TensorMeta(tuple(shape), contiguous_strides(shape), dtype)


def pe_peak_per_ns(dtype: str) -> float:
    peak = 2 * SPEC.pe_rows * SPEC.pe_cols * SPEC.tensor.clock_ghz
    return peak / SPEC.pe_fp32_slowdown if dtype == "float32" else peak


def dma_peak_per_ns() -> float:
    return min(SPEC.dma.engines * SPEC.dma.bytes_per_ns_per_engine, SPEC.hbm_bytes_per_ns)


def port_floor_ns(n_scores: float, dve_passes: int, act_passes: int) -> float:
    """Score elements through the shared PSUM port: N cycles per instruction per partition [isa]
    (0 where the preset's engines reach PSUM in parallel: then each engine is its own floor)."""
    per_lane = n_scores / SPEC.partitions
    dve, act = per_lane * dve_passes / SPEC.vector.clock_ghz, per_lane * act_passes / SPEC.scalar.clock_ghz
    return dve + act if "psum" in SPEC.shared_ports else max(dve, act)


def psum_port_busy_ns(prog, res) -> float:
    """Busy time of the ScalarE / VectorE instructions that touch PSUM, from the trace."""
    static, tl = prog.static, res.timeline
    touches = np.array(["psum" in m for m in static.memories])[static.sig_id]
    on_port = np.array([n in ("ScalarE", "VectorE") for n in tl.lanes])[tl.lane] & touches[tl.index]
    return float((tl.end_ns[on_port] - tl.start_ns[on_port]).sum())


def row(label, prog, res, flops, nbytes, floor, qk_share, E):
    summary = res.summary
    t = summary.total_ns
    peak = pe_peak_per_ns(DT)
    bound = max(flops / peak, nbytes / dma_peak_per_ns())
    pct = flops / t / peak * 100
    ceiling = flops / max(floor, flops / peak) / peak * 100
    print(f"  {label:4s} {t / 1e3:10.1f} us  bound {bound / 1e3:8.1f} us  x bound {t / bound:5.2f}  "
          f"{pct:5.1f}% PE (useful FLOPs)  port floor {floor / 1e3:8.1f} us (ceiling {ceiling:4.1f}% PE)  bound by {summary.bound_by}")
    port = psum_port_busy_ns(prog, res)
    busy = summary.engine_busy_ns
    rows = min(E, SPEC.pe_rows)
    limited = (flops * qk_share / (peak * rows / SPEC.pe_rows) + flops * (1 - qk_share) / peak)
    if "psum" in SPEC.shared_ports:
        where = (f"PSUM port busy {port / 1e3:8.1f} us ({port / t:4.0%} of the run; score passes at N cycles are "
                 f"{floor / max(port, 1):4.0%} of it)")
    else:  # v3: the two engines reach PSUM in parallel; each is its own floor
        where = f"ScalarE + VectorE on PSUM {port / 1e3:8.1f} us (in parallel on this core)"
    pe_busy = busy.get("TensorE", 0)
    pe_ceiling = flops / peak / pe_busy * 100 if pe_busy else 0.0
    print(f"       trace: {where}  TensorE {pe_busy / 1e3:.1f} (its instructions' ceiling {pe_ceiling:4.1f}% PE)  ScalarE "
          f"{busy.get('ScalarE', 0) / 1e3:.1f}  VectorE {busy.get('VectorE', 0) / 1e3:.1f} us; "
          f"Q K^T uses {rows}/{SPEC.pe_rows} PE rows (row-limited TensorE {limited / 1e3:.1f} us)")
    return t / bound, pct


def fused(name, B, H, Hk, L, E, causal, mask_kind):
    q, kv = meta((B, H, L, E)), meta((B, Hk, L, E))
    # sdpa hands the fused kernel a boolean padding mask as an additive one in the query's dtype
    mask = meta((B, 1, 1, L), DT) if mask_kind == "row" else None
    n = B * H * scored_pairs(L, L, causal)
    t0 = time.perf_counter()
    fwd_prog = attention_forward(q, kv, kv, mask, causal=causal, scale=None, dropout_p=0.0, spec=SPEC)
    fwd = simulate(fwd_prog, SPEC)
    lse = meta((B, H, L), "float32")
    bwd_prog = attention_backward(q, q, kv, kv, q, lse, mask, causal=causal, scale=None, dropout_p=0.0, spec=SPEC)
    bwd = simulate(bwd_prog, SPEC)
    wall = time.perf_counter() - t0
    isz = 4 if DT == "float32" else 2
    io = (2 * B * H * L * E + 2 * B * Hk * L * E) * isz + B * H * L * 4
    print(f"{name}: B={B} H={H}/{Hk} L=S={L} d={E} causal={causal} mask={mask_kind or '-'} "
          f"({fwd.summary.instructions + bwd.summary.instructions} instructions, built+simulated in {wall:.1f} s)")
    fprog, bprog = fwd_prog, bwd_prog
    # shares of the FLOPs whose contraction is the head dim: Q K^T forward; S and dP = dO V^T backward
    f = row("fwd", fprog, fwd, useful_flops(B, H, L, L, E, E, causal), io, port_floor_ns(n, 1, 1), 0.5, E)
    b_ = row("bwd", bprog, bwd, useful_flops(B, H, L, L, E, E, causal, backward=True), 2 * io + 2 * B * H * L * E * isz, port_floor_ns(n, 0, 3), 0.4, E)
    return f, b_


def manual_gpt2(B=1, H=12, L=1024, E=64):
    """HF GPT-2's eager attention on the sim device, op by op (modeled, per-op lowerings)."""
    import torch

    import tilescope.device as dev

    dev.register()
    dev.configure(numerics=False)
    q, k, v = (torch.empty(B, H, L, E, dtype=torch.bfloat16, device="sim") for _ in range(3))
    bias = torch.ones(L, L, dtype=torch.bool, device="sim").tril().view(1, 1, L, L)
    masked = torch.full([], torch.finfo(torch.bfloat16).min, dtype=torch.bfloat16, device="sim")
    torch.sim.synchronize()
    with dev.recording() as recs:
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        w = torch.where(bias, w, masked)
        w = torch.nn.functional.softmax(w, dim=-1)
        out = torch.matmul(w, v)
        torch.sim.synchronize()
    with dev.recording() as frecs:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.sim.synchronize()
    dev.configure(numerics=True)
    total = sum(r.modeled_ns for r in recs if r.kind == "kernel")
    fused_ns = sum(r.modeled_ns for r in frecs if r.kind == "kernel")
    print(f"\nHF GPT-2 eager attention, B={B} H={H} L={L} d={E} bf16 on the sim device (modeled):")
    for r in recs:
        if r.kind == "kernel":
            print(f"  {r.op:28s} {r.lowering:16s} {r.modeled_ns / 1e3:9.1f} us")
    print(f"  total {total / 1e3:.1f} us; sdpa (one fused execution) {fused_ns / 1e3:.1f} us: "
          f"manual / fused = {total / fused_ns:.2f}")
    del out


def main() -> None:
    quick = "--quick" in sys.argv
    print(f"Attention Programs on {SPEC.name}, {DT} (all times modeled); targets: <= 2.00x bound, >= 50% PE\n")
    zoo = "--zoo" in sys.argv
    for shape in ZOO if zoo else QUICK if quick else SHAPES:
        fused(*shape)
    if SPEC.name == "trn1" and not zoo:  # the device runs its default preset
        manual_gpt2(L=512 if quick else 1024)


if __name__ == "__main__":
    main()
