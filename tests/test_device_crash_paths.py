"""Paths known to kill a process with a Python-only PrivateUse1 device, each run in a
subprocess: it must finish with the right values (or a clear Python error), never die."""

import os
import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import copy, io, os, sys, tempfile
import torch
import tilescope.device
tilescope.device.register()
"""

CASES = {
    "untyped_storage": """
        s = torch.UntypedStorage(16, device="sim")
        assert s.device.type == "sim" and s.nbytes() == 16
        s.copy_(torch.arange(4, dtype=torch.float32).untyped_storage())
        t = torch.empty(0, device="sim").set_(s, 0, (4,), (1,))
        assert t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
        assert s.cpu().nbytes() == 16
    """,
    "deepcopy": """
        x = torch.randn(3, 4, device="sim")
        y = copy.deepcopy(x)
        assert y.device == x.device and y.data_ptr() != x.data_ptr() and torch.equal(y.cpu(), x.cpu())
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).to("sim")
        m2 = copy.deepcopy(m)
        assert torch.equal(m2[0].weight.cpu(), m[0].weight.cpu())
    """,
    "save_load": """
        m = torch.nn.Linear(5, 3)
        buf = io.BytesIO(); torch.save(m.state_dict(), buf); buf.seek(0)
        sd = torch.load(buf, map_location="sim")
        assert sd["weight"].device.type == "sim" and torch.equal(sd["weight"].cpu(), m.weight)
        buf = io.BytesIO(); torch.save({"t": sd["weight"] * 2}, buf); buf.seek(0)   # saved from the device
        back = torch.load(buf)
        assert back["t"].device.type == "sim" and torch.allclose(back["t"].cpu(), m.weight * 2)
        buf.seek(0)
        assert torch.load(buf, map_location="cpu")["t"].device.type == "cpu"
    """,
    "pin_memory": """
        x = torch.randn(1000)
        p = x.pin_memory()
        assert p.is_pinned() and not x.is_pinned() and torch.equal(p, x)
        d = p.to("sim", non_blocking=True)
        torch.sim.synchronize()
        assert torch.equal(d.cpu(), x)
    """,
    "non_blocking_copies": """
        x = torch.randn(256, 256)
        d = x.to("sim", non_blocking=True)       # pageable source: staged, so changing x later is safe
        x2 = x.clone(); x.zero_()
        h = (d * 2).to("cpu", non_blocking=True)
        torch.sim.synchronize()
        assert torch.equal(h, x2 * 2)
        h2 = torch.empty(256, 256).pin_memory()
        h2.copy_(d, non_blocking=True)
        torch.sim.synchronize()
        assert torch.equal(h2, x2)
    """,
    "generator": """
        g = torch.Generator(device="sim")
        assert g.device.type == "sim"
        g.manual_seed(3)
        a = torch.randn(10, device="sim", generator=g)
        g.manual_seed(3)
        b = torch.randn(10, device="sim", generator=g)
        assert torch.equal(a.cpu(), b.cpu())
        with torch.random.fork_rng(device_type="sim"):
            torch.randn(3, device="sim")
    """,
    "dataloader_workers": """
        from torch.utils.data import DataLoader, TensorDataset
        x = torch.randn(64, 8); y = torch.randn(64, 1)
        d = torch.sim.synchronize  # the device is in use before the workers fork
        w = torch.randn(8, 1, device="sim"); d()
        total = torch.zeros(1, device="sim")
        for pin in (False, True):
            loader = DataLoader(TensorDataset(x, y), batch_size=16, num_workers=2, pin_memory=pin)
            for xb, yb in loader:
                total += ((xb.to("sim") @ w - yb.to("sim")) ** 2).sum()
        ref = 2 * (((x @ w.cpu()) - y) ** 2).sum()
        assert torch.allclose(total.cpu(), ref.reshape(1), rtol=1e-4), (total, ref)
    """,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_path_survives_in_a_subprocess(name):
    code = PRELUDE + textwrap.dedent(CASES[name]) + "\nprint('OK')\n"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), (
        f"{name}: exit code {proc.returncode}\n--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n{proc.stderr[-4000:]}")
