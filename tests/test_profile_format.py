"""The profile directory: atomic writing, completeness, checksums, pairs."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tilescope.profiler import (
    IncompleteProfileError, ProfileFormatError, ProfileWriter, find_profiles, read_profile,
    write_kernel_profile,
)
from tilescope.profiler import itrace_name
from tilescope.program import TileBuilder
from tilescope.sim import simulate


def _program():
    b = TileBuilder("k")
    x = b.input("x", (128, 64), "float32")
    y = b.output("y", (128, 64), "float32")
    t = b.sbuf((128, 64), "float32")
    b.dma_copy(t, x)
    b.activation(t, t, "exp")
    b.dma_copy(y, t)
    return b.build()


def test_kernel_profile_is_complete_and_pairs_match(tmp_path):
    prog = _program()
    path = write_kernel_profile(tmp_path, prog, simulate(prog))
    prof = read_profile(path).require_complete()
    assert prof.device["kind"] == "sim" and prof.device["preset"] == "trn1"
    assert list(prof.executables()) == [prog.hash]
    (h, run, trace_path), = prof.itraces()
    assert h == prog.hash and run == 0
    doc = prof.load_itrace(trace_path)
    assert doc["modeled"] is True and len(doc["columns"]["start_ns"]) == 3
    assert prof.program(prog.hash).hash == prog.hash
    listed = {f["path"] for f in prof.manifest["files"]}
    assert listed == {"system_trace.json", f"executables/exec_{prog.hash}.json", f"itraces/exec_{prog.hash}.0.itrace.json"}


def test_tampered_file_makes_the_profile_incomplete(tmp_path):
    prog = _program()
    path = write_kernel_profile(tmp_path, prog, simulate(prog))
    target = path / "system_trace.json"
    data = target.read_bytes()
    target.write_bytes(data.replace(b"exec_running", b"exec_Running"))
    prof = read_profile(path)
    assert not prof.complete
    assert "does not match its sha256" in prof.problems[0]
    with pytest.raises(IncompleteProfileError, match="not a complete tilescope profile"):
        prof.require_complete()


def test_mismatched_pair_is_refused(tmp_path):
    prog = _program()
    path = write_kernel_profile(tmp_path, prog, simulate(prog))
    prof = read_profile(path)
    (_, _, trace_path), = prof.itraces()
    doc = json.loads(trace_path.read_text())
    doc["program_hash"] = "0" * 16
    trace_path.write_text(json.dumps(doc))
    with pytest.raises(ProfileFormatError, match="instruction trace is for program 0000000000000000 but its name says"):
        prof.load_itrace(trace_path)


def test_a_file_a_tool_wrote_at_its_target_is_listed_with_its_checksum(tmp_path):
    """torch writes trace.json itself where the profile wants it; listed as written, it is
    verified like every other file (and a later change to it is caught)."""
    data = b'{"traceEvents": []}'
    with ProfileWriter(tmp_path) as w:
        Path(w.target("trace.json")).write_bytes(data)
        w.add_written("trace.json", data)
    prof = read_profile(w.path).require_complete()
    assert [f for f in prof.manifest["files"] if f["path"] == "trace.json"][0]["bytes"] == len(data)
    (w.path / "trace.json").write_bytes(b'{"traceEvents": [1]}')
    assert read_profile(w.path).problems


def test_exception_inside_writer_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with ProfileWriter(tmp_path) as w:
            w.write_json("trace.json", {"traceEvents": []})
            raise RuntimeError("boom")
    assert find_profiles(tmp_path) == []


def test_a_failed_background_write_leaves_nothing(tmp_path):
    """Instruction traces are written by a batch (on another thread, with the extension),
    which also makes their directory: a write that fails there fails the profile when it
    finishes, and nothing of it is left."""
    prog = _program()
    with pytest.raises(OSError) as err:
        with ProfileWriter(tmp_path) as w:
            w.add_itrace(prog, simulate(prog), 0)
            assert not w.partial.exists()  # made by the batch, off this thread
            w.partial.mkdir(parents=True)
            (w.partial / "itraces").write_bytes(b"")  # a file where the batch's directory goes
            w.start_writes()
    assert "itraces" in str(err.value.filename)
    assert find_profiles(tmp_path) == [] and not any(tmp_path.rglob("*.json"))


def test_files_written_later_are_in_the_finished_profile(tmp_path):
    prog = _program()
    with ProfileWriter(tmp_path / "new" / "dir") as w:  # every directory made by the batch
        w.add_itrace(prog, simulate(prog), 0)
        w.write_bytes("late.json", b"{}", later=True)  # still in the batch when the writer finishes
    p = read_profile(w.path).require_complete()  # every checksum verified
    assert (w.path / "late.json").read_bytes() == b"{}" and len(p.itraces()) == 1
    assert [d.name for d in (tmp_path / "new" / "dir").iterdir()] == [w.path.parent.name]


def test_a_file_given_in_parts_is_written_whole_with_its_checksum(tmp_path):
    """The exporter hands large files over as parts (never joined): now and in the batch, the
    file is the parts one after the other, its size and sha256 those of the whole."""
    import hashlib

    parts = tuple(bytes([65 + i % 26]) * (i % 97) for i in range(2000))  # more than one writev's IOV_MAX
    with ProfileWriter(tmp_path) as w:
        w.write_bytes("now.json", (b"[", b"1,2", b"]"))
        w.write_bytes("later.bin", parts, later=True)
    p = read_profile(w.path).require_complete()  # sizes and checksums verified against the files
    assert (w.path / "now.json").read_bytes() == b"[1,2]"
    whole = b"".join(parts)
    assert (w.path / "later.bin").read_bytes() == whole
    listed = {f["path"]: f for f in p.manifest["files"]}["later.bin"]
    assert listed == {"path": "later.bin", "bytes": len(whole), "sha256": hashlib.sha256(whole).hexdigest()}


def test_a_file_a_tool_wrote_is_listed_with_the_digest_the_batch_made(tmp_path):
    """``add_written`` without the bytes: the file torch wrote itself is read and hashed in the
    batch, off the exporter's thread; the manifest lists its size and digest as written."""
    import hashlib

    data = b'{"traceEvents":[' + b'{"ph":"X"},' * 20_000 + b'{}]}'
    with ProfileWriter(tmp_path) as w:
        w.reserve("trace.json")
        w.start_writes()
        Path(w.target("trace.json")).write_bytes(data)  # torch writes it
        w.add_written("trace.json")
        w.write_bytes("system_trace.json", (b'{"traceEvents":', b"[]}"), later=True)
        manifest = w.seal()
    listed = {f["path"]: (f["bytes"], f["sha256"]) for f in manifest["files"]}
    assert listed == {"trace.json": (len(data), hashlib.sha256(data).hexdigest()),
                      "system_trace.json": (18, hashlib.sha256(b'{"traceEvents":[]}').hexdigest())}
    read_profile(w.path).require_complete()  # every checksum verified against the files


