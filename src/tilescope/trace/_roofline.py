"""Roofline, MFU, MBU and % of peak per op (CUDA/ROCm: FLOPs and bytes estimated from shapes)
or per executable (tilescope: from the Program's modeled summary).

Peaks are data: :data:`GPU_PEAKS` for named GPUs, the preset for tilescope's device.
"""

from __future__ import annotations

import json
from math import prod

import pyarrow as pa

__all__ = ["GPU_PEAKS", "gpu_peak", "estimate_op", "roofline"]

# (substring of the device name, dense 16-bit tensor TFLOP/s, FP32 TFLOP/s, memory GB/s, source,
#  dense TF32 tensor TFLOP/s or None where the GPU has no TF32 path) -- datasheet figures; the
#  TF32 ones are the datasheets' "with sparsity" figures halved where only those are given
GPU_PEAKS = (
    ("H200", 989.0, 67.0, 4800.0, "NVIDIA H200 SXM datasheet", 494.5),
    ("H100", 989.0, 67.0, 3350.0, "NVIDIA H100 SXM datasheet", 494.5),
    ("A100-SXM4-80GB", 312.0, 19.5, 2039.0, "NVIDIA A100 datasheet (80 GB SXM)", 156.0),
    ("A100", 312.0, 19.5, 1555.0, "NVIDIA A100 datasheet (40 GB SXM)", 156.0),
    ("V100", 125.0, 15.7, 900.0, "NVIDIA V100 SXM2 datasheet", None),
    ("L4", 121.0, 30.3, 300.0, "NVIDIA L4 datasheet", 60.0),
    ("MI300X", 1307.4, 163.4, 5300.0, "AMD Instinct MI300X data sheet", 653.7),
    ("MI250X", 383.0, 47.9, 3276.8, "AMD Instinct MI250X data sheet", None),
    ("MI250", 362.1, 45.3, 3276.8, "AMD Instinct MI250 data sheet", None),
)

_ITEMSIZE = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "long int": 8, "int": 4,
             "float16": 2, "bfloat16": 2, "float32": 4, "bool": 1, "unsigned char": 1, "signed char": 1}
_ELEMENTWISE = {"aten::add", "aten::add_", "aten::sub", "aten::mul", "aten::mul_", "aten::div", "aten::relu",
                "aten::relu_", "aten::sigmoid", "aten::tanh", "aten::gelu", "aten::silu", "aten::exp", "aten::pow",
                "aten::rsqrt", "aten::sqrt", "aten::neg", "aten::threshold_backward"}
# ops that move data and compute nothing: (inputs read, by index) -- fill_ writes its tensor
# without reading it, copy_ reads its source (input 1) into its destination (input 0)
_MOVES = {"aten::fill_": (), "aten::zero_": (), "aten::copy_": (1,)}


def gpu_peak(device_name: str):
    """(name pattern, tensor TFLOP/s, fp32 TFLOP/s, GB/s, source) for a device name, or None."""
    for row in GPU_PEAKS:
        if row[0].lower() in (device_name or "").lower():
            return row
    return None


def _mm(dims, a, b):
    if len(dims) <= max(a, b) or len(dims[a]) < 2 or len(dims[b]) < 2:
        return None
    m, k = dims[a][-2], dims[a][-1]
    n = dims[b][-1]
    batch = prod(dims[a][:-2]) if len(dims[a]) > 2 else 1
    return 2 * batch * m * k * n, batch * m * n


