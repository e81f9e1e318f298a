"""Every strictness error of the tile language: its text names the values, the limit and
the fix, its message names the user's file and line, and its traceback ends there
(not inside tilescope)."""

import inspect
import os

import ml_dtypes
import numpy as np
import pytest

import tilescope
import tilescope.isa as nisa
import tilescope.lang as tl
from tilescope.errors import (
    CapacityError, DtypeError, IndexRangeError, KernelError, TileLimitError, TilescopeError,
)

HERE = os.path.basename(__file__)


def marked_line(fn, marker: str = "# <- error") -> int:
    lines, start = inspect.getsourcelines(fn.fn if isinstance(fn, tl.Kernel) else fn)
    hits = [start + k for k, text in enumerate(lines) if marker in text]
    assert len(hits) == 1, f"mark exactly one line with {marker!r}"
    return hits[0]


def check_location(excinfo, line: int) -> str:
    """The message names this file and line; the traceback's last frame is that line."""
    msg = str(excinfo.value)
    assert f"{HERE}:{line}" in msg, msg
    assert "src/tilescope" not in msg and f"tilescope{os.sep}lang" not in msg, msg
    tb = excinfo.tb
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert os.path.basename(tb.tb_frame.f_code.co_filename) == HERE
    assert tb.tb_lineno == line
    return msg


def x32(*shape):
    return np.zeros(shape, np.float32)


# ---- tile limits ---------------------------------------------------------------------

@tilescope.kernel
def too_many_partitions(x):
    t = tl.load(x[0:256, :])  # <- error
    tl.store(x[0:256, :], t)


def test_partition_dim_over_128():
    with pytest.raises(TileLimitError) as e:
        tilescope.simulate(too_many_partitions, x32(256, 64))
    msg = check_location(e, marked_line(too_many_partitions))
    assert "number of partitions 256" in msg and "architecture limit of 128" in msg
    assert "loop over tiles" in msg


@tilescope.kernel
def psum_too_wide(x):
    acc = tl.zeros((128, 8192), tl.float32, buffer=tl.psum)  # <- error
    tl.store(x, tl.copy(acc))


def test_psum_tile_over_all_banks():
    with pytest.raises(TileLimitError) as e:
        tilescope.simulate(psum_too_wide, x32(128, 8192))
    msg = check_location(e, marked_line(psum_too_wide))
    assert "needs 32768 bytes per partition" in msg
    assert "PSUM holds 16384 bytes per partition (8 banks of 2048)" in msg


@tilescope.kernel
def matmul_over_two_banks(a, b, out):
    acc = tl.ndarray((128, 2, 512), tl.float32, buffer=tl.psum)
    at, bt = tl.load(a), tl.load(b)
    acc[:, 0:2, :] = tl.matmul(at, bt.reshape((128, 1024)), transpose_x=True)  # <- error
    tl.store(out, tl.copy(acc[:, 0, :]))


def test_a_matmul_result_stays_in_one_psum_bank():
    with pytest.raises(TileLimitError) as e:
        tilescope.simulate(matmul_over_two_banks, x32(128, 128), x32(128, 2, 512), x32(128, 512))
    msg = check_location(e, marked_line(matmul_over_two_banks))
    assert "spans banks 0..1" in msg and "index one bank of the tile, e.g. t[:, k, :]" in msg


@tilescope.kernel
def gpsimd_reads_psum(a, b, out):
    at, bt = tl.load(a), tl.load(b)
    acc = tl.matmul(at, bt, transpose_x=True)
    tl.store(out, nisa.tensor_copy(acc, engine=nisa.engine.gpsimd))  # <- error


def test_gpsimd_cannot_read_a_psum_tile():
    with pytest.raises(TilescopeError) as e:
        tilescope.simulate(gpsimd_reads_psum, x32(128, 128), x32(128, 512), x32(128, 512))
    msg = check_location(e, marked_line(gpsimd_reads_psum))
    assert "GpSimd cannot access PSUM" in msg and "VectorE or ScalarE" in msg


# ---- capacity --------------------------------------------------------------------------

