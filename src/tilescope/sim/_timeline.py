"""The modeled instruction trace of one Program run, and its summary.

Every figure here comes from the device model and is labelled *modeled*.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

__all__ = ["Timeline", "Summary", "SimResult", "LANE_GROUPS"]

# lane name prefix -> engine group shown in summaries
LANE_GROUPS = ("TensorE", "ScalarE", "VectorE", "GpSimd", "DMA")


@dataclass(frozen=True)
class Timeline:
    """Columnar trace: one row per instruction (plus one per LoadStationary).

    Columns are numpy arrays of equal length; ``lanes`` names the lane ids.
    Times are nanoseconds from the start of the execution (modeled).
    """

    index: np.ndarray  # instruction index in the Program
    lane: np.ndarray  # lane id (see ``lanes``)
    start_ns: np.ndarray
    end_ns: np.ndarray
    nbytes: np.ndarray  # bytes moved (DMA) or touched (compute)
    flops: np.ndarray
    prov: np.ndarray  # provenance index in the Program
    kind: np.ndarray  # instruction kind id (see ``kinds``)
    lanes: tuple[str, ...]
    kinds: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.index)

    def lane_name(self, row: int) -> str:
        return self.lanes[int(self.lane[row])]

    def rows(self, program=None) -> list[dict]:
        """The trace as a list of dicts (for JSON export and display)."""
        out = []
        for r in range(len(self.index)):
            d = {
                "index": int(self.index[r]),
                "lane": self.lanes[int(self.lane[r])],
                "kind": self.kinds[int(self.kind[r])],
                "start_ns": float(self.start_ns[r]),
                "end_ns": float(self.end_ns[r]),
                "bytes": int(self.nbytes[r]),
                "flops": float(self.flops[r]),
                "prov": int(self.prov[r]),
            }
            if program is not None:
                d["source"] = program.prov_of(int(self.index[r])).describe()
            out.append(d)
        return out

    def by_instruction(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) per instruction index, LoadStationary rows excluded."""
        main = np.array([k != "load_stationary" for k in self.kinds])[self.kind]
        order = np.argsort(self.index[main], kind="stable")
        return self.start_ns[main][order], self.end_ns[main][order]

    def text(self, width: int = 72, collapse_dma: bool = True) -> str:
        """A plain-text Gantt chart, one line per lane (DMA queues merged by default)."""
        total = float(self.end_ns.max()) if len(self) else 0.0
        lines = [f"modeled timeline, {total / 1000:.2f} us total ('#' busy, '+' partly, '.' idle)"]
        if total <= 0:
            return lines[0]
        groups: dict[str, list[int]] = {}
        for lane in sorted(set(self.lane.tolist())):
            name = self.lanes[lane]
            if collapse_dma and name.startswith("DMA."):
                name = "DMA (any queue)"
            groups.setdefault(name, []).append(lane)
        name_w = max(len(n) for n in groups)
        for name, ids in groups.items():
            cells = [0.0] * width
            sel = np.isin(self.lane, ids)
            for s, e in zip(self.start_ns[sel], self.end_ns[sel]):
                a = s / total * width
                b = e / total * width
                for c in range(int(a), min(width, int(np.ceil(b)))):
                    cells[c] += min(b, c + 1) - max(a, c)
            bar = "".join("#" if v > 0.5 else ("+" if v > 0.05 else ".") for v in cells)
            lines.append(f"{name:<{name_w}} |{bar}|")
        return "\n".join(lines)


