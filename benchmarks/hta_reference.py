"""HTA's figures for the committed traces: the reference behind the fixed numbers in the tests.

    .venv/bin/python benchmarks/hta_reference.py [--pandas2] [TRACE ...]

Runs HolisticTraceAnalysis 0.5.0 (in the virtualenv ``benchmarks/ingest_vs_hta.py`` creates,
``~/.cache/tilescope/hta-0.5.0-venv``; the tests never need HTA) on each trace -- by default
tests/data/kineto/cuda_trace_diff_control.json.gz and mtia_inference_rank_0.json.gz -- and
prints, as JSON, the analyses tilescope reproduces:

- ``get_temporal_breakdown``, ``get_gpu_kernel_breakdown`` (kernel types and per-name sums),
  ``get_comm_comp_overlap``;
- ``get_cuda_kernel_launch_stats`` (counts and sums of cpu_duration, gpu_duration, launch_delay;
  outliers at HTA's default cutoffs of 50 us launch and 100 us delay);
- ``get_queue_length_summary`` (per stream: count, mean, max) and
  ``get_memory_bw_summary`` (per copy type: count, mean, max);
- ``get_frequent_cuda_kernel_sequences("aten::linear", min_pattern_len=3)``: the top patterns;
- ``critical_path_analysis(annotation="ProfilerStep", instance_id=i)`` for every step i: the
  path's weight, its first and last event, the weight per ``bound_by`` class (needs ``--pandas2``).
  HTA 0.5.0's implementation fails under pandas >= 3 (``np.unique`` on objects); with
  ``--pandas2`` the script runs HTA in a second virtualenv with pandas < 3
  (``~/.cache/tilescope/hta-0.5.0-pandas2-venv``), where it works.

HTA works in whole microseconds (a fractional-microsecond trace is rounded inward: start up,
end down) and filters to the profiler steps; the tests document each place this makes HTA's
number differ from tilescope's exact one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ingest_vs_hta import ensure_hta_venv  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = [os.path.join(ROOT, "tests", "data", "kineto", n)
           for n in ("cuda_trace_diff_control.json.gz", "mtia_inference_rank_0.json.gz")]

_CHILD = textwrap.dedent(r"""
    import json, logging, sys, tempfile, warnings
    logging.disable(logging.WARNING); warnings.filterwarnings("ignore")
    from hta.trace_analysis import TraceAnalysis
    ta = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
    rank = list(ta.t.get_all_traces())[0]
    out = {"rank": int(rank)}
    tb = ta.get_temporal_breakdown(visualize=False)
    out["temporal"] = {c: float(tb[c].iloc[0]) for c in tb.columns if c != "rank"}
    kt, kn = ta.get_gpu_kernel_breakdown(visualize=False, num_kernels=1000, duration_ratio=1.0)
    out["kernel_types"] = {r["kernel_type"]: int(r["sum"]) for _, r in kt.iterrows()}
    out["kernels"] = {r["name"]: [int(r["sum (us)"]), float(r["mean (us)"])] for _, r in kn.iterrows()}
    try:
        cc = ta.get_comm_comp_overlap(visualize=False)
        out["comm_comp_overlap"] = {int(r["rank"]): float(r.iloc[1]) for _, r in cc.iterrows()}
    except Exception as e:
        out["comm_comp_overlap"] = repr(e)
    ls = ta.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)[rank]
    out["launch_stats"] = {"count": len(ls), "cpu_duration": int(ls.cpu_duration.sum()),
                           "gpu_duration": int(ls.gpu_duration.sum()), "launch_delay": int(ls.launch_delay.sum()),
                           "short_kernels": int((ls.gpu_duration < ls.cpu_duration).sum()),
                           "long_launches": int((ls.cpu_duration > 50).sum()),
                           "long_delays": int((ls.launch_delay > 100).sum())}
    ql = ta.get_queue_length_summary(ranks=[rank])
    out["queue_length"] = {} if ql is None else {
        str(int(s)): [int(r[("queue_length", "count")]), float(r[("queue_length", "mean")]), int(r[("queue_length", "max")])]
        for (_, s), r in ql.iterrows()}
    bw = ta.get_memory_bw_summary(ranks=[rank])
    out["memory_bw"] = {} if bw is None else {
        n: [int(r[("memory_bw_gbps", "count")]), float(r[("memory_bw_gbps", "mean")]), float(r[("memory_bw_gbps", "max")])]
        for (_, n), r in bw.iterrows()}
    with tempfile.TemporaryDirectory() as d:
        try:
            fp = ta.get_frequent_cuda_kernel_sequences("aten::linear", d, min_pattern_len=3, rank=rank, top_k=3,
                                                       visualize=False)
            out["sequences"] = [[r["pattern"], int(r["count"]), int(r["GPU kernel duration (us)"]),
                                 int(r["CPU op duration (us)"])] for _, r in fp.head(3).iterrows()]
        except Exception as e:
            out["sequences"] = repr(e)
    # critical_path_analysis per ProfilerStep instance: the path's weight (HTA's length), its
    # first and last node, and the weight per bound_by class (us)
    out["critical_path"] = []
    df, sym = ta.t.get_trace(rank), ta.t.symbol_table.get_sym_table()
    n_steps = sum(1 for n in df["name"].unique() if sym[n].startswith("ProfilerStep#"))
    for inst in range(n_steps):
        try:
            g, ok = ta.critical_path_analysis(rank=rank, annotation="ProfilerStep", instance_id=inst)
            nodes = [g.node_list[n] for n in g.critical_path_nodes]
            bd = g.get_critical_path_breakdown()
            out["critical_path"].append({
                "step": inst, "ok": bool(ok), "weight_us": int(sum(e.weight for e in g.critical_path_edges_set)),
                "first_ts": int(nodes[0].ts), "last_ts": int(nodes[-1].ts),
                "first_event": sym[int(df.loc[nodes[0].ev_idx, "name"])],
                "last_event": sym[int(df.loc[nodes[-1].ev_idx, "name"])],
                "bound_by_us": {k or "(dependency)": int(v) for k, v in bd.groupby("bound_by").duration.sum().items()}})
        except Exception as e:
            out["critical_path"].append({"step": inst, "error": repr(e)})
    print(json.dumps(out))
""")


HTA_PANDAS2_VENV = os.path.join(os.path.expanduser("~"), ".cache", "tilescope", "hta-0.5.0-pandas2-venv")


def ensure_hta_pandas2_venv() -> str:
    """HTA 0.5.0 with pandas < 3 (its frequent-sequence analysis needs it); made once, needs pip."""
    py = os.path.join(HTA_PANDAS2_VENV, "bin", "python")
    if not (os.path.exists(py) and subprocess.run([py, "-c", "import hta"], capture_output=True).returncode == 0):
        print(f"creating {HTA_PANDAS2_VENV} with holistictraceanalysis==0.5.0 and pandas<3 (one-time) ...",
              file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", HTA_PANDAS2_VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "--quiet", "holistictraceanalysis==0.5.0", "pandas<3"], check=True)
    return py


def hta_figures(trace: str, pandas2: bool = False) -> dict:
    """HTA 0.5.0's figures for one trace file (run in HTA's own virtualenv)."""
    py = ensure_hta_pandas2_venv() if pandas2 else ensure_hta_venv()
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(trace, d)
        p = subprocess.run([py, "-c", _CHILD, d], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--pandas2"]
    for trace in args or DEFAULT:
        print(f"== {os.path.basename(trace)}")
        print(json.dumps(hta_figures(trace, pandas2="--pandas2" in sys.argv[1:]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