def estimate_op(name: str, dims, types) -> tuple[float, float] | None:
    """(FLOPs, bytes) of one aten op from its input shapes, or None if no rule applies.

    >>> estimate_op("aten::mm", [[64, 128], [128, 32]], ["float", "float"])  # 2*M*K*N, fp32 in + out
    (524288, 57344)
    >>> estimate_op("aten::fill_", [[1024], []], ["float", "Scalar"])  # written, never read
    (0.0, 4096.0)
    >>> estimate_op("aten::copy_", [[1024], [1024]], ["float", "c10::BFloat16"])  # bf16 read, fp32 written
    (0.0, 6144.0)
    """
    if not isinstance(dims, list) or not dims:
        return None
    dims = [d if isinstance(d, list) and all(isinstance(x, int) for x in d) else [] for d in dims]
    types = types if isinstance(types, list) else []
    size = [_ITEMSIZE.get(types[i] if i < len(types) else "float", 4) for i in range(len(dims))]
    in_bytes = sum(prod(d) * s for d, s in zip(dims, size) if d)
    r = None
    if name in ("aten::mm", "aten::bmm", "aten::matmul"):
        r = _mm(dims, 0, 1)
    elif name in ("aten::addmm", "aten::baddbmm"):
        r = _mm(dims, 1, 2)
    elif name == "aten::linear" and len(dims) >= 2 and dims[0] and len(dims[1]) == 2:
        k, n = dims[1][1], dims[1][0]
        rows = prod(dims[0][:-1])
        r = (2 * rows * k * n, rows * n)
    elif name in _ELEMENTWISE and dims[0]:
        out = max(prod(d) for d in dims if d)
        return float(out), float(in_bytes + out * size[0])
    elif name in _MOVES and dims[0]:
        read = sum(prod(dims[i]) * size[i] for i in _MOVES[name] if i < len(dims) and dims[i])
        return 0.0, float(read + prod(dims[0]) * size[0])
    if r is None:
        return None
    flops, out = r
    return flops, in_bytes + out * size[0]


_FP32 = {"float", "float32", "double", "float64"}  # Kineto's "Input type" names of full-precision floats


def _precision(types) -> str:
    """``fp32`` when the op's first input is a full-precision float, else ``16-bit`` (the
    tensor cores' peak applies). An fp32 op measured faster than the FP32 peak ran as TF32 on the
    tensor cores (``allow_tf32``): :func:`roofline` then uses the TF32 peak.

    >>> _precision(["float", "float"]), _precision(["c10::BFloat16"]), _precision(None)
    ('fp32', '16-bit', 'fp32')
    """
    first = types[0] if isinstance(types, list) and types else "float"
    return "fp32" if first in _FP32 else "16-bit"


def _rank_peaks(trace) -> dict:
    """rank -> the ``GPU_PEAKS`` row of the first device its trace names (absent: unknown)."""
    out = {}
    for rank, meta in zip(trace.ranks, trace.meta):
        for d in (meta.get("trace_metadata") or {}).get("deviceProperties") or []:
            row = gpu_peak(d.get("name", "")) if isinstance(d, dict) else None
            if row:
                out[rank] = row
                break
    return out


