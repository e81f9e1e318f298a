"""Validation errors: each names the values, the limit and the fix."""

import pytest

from tilescope.errors import CapacityError, IndexRangeError, ProgramError, TileLimitError
from tilescope.isa import AP
from tilescope.program import Program, TileBuilder


def test_partition_dim_over_128():
    b = TileBuilder("p")
    with pytest.raises(TileLimitError, match=r"number of partitions 256 .* exceeds the architecture limit of 128"):
        b.sbuf((256, 64), "float32")


def test_psum_tile_wider_than_psum():
    b = TileBuilder("p")
    with pytest.raises(TileLimitError, match=r"needs 32768 bytes per partition.*PSUM holds 16384 bytes per partition"):
        b.psum((128, 8192), "float32")


def test_psum_block_tile_spans_banks_and_each_matmul_stays_in_one():
    b = TileBuilder("p")
    x = b.sbuf((128, 128), "bfloat16")
    y = b.sbuf((128, 512), "bfloat16")
    acc = b.psum((128, 8, 512), "float32")  # eight banks
    b.memset(x, 1.0), b.memset(y, 1.0)
    b.matmul(acc[:, 3, :], x, y)  # one bank: fine
    with pytest.raises(TileLimitError, match=r"spans banks 0\.\.1"):
        b.matmul(AP(acc.name, "float32", 256, ((4096, 128), (1, 512))), x, y)  # bytes 1024..3072


def test_sbuf_capacity_exceeded_by_live_tiles():
    b = TileBuilder("cap")
    tiles = [b.sbuf((128, 16 * 1024), "float32", site=f"s{k}", bufs=1) for k in range(4)]  # 64 KiB each
    for t in tiles:
        b.memset(t, 0.0)
    for t in tiles:  # keep all four alive at once
        b.activation(t, t, "exp")
    with pytest.raises(CapacityError) as e:
        b.build()
    msg = str(e.value)
    assert "SBUF capacity exceeded" in msg
    assert "256 KiB per partition" in msg and "192 KiB per partition on trn1" in msg
    assert "64 KiB" in msg and "bufs" in msg


def test_sequential_tiles_reuse_memory_by_liveness():
    b = TileBuilder("reuse")
    for k in range(6):  # 6 x 64 KiB, never alive together
        t = b.sbuf((128, 16 * 1024), "float32", site=f"s{k}", bufs=1)
        b.memset(t, 0.0)
        b.activation(t, t, "exp")
    prog = b.build()
    assert max(s.addr + s.nbytes for s in prog.slots.values()) <= 192 * 1024
    assert any(s.aliases for s in prog.slots.values())
    prog.validate()


def test_psum_capacity_exceeded():
    b = TileBuilder("psumcap")
    tiles = [b.psum((128, 512), site=f"p{k}", bufs=1) for k in range(9)]
    for t in tiles:
        b.memset(t, 0.0)
    for t in tiles:
        b.activation(t, t, "copy")
    with pytest.raises(CapacityError, match=r"PSUM capacity exceeded.*9 banks.*limit is 8 banks"):
        b.build()


def test_compute_on_hbm_operand():
    b = TileBuilder("hbm")
    x = b.input("x", (128, 64), "float32")
    t = b.sbuf((128, 64), "float32")
    with pytest.raises(ProgramError, match=r"Expected operand 'src' of 'activation' to be in SBUF or PSUM.*HBM tensor 'x'"):
        b.activation(t, x, "exp")


def test_gpsimd_cannot_access_psum():
    # NKI: "Since GpSimd Engine cannot access PSUM, Scalar or Vector Engine must be chosen when the
    # input or output tile is in PSUM"
    b = TileBuilder("gpsimd_psum")
    ps = b.psum((128, 64), "float32")
    t = b.sbuf((128, 64), "float32")
    b.memset(ps, 1.0)
    with pytest.raises(ProgramError, match=r"operand 'src' of tensor_scalar on GpSimd is PSUM tile.*"
                                           r"run the instruction on VectorE or ScalarE"):
        b.tensor_scalar(t, ps, "multiply", 2.0, engine="pool")
    with pytest.raises(ProgramError, match=r"operand 'dst' of tensor_scalar on GpSimd is PSUM tile"):
        b.tensor_scalar(ps, t, "multiply", 2.0, engine="pool")
    b.tensor_scalar(t, ps, "multiply", 2.0)  # VectorE reads PSUM
    b.tensor_scalar(t, t, "multiply", 2.0, engine="pool")  # GpSimd works in SBUF


def test_index_out_of_range():
    b = TileBuilder("oob")
    x = b.input("x", (4000, 8), "float32")
    with pytest.raises(IndexRangeError, match=r"index range \[0, 4095\] exceeds dimension size 4000"):
        x[0:4096]


def test_matmul_limits():
    b = TileBuilder("mm")
    st = b.sbuf((128, 256), "bfloat16")
    mv = b.sbuf((128, 512), "bfloat16")
    acc = b.psum((128, 512))
    with pytest.raises(TileLimitError, match="stationary free size 256 exceeds gemm_stationary_fmax 128"):
        b.matmul(acc, st, mv)
    out = b.sbuf((128, 512), "float32")
    with pytest.raises(ProgramError, match="matmul accumulates into PSUM"):
        b.matmul(out, st[:, :128], mv)


def test_start_partition_rule():
    b = TileBuilder("sp")
    t = b.sbuf((128, 64), "float32")
    b.activation(t[32:64], t[32:64], "exp")  # 32 partitions from 32: allowed
    with pytest.raises(TileLimitError, match="starts at partition 16 with 64 partitions.*must start at partition 0 or 64"):
        b.activation(t[16:80], t[16:80], "exp")


def test_shape_mismatch_names_both_shapes():
    b = TileBuilder("shape")
    t = b.sbuf((128, 64), "float32")
    u = b.sbuf((128, 32), "float32")
    with pytest.raises(ProgramError, match=r"operand 'b' has shape \(128, 32\).*'dst' has \(128, 64\)"):
        b.tensor_tensor(t, t, u, "add")


def test_dma_converts_dtypes_and_checks_sizes():
    # "a cast will happen if the src and dst have different dtype" (nki.isa.dma_copy)
    b = TileBuilder("dt")
    x = b.input("x", (128, 64), "float32")
    t = b.sbuf((128, 64), "bfloat16")
    b.dma_copy(t, x)
    with pytest.raises(ProgramError, match="dma_copy moves 8192 elements"):
        b.dma_copy(b.sbuf((128, 32), "bfloat16"), x)


def test_validate_catches_a_hand_edited_program():
    b = TileBuilder("ok")
    t = b.sbuf((128, 64), "float32")
    b.memset(t, 1.0)
    data = b.build().to_json()
    data["buffers"][0]["shape"] = [256, 64]
    data.pop("hash")
    with pytest.raises(TileLimitError, match="number of partitions 256"):
        Program.from_json(data).validate()