def test_a_reserved_file_is_created_in_the_batch_and_never_truncated(tmp_path):
    """The exporter reserves trace.json (written by torch on the exporter's thread, maybe
    before the batch runs) and the last files: the batch creates a missing one empty and
    leaves one already written as it is."""
    with ProfileWriter(tmp_path) as w:
        Path(w.target("trace.json")).write_bytes(b'{"traceEvents":[]}')  # torch was first
        w.reserve("trace.json", "system_trace.json")
        w.start_writes()
        w._wait_for_writes()
        assert (w.partial / "system_trace.json").read_bytes() == b""
        w.add_written("trace.json", b'{"traceEvents":[]}')
        w.write_bytes("system_trace.json", b'{"traceEvents":[]}', later=True)
    p = read_profile(w.path).require_complete()
    assert (w.path / "trace.json").read_bytes() == (w.path / "system_trace.json").read_bytes() == b'{"traceEvents":[]}'
    assert sorted(f["path"] for f in p.manifest["files"]) == ["system_trace.json", "trace.json"]


def test_sealed_profile_writes_its_manifest_last_and_takes_no_more_files(tmp_path, monkeypatch):
    """``seal`` makes the manifest and writes it once every file still to write is written; the
    directory gets its final name only after that."""
    from tilescope.profiler import _profile_writer

    order = []  # every path, in the order it is written
    write = _profile_writer.write_file

    def recording_write(path, data):
        order.append(path)
        write(path, data)

    monkeypatch.setattr(_profile_writer, "write_file", recording_write)
    prog = _program()
    with ProfileWriter(tmp_path) as w:
        w.write_bytes("system_trace.json", b'{"traceEvents":[]}', later=True)  # hashed by its batch
        w.start_writes()
        w.add_itrace(prog, simulate(prog), 0)  # a batch after it, which the manifest does not wait for
        manifest = w.seal()
        assert w.seal() is manifest and not w.path.exists()
        with pytest.raises(RuntimeError, match="already made"):
            w.write_bytes("late.json", b"{}")
    written = [os.path.relpath(p, w.partial) for p in order]
    assert written[-1] == "manifest.json" and len(written) == len(set(written))
    listed = {f["path"] for f in manifest["files"]}  # (the executable may be linked, not written)
    assert set(written[:-1]) <= listed and itrace_name(prog.hash, 0) in written
    assert listed == {str(f.relative_to(w.path)) for f in w.path.rglob("*.json")} - {"manifest.json"}
    assert json.loads((w.path / "manifest.json").read_bytes()) == manifest
    read_profile(w.path).require_complete()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_writes_its_own_profiles(tmp_path):
    """A child forked after a profile (a DataLoader worker, a launcher) that profiles writes its
    own complete profile (its own locks, its own pid in the path)."""
    prog = _program()
    with ProfileWriter(tmp_path / "parent") as w:
        w.add_itrace(prog, simulate(prog), 0)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only with a complete profile
        code = 1
        try:
            signal.alarm(60)  # a child waiting on a lock the parent held would hang the test run
            with ProfileWriter(tmp_path / "child") as cw:
                cw.add_itrace(prog, simulate(prog), 0)
            read_profile(cw.path).require_complete()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert len(find_profiles(tmp_path / "child")) == 1