@tilescope.kernel(spill=False)  # strict: no spills to HBM
def keeps_every_tile(x, out):
    tiles = []
    for i in tl.affine_range(x.shape[0] // 128):
        tiles.append(tl.load(x[i * 128:(i + 1) * 128, :]))  # <- error
    total = tiles[0]
    for t in tiles[1:]:
        total = total + t
    tl.store(out, total)


def test_sbuf_capacity_exceeded_by_live_tiles_names_the_numbers():
    # 100 live tiles of [128, 512] fp32 = 2 KiB per partition each: 200 KiB > 192 KiB
    with pytest.raises(CapacityError) as e:
        tilescope.simulate(keeps_every_tile, x32(100 * 128, 512), x32(128, 512))
    msg = check_location(e, marked_line(keeps_every_tile))
    assert "SBUF capacity exceeded" in msg
    assert "the limit is 192 KiB per partition on trn1" in msg
    assert f"{HERE}:{marked_line(keeps_every_tile)}" in msg.split("Live tiles by allocation site:")[1]
    assert "x 2 KiB" in msg and "Fix:" in msg and "spill=True" in msg


@tilescope.kernel
def nine_accumulators(a, b, out):
    ta, tb = tl.load(a), tl.load(b)
    accs = [tl.matmul(ta, tb, transpose_x=True) for _ in range(9)]  # <- error
    total = tl.copy(accs[0])
    for acc in accs[1:]:
        total = total + acc
    tl.store(out, total)


def test_psum_capacity_exceeded_names_banks():
    with pytest.raises(CapacityError) as e:
        tilescope.simulate(nine_accumulators, x32(128, 128), x32(128, 512), x32(128, 512))
    msg = check_location(e, marked_line(nine_accumulators))
    assert "PSUM capacity exceeded" in msg and "live tiles need 9 banks" in msg and "the limit is 8 banks" in msg


def test_rotation_gives_way_before_capacity_fails():
    """Three rotating buffers of a big site do not fit; fewer do: the kernel runs, no spill."""

    @tilescope.kernel
    def big_tiles(x, out):
        for i in tl.affine_range(x.shape[0] // 128):
            t = tl.load(x[i * 128:(i + 1) * 128, :])  # 80 KiB per partition
            tl.store(out[i * 128:(i + 1) * 128, :], t + 1.0)

    x = np.ones((4 * 128, 20 * 1024), np.float32)
    out = np.zeros_like(x)
    r = tilescope.simulate(big_tiles, x, out)
    assert (out == 2.0).all()
    assert "spills" not in r.program.meta


# ---- indices --------------------------------------------------------------------------------

@tilescope.kernel
def reads_past_the_end(x, out):
    i_p, i_f = tl.mgrid[0:128, 0:512]
    for i in tl.affine_range(32):
        t = tl.load(x[i * 128 + i_p, i_f])  # <- error
        tl.store(out[i * 128 + i_p, i_f], t, mask=(i * 128 + i_p < 4000))


def test_out_of_bounds_index_range():
    with pytest.raises(IndexRangeError) as e:
        tilescope.simulate(reads_past_the_end, x32(4000, 512), x32(4000, 512))
    msg = check_location(e, marked_line(reads_past_the_end))
    assert "index range [3968, 4095] exceeds dimension size 4000" in msg
    assert "mask" in msg


@tilescope.kernel
def slices_past_the_end(x):
    t = tl.load(x[0:4096, 0:8])  # <- error
    tl.store(x[0:128, 0:8], t)


def test_out_of_bounds_slice():
    with pytest.raises(IndexRangeError) as e:
        tilescope.simulate(slices_past_the_end, x32(4000, 8))
    msg = check_location(e, marked_line(slices_past_the_end))
    assert "index range [0, 4095] exceeds dimension size 4000" in msg


@tilescope.kernel
def masked_tail(x, out):
    i_p, i_f = tl.mgrid[0:128, 0:512]
    for i in tl.affine_range(32):
        rows = i * 128 + i_p
        tl.store(out[rows, i_f], tl.load(x[rows, i_f], mask=(rows < 4000)) * 2.0, mask=(rows < 4000))


def test_the_mask_makes_the_same_access_legal():
    x = np.random.default_rng(0).standard_normal((4000, 512), dtype=np.float32)
    out = np.zeros_like(x)
    tilescope.simulate(masked_tail, x, out)
    np.testing.assert_array_equal(out, x * 2)


# ---- operand kinds -------------------------------------------------------------------------------

@tilescope.kernel
def exp_of_hbm(x):
    y = tl.exp(x)  # <- error
    tl.store(x, y)


def test_compute_on_hbm_operand():
    with pytest.raises(KernelError) as e:
        tilescope.simulate(exp_of_hbm, x32(128, 64))
    msg = check_location(e, marked_line(exp_of_hbm))
    assert "Expected operand 'data' of 'exp' to be in SBUF or PSUM, but got HBM tensor 'x'" in msg
    assert "tl.load" in msg


@tilescope.kernel
def add_to_hbm(x):
    t = tl.load(x)
    tl.store(x, t + x)  # <- error


def test_operator_on_hbm_operand():
    with pytest.raises(KernelError) as e:
        tilescope.simulate(add_to_hbm, x32(128, 64))
    msg = check_location(e, marked_line(add_to_hbm))
    assert "Expected operand 'y' of 'add' to be in SBUF or PSUM, but got HBM tensor 'x'" in msg


@tilescope.kernel
def load_from_tile(x):
    t = tl.load(x)
    u = tl.load(t)  # <- error
    tl.store(x, u)


def test_load_from_a_tile():
    with pytest.raises(KernelError) as e:
        tilescope.simulate(load_from_tile, x32(128, 64))
    msg = check_location(e, marked_line(load_from_tile))
    assert "Expected operand 'src' of 'load' to be in address space 'hbm', but got a tile in 'sbuf'" in msg


@tilescope.kernel
def reduce_partitions(x, out):
    t = tl.load(x)
    s = tl.sum(t, axis=0)  # <- error
    tl.store(out, s)


def test_reduction_over_the_partition_dim():
    with pytest.raises(KernelError) as e:
        tilescope.simulate(reduce_partitions, x32(128, 64), x32(64,))
    msg = check_location(e, marked_line(reduce_partitions))
    assert "axis 0 (the partition dim)" in msg and "tl.transpose" in msg


@tilescope.kernel
def branches_on_data(x):
    t = tl.load(x)
    if t > 0:  # <- error
        tl.store(x, t)


def test_python_control_flow_on_tile_values():
    with pytest.raises(KernelError) as e:
        tilescope.simulate(branches_on_data, x32(128, 8))
    msg = check_location(e, marked_line(branches_on_data))
    assert "tl.where" in msg


@tilescope.kernel
def union_mask(x):
    i_p, i_f = tl.mgrid[0:128, 0:8]
    t = tl.load(x[i_p, i_f], mask=(i_p < 4) | (i_p > 100))  # <- error
    tl.store(x[i_p, i_f], t)


def test_mask_must_be_a_box():
    with pytest.raises(KernelError) as e:
        tilescope.simulate(union_mask, x32(128, 8))
    check_location(e, marked_line(union_mask))


# ---- dtypes --------------------------------------------------------------------------------------

@tilescope.kernel
def mixed_matmul(a, b, out):
    acc = tl.matmul(tl.load(a), tl.load(b), transpose_x=True)  # <- error
    tl.store(out, tl.copy(acc))


def test_matmul_dtype_mismatch():
    with pytest.raises(DtypeError) as e:
        tilescope.simulate(mixed_matmul, np.zeros((128, 128), ml_dtypes.bfloat16), x32(128, 512), x32(128, 512))
    msg = check_location(e, marked_line(mixed_matmul))
    assert "operand dtypes differ (x bfloat16, y float32)" in msg and "tl.copy(t, dtype=...)" in msg


def test_unsupported_argument_dtype():
    @tilescope.kernel
    def k(x):
        tl.store(x, tl.load(x))

    with pytest.raises(DtypeError, match="argument 'x' has dtype float64.*astype"):
        tilescope.simulate(k, np.zeros((128, 4)))


# ---- outside a kernel ---------------------------------------------------------------------------

def test_language_call_outside_a_kernel():
    with pytest.raises(KernelError) as e:
        tl.zeros((128, 64), tl.float32)  # <- error
    msg = str(e.value)
    assert "tl.zeros() was called outside a tile kernel" in msg and "@tilescope.kernel" in msg
    assert f"{HERE}:{marked_line(test_language_call_outside_a_kernel)}" in msg


def test_isa_call_outside_a_kernel():
    with pytest.raises(KernelError, match=r"isa.memset\(\) was called outside a tile kernel"):
        nisa.memset((128, 4), 0.0, tl.float32)


def test_calling_a_kernel_directly_says_how_to_run_it():
    @tilescope.kernel
    def k(x):
        tl.store(x, tl.load(x))

    with pytest.raises(KernelError, match=r"tilescope.simulate\(k, \*arrays\)"):
        k(x32(128, 4))


def test_a_tile_kept_after_the_kernel_returned():
    kept = []

    @tilescope.kernel
    def k(x):
        t = tl.load(x)
        kept.append(t)
        tl.store(x, t)

    tilescope.simulate(k, x32(128, 4))
    with pytest.raises(KernelError, match="outside a tile kernel"):
        kept[0] + 1.0


def test_errors_are_tilescope_errors():
    for cls in (TileLimitError, CapacityError, IndexRangeError, KernelError, DtypeError):
        assert issubclass(cls, TilescopeError)


# ---- arguments from torch ------------------------------------------------------------

@tilescope.kernel
def doubled(x, o):
    tl.store(o, tl.load(x) * 2)


def test_torch_arguments_get_torch_fixes():
    """simulate() takes numpy arrays: a torch tensor is named as one, with the conversion (or
    the device call) to use; an unsupported torch dtype's fix is torch's cast, not numpy's."""
    import torch

    with pytest.raises(KernelError, match=r"argument 'x' is a torch tensor on cpu; simulate\(\) takes numpy arrays: "
                                          r"pass x.cpu\(\).numpy\(\)"):
        tilescope.simulate(doubled, torch.zeros(4, 8), x32(4, 8))
    with pytest.raises(DtypeError, match=r"dtype torch.float64, .* \(e.g. x.float\(\)\)"):
        tilescope.simulate(doubled, torch.zeros(4, 8, dtype=torch.float64), x32(4, 8))
    with pytest.raises(DtypeError, match=r"dtype float64, .* \(e.g. x.astype\(np.float32\)\)"):
        tilescope.simulate(doubled, np.zeros((4, 8)), x32(4, 8))


def test_a_kernel_called_on_device_tensors_fails_at_the_users_line():
    """The same error through the sim device's call path (kernel(x) on device tensors) as
    through simulate(): its traceback ends at the kernel's own line."""
    import torch

    import tilescope.device as dev

    dev.register()
    with pytest.raises(TileLimitError) as info:
        too_many_partitions(torch.zeros(256, 64, device="sim"))
    check_location(info, marked_line(too_many_partitions))