@dataclass(frozen=True)
class Summary:
    """Whole-run figures of one modeled execution (all *modeled*)."""

    program: str
    program_hash: str
    preset: str
    total_ns: float
    instructions: int
    engine_busy_ns: dict[str, float]
    utilization: dict[str, float]
    dma_bytes: int
    hbm_read_bytes: int
    hbm_write_bytes: int
    dma_transfers: int
    flops: float
    tensor_flops: float
    peak_flops: float
    hbm_bytes_per_ns: float
    modeled: bool = True
    notes: tuple[str, ...] = field(default=())

    @property
    def total_us(self) -> float:
        return self.total_ns / 1000.0

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_read_bytes + self.hbm_write_bytes

    @property
    def achieved_gbps(self) -> float:
        """HBM traffic over the run (GB/s == B/ns)."""
        return self.hbm_bytes / self.total_ns if self.total_ns else 0.0

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte of HBM traffic."""
        return self.flops / self.hbm_bytes if self.hbm_bytes else float("inf")

    @property
    def mfu(self) -> float:
        """TensorE FLOPs over peak for the run's duration."""
        return self.tensor_flops / (self.peak_flops * self.total_ns * 1e-9) if self.total_ns else 0.0

    @property
    def mbu(self) -> float:
        """HBM bandwidth used over the core's HBM bandwidth."""
        return self.achieved_gbps / self.hbm_bytes_per_ns if self.hbm_bytes_per_ns else 0.0

    @property
    def average_dma_bytes(self) -> float:
        return self.dma_bytes / self.dma_transfers if self.dma_transfers else 0.0

    @property
    def bound_by(self) -> str:
        """The engine group busiest over the run."""
        if not self.engine_busy_ns:
            return "-"
        return max(self.engine_busy_ns, key=lambda engine: self.engine_busy_ns[engine])

    def to_dict(self) -> dict:
        cached = self.__dict__.get("_as_dict")
        if cached is not None:
            return dict(cached)
        # the fields are flat (numbers, strings, two str -> float dicts): asdict's deep copy
        # of every value is not needed, and a profile's export reads thousands of summaries
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["engine_busy_ns"], d["utilization"] = dict(self.engine_busy_ns), dict(self.utilization)
        d.update(
            total_us=self.total_us, achieved_gbps=self.achieved_gbps,
            arithmetic_intensity=self.arithmetic_intensity, mfu=self.mfu, mbu=self.mbu,
            average_dma_bytes=self.average_dma_bytes, bound_by=self.bound_by,
        )
        d["notes"] = list(self.notes)
        object.__setattr__(self, "_as_dict", d)  # immutable: compute once
        return dict(d)

    def table(self):
        """A rich Table of the summary."""
        from rich.table import Table

        from rich.markup import escape

        t = Table(title=escape(f"{self.program} on {self.preset} (modeled)"), show_header=True)
        t.add_column("metric")
        t.add_column("value (modeled)", justify="right")
        t.add_row("total time", f"{self.total_us:,.2f} us")
        t.add_row("instructions", f"{self.instructions:,}")
        for eng in LANE_GROUPS:
            if eng in self.engine_busy_ns:
                t.add_row(f"{eng} busy", f"{self.engine_busy_ns[eng] / 1000:,.2f} us ({self.utilization[eng]:.0%})")
        t.add_row("HBM traffic", f"{self.hbm_bytes / 1e6:,.3f} MB ({self.achieved_gbps:,.1f} GB/s, MBU {self.mbu:.0%})")
        t.add_row("DMA transfers", f"{self.dma_transfers:,} (avg {self.average_dma_bytes / 1024:,.1f} KiB)")
        t.add_row("FLOPs", f"{self.flops:,.0f} (TensorE MFU {self.mfu:.1%})")
        ai = self.arithmetic_intensity
        t.add_row("arithmetic intensity", "inf" if ai == float("inf") else f"{ai:,.2f} FLOP/B")
        t.add_row("bound by", self.bound_by)
        return t

    def __str__(self) -> str:
        busy = ", ".join(f"{k} {v / 1000:.2f} us" for k, v in self.engine_busy_ns.items())
        return (
            f"{self.program} on {self.preset}: {self.total_us:.2f} us modeled, "
            f"{self.instructions} instructions; busy: {busy}; HBM {self.hbm_bytes / 1e6:.3f} MB "
            f"at {self.achieved_gbps:.1f} GB/s; bound by {self.bound_by}"
        )


@dataclass(frozen=True)
class SimResult:
    """What the simulator returns: the trace and its summary."""

    timeline: Timeline
    summary: Summary