def roofline(trace, *, peak_tflops: float | None = None, peak_gbps: float | None = None):
    """Per op (Kineto) or per executable (tilescope): FLOPs, bytes, time, AI, MFU, MBU, % of roofline."""
    if trace.con.execute("SELECT count(*) FROM executables").fetchall()[0][0]:
        return _roofline_programs(trace)
    from ._nesting import ensure_hierarchy

    ensure_hierarchy(trace)
    peaks = _rank_peaks(trace)  # each rank against its own GPU (a report may hold an A100 and a V100)
    rows = trace.sql("""
        SELECT e.rank, e.name, json_extract(e.args, '$."Input Dims"')::VARCHAR AS dims,
               json_extract(e.args, '$."Input type"')::VARCHAR AS types, count(*) AS calls,
               sum(h.dev_self_ns) AS dev_ns
        FROM events e JOIN _hier h USING (eid)
        WHERE e.kind = 'op' AND h.dev_self_ns > 0 GROUP BY ALL""").fetchall()
    agg: dict[tuple, list] = {}
    for rank, name, dims, types, calls, dev in rows:
        types = json.loads(types) if types else None
        est = estimate_op(name, json.loads(dims) if dims else None, types)
        if est is None:
            continue
        a = agg.setdefault((name, _precision(types), peaks.get(rank)), [0, 0.0, 0.0, 0])
        a[0] += calls
        a[1] += est[0] * calls
        a[2] += est[1] * calls
        a[3] += dev
    out = {k: [] for k in ("name", "precision", "calls", "flops", "bytes", "device_ns", "tflops", "gbps",
                           "intensity", "mfu", "mbu", "pct_of_roofline", "peak_source", "estimated")}
    for (name, precision, peak), (calls, fl, by, dev) in sorted(agg.items(), key=lambda kv: -kv[1][3]):
        # the compute peak of the op's precision: an fp32 matmul against the FP32 peak, not the tensor cores'
        pf = peak_tflops or (peak[2 if precision == "fp32" else 1] if peak else None)
        pb = peak_gbps or (peak[3] if peak else None)
        sec = dev * 1e-9
        tf = fl / sec / 1e12 if sec else 0.0
        if precision == "fp32" and not peak_tflops and peak and peak[5] and tf > peak[2]:
            # faster than the GPU's FP32 units can go: its matmuls ran on the TF32 tensor cores
            precision, pf = "tf32 (inferred)", peak[5]
        gb = by / sec / 1e9 if sec else 0.0
        ai = fl / by if by else 0.0
        attain = min(pf, ai * pb / 1e3) if pf and pb else None
        out["name"].append(name)
        out["precision"].append(precision)
        out["calls"].append(calls)
        out["flops"].append(fl)
        out["bytes"].append(by)
        out["device_ns"].append(dev)
        out["tflops"].append(tf)
        out["gbps"].append(gb)
        out["intensity"].append(ai)
        out["mfu"].append(tf / pf if pf else None)
        out["mbu"].append(gb / pb if pb else None)
        out["pct_of_roofline"].append(tf / attain if attain else None)
        out["peak_source"].append(peak[4] if peak and not peak_tflops else ("given" if pf else "unknown device"))
        out["estimated"].append(True)
    return pa.table(out)


def _roofline_programs(trace):
    from ..spec import preset

    spec = preset(trace.preset_name())  # None: the spec's default preset
    name = spec.name
    pf = spec.peak_flops() / 1e12
    pb = spec.hbm_bytes_per_ns
    rows = trace.sql("""
        SELECT x.program_hash, x.name, x.flops, x.hbm_bytes, count(e.eid) AS executions,
               coalesce(sum(e.dur_ns), 0) AS dev_ns, x.modeled_ns
        FROM executables x LEFT JOIN events e ON e.program_hash = x.program_hash AND e.cat = 'hardware'
        GROUP BY ALL ORDER BY dev_ns DESC""").fetchall()
    out = {k: [] for k in ("program_hash", "name", "executions", "flops", "bytes", "device_ns", "tflops", "gbps",
                           "intensity", "mfu", "mbu", "pct_of_roofline", "peak_source", "modeled")}
    for h, nm, fl, by, n, dev, mod in rows:
        n = max(n, 1) if dev == 0 else n
        dev = dev if dev else (mod or 0) * n
        fl_t, by_t = (fl or 0.0) * n, (by or 0) * n
        sec = dev * 1e-9
        tf = fl_t / sec / 1e12 if sec else 0.0
        gb = by_t / sec / 1e9 if sec else 0.0
        ai = fl_t / by_t if by_t else 0.0
        attain = min(pf, ai * pb / 1e3)
        for k, v in (("program_hash", h), ("name", nm), ("executions", n), ("flops", fl_t), ("bytes", by_t),
                     ("device_ns", dev), ("tflops", tf), ("gbps", gb), ("intensity", ai), ("mfu", tf / pf),
                     ("mbu", gb / pb if pb else None), ("pct_of_roofline", tf / attain if attain else None),
                     ("peak_source", f"preset {name}"), ("modeled", True)):
            out[k].append(v)
    return pa.table(out)
