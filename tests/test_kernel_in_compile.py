"""Tile kernels called inside torch.compile: traced into the graph as a functional custom op,
each call one device execution."""

import pytest
import torch

import tilescope
import tilescope.device
import tilescope.lang as tl


@pytest.fixture(scope="module", autouse=True)
def sim(sim_virtual):
    """Every test here runs on the sim device, virtual clock (tests/conftest.py)."""


@tilescope.kernel
def double(x):
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm)
    i_p, i_f = tl.mgrid[0:128, 0:x.shape[1]]
    for t in tl.affine_range(x.shape[0] // 128):
        tl.store(out[t * 128 + i_p, i_f], tl.load(x[t * 128 + i_p, i_f]) * 2.0)
    return out


@tilescope.kernel
def add_into(x, out):
    """Stores into an argument, as the classic GIoU kernel does with its output buffer."""
    i_p, i_f = tl.mgrid[0:128, 0:x.shape[1]]
    for t in tl.affine_range(x.shape[0] // 128):
        rows = t * 128 + i_p
        tl.store(out[rows, i_f], tl.load(x[rows, i_f]) + tl.load(out[rows, i_f]))


def test_kernel_is_part_of_the_compiled_graph():
    def f(x):
        return double(x.exp()) + 1

    torch._dynamo.reset()
    graphs = []

    def count_graphs(gm, example_inputs):
        graphs.append(gm)
        from tilescope.compile import tilescope_backend

        return tilescope_backend(gm, example_inputs)

    x = torch.randn(256, 64, device="sim")
    recs = []
    tilescope.device.subscribe(recs.append)
    try:
        y = torch.compile(f, backend=count_graphs)(x)
        torch.sim.synchronize()
    finally:
        tilescope.device.unsubscribe(recs.append)
    assert len(graphs) == 1  # no graph break around the kernel
    assert any("tilescope_kernels.call" in str(n.target) for n in graphs[0].graph.nodes)
    assert [r.op for r in recs].count("kernel::double") == 1
    torch.testing.assert_close(y.cpu(), x.cpu().exp() * 2 + 1)


def test_a_kernel_storing_into_its_argument_is_functionalized():
    def f(x, acc):
        add_into(x, acc)
        return acc * 3

    torch._dynamo.reset()
    x = torch.randn(128, 32)
    acc = torch.randn(128, 32)
    expected_acc = acc + x
    acc_dev = acc.to("sim")
    y = torch.compile(f, backend="tilescope")(x.to("sim"), acc_dev)
    torch.testing.assert_close(acc_dev.cpu(), expected_acc)  # the in-place store is kept
    torch.testing.assert_close(y.cpu(), expected_acc * 3)