def test_sigkill_during_export_is_detected_as_incomplete(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal
        from tilescope.profiler import ProfileWriter
        w = ProfileWriter({str(tmp_path)!r})
        w.write_json("trace.json", {{"traceEvents": [{{"ph": "X"}}] * 1000}})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    (prof,) = find_profiles(tmp_path)
    assert not prof.complete
    assert any(".partial" in p for p in prof.problems)


def test_missing_manifest_is_incomplete(tmp_path):
    prog = _program()
    path = write_kernel_profile(tmp_path, prog, simulate(prog))
    os.remove(path / "manifest.json")
    prof = read_profile(path)
    assert "manifest.json is missing" in prof.problems[0]


def test_paths_outside_the_profile_are_refused(tmp_path):
    with ProfileWriter(tmp_path) as w:
        for bad in ("../escape.json", "a/../../escape.json", "a\\..\\..\\escape.json", "/tmp/escape.json", ""):
            with pytest.raises(ValueError, match="relative and inside the profile"):
                w.write_json(bad, {})
        w.write_json("names..with.dots.json", {})  # two dots inside a name are not a parent
    assert (w.path / "names..with.dots.json").exists()


def test_a_later_profile_links_the_executable_written_before_unless_it_changed(tmp_path):
    prog = _program()
    name = f"executables/exec_{prog.hash}.json"
    first = write_kernel_profile(tmp_path / "a", prog, simulate(prog))
    second = write_kernel_profile(tmp_path / "b", prog, simulate(prog))
    assert os.path.samefile(first / name, second / name)
    assert read_profile(first).complete and read_profile(second).complete
    (second / name).unlink()  # replaced since: the next profile writes its own copy
    (second / name).write_text(prog.dumps().replace('"k"', '"K"'))
    third = write_kernel_profile(tmp_path / "c", prog, simulate(prog))
    assert not os.path.samefile(second / name, third / name)
    assert (third / name).read_text() == prog.dumps() and read_profile(third).complete
    fourth = write_kernel_profile(tmp_path / "d", prog, simulate(prog))  # links the copy written last
    assert os.path.samefile(third / name, fourth / name) and read_profile(fourth).complete


def test_instruction_trace_text_is_its_document():
    """The bytes written (columns by orjson from numpy) read as ``itrace_json`` -- ints as ints,
    float64 values exactly -- and a float32 column keeps its float64 (tolist) value."""
    import numpy as np

    import hashlib

    from tilescope.profiler._itrace import _numpy_column, itrace_bytes, itrace_json, itrace_parts

    prog = _program()
    result = simulate(prog)
    execution = {"flow_id": 7, "core": 0, "start_us": 1.5}

    def typed(text):
        return json.loads(text, parse_float=lambda s: ("float", float(s)))

    written = typed(itrace_bytes(prog, result, execution=execution))
    assert written == typed(json.dumps(itrace_json(prog, result, execution=execution)))
    # the parts an export writes, and the digest finished from the shared first part's
    parts, digest = itrace_parts(prog, result, execution=execution)
    assert b"".join(parts) == itrace_bytes(prog, result, execution=execution)
    assert digest == hashlib.sha256(b"".join(parts)).hexdigest()
    other, other_digest = itrace_parts(prog, result, execution={"flow_id": 8})
    assert other[0] is parts[0] and other_digest == hashlib.sha256(b"".join(other)).hexdigest() != digest
    assert written["columns"]["end_ns"] and all(v[0] == "float" for v in written["columns"]["end_ns"])
    assert isinstance(_numpy_column(np.arange(3, dtype=np.int16)), np.ndarray)
    assert _numpy_column(np.array([0.1], dtype=np.float32)) == [float(np.float32(0.1))]


def test_a_chosen_timestamp_is_claimed_when_the_writer_is_made(tmp_path):
    """A writer given its timestamp (``tilescope share`` keeps the source's) owns its directory
    from the start: a second writer of that name, or one left by a killed export, is refused."""
    first = ProfileWriter(tmp_path, timestamp="20260101_000000_000001")
    with pytest.raises(FileExistsError):
        ProfileWriter(tmp_path, timestamp="20260101_000000_000001")
    first.abort()
    (first.partial).mkdir(parents=True)  # left by an export killed before it finished
    with pytest.raises(FileExistsError):
        ProfileWriter(tmp_path, timestamp="20260101_000000_000001")


def test_generated_names_differ_within_a_process(tmp_path, monkeypatch):
    """Even when the clock does not move between two profiles (or goes back)."""
    import datetime

    from tilescope.profiler import _profile_writer

    stopped = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)

    class StoppedClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return stopped

    monkeypatch.setattr(_profile_writer._dt, "datetime", StoppedClock)
    monkeypatch.setattr(_profile_writer, "_last_stamp", [datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)])
    writers = [ProfileWriter(tmp_path) for _ in range(50)]
    assert len({w.path.name for w in writers}) == 50 and [w.path.name for w in writers] == sorted(
        w.path.name for w in writers)
    assert [w.path.name for w in writers[:2]] == ["20260101_000000_000000", "20260101_000000_000001"]
    # the name is the time as strftime writes it (the explorer and people sort by it)
    stopped = datetime.datetime(2026, 11, 30, 9, 5, 7, 4321, tzinfo=datetime.timezone.utc)
    named = ProfileWriter(tmp_path)
    assert named.path.name == stopped.strftime("%Y%m%d_%H%M%S_%f")
    assert named.partial.name == f".{named.path.name}.partial"
    assert named.created == "2026-11-30T09:05:07.004321Z"


@pytest.mark.parametrize("size", [0, 1, 70_000, 3 << 20])
def test_read_file_reads_the_whole_file(tmp_path, size):
    from tilescope.profiler._fast_files import read_file

    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    assert read_file(str(tmp_path / "f")) == data
