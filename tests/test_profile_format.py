"""The profile directory: atomic writing, completeness, checksums, pairs."""

import errno
import json
import os
import shutil
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
from tilescope.profiler._format import itrace_name
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


@pytest.fixture(params=["batch-thread", "no-extension"])
def writer_path(request, monkeypatch):
    """Both ways the writer makes its batched files: the ``_filebatch`` extension on the writer
    thread, and the Python loop used where it is not built."""
    from tilescope.profiler import _format

    if request.param == "no-extension":
        monkeypatch.setattr(_format, "_filebatch", None)
    elif _format._filebatch is None:
        pytest.skip("the _filebatch extension is not built")
    return request.param


def test_a_failed_background_write_leaves_nothing(tmp_path, writer_path):
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


def test_files_written_later_are_in_the_finished_profile(tmp_path, writer_path):
    prog = _program()
    with ProfileWriter(tmp_path / "new" / "dir") as w:  # every directory made by the batch
        w.add_itrace(prog, simulate(prog), 0)
        w.write_bytes("late.json", b"{}", later=True)  # still in the batch when the writer finishes
    p = read_profile(w.path).require_complete()  # every checksum verified
    assert (w.path / "late.json").read_bytes() == b"{}" and len(p.itraces()) == 1
    assert [d.name for d in (tmp_path / "new" / "dir").iterdir()] == [w.path.parent.name]


def test_a_file_given_in_parts_is_written_whole_with_its_checksum(tmp_path, writer_path):
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


def test_the_extension_writes_parts_and_refuses_what_is_not_text(tmp_path):
    from tilescope.profiler import _format

    if _format._filebatch is None:
        pytest.skip("the _filebatch extension is not built")
    fb = _format._filebatch
    target, empty = str(tmp_path / "d" / "f"), str(tmp_path / "e")
    assert fb.start([target, empty], [("ab", b"", "\u00e9", b"cd"), ()], None).wait() == [False, False]
    assert open(target, "rb").read() == "ab\u00e9cd".encode() and os.path.getsize(empty) == 0
    with pytest.raises(TypeError, match="bytes, str, a tuple of them or None, not int"):
        fb.write_files([target], [(b"a", 3)])


def test_the_extension_hashes_what_it_writes_and_files_others_wrote(tmp_path):
    """With ``hashed`` flags the batch also makes the SHA-256 of those files: of the parts it
    writes, or -- for a None data -- of the file as another writer left it (read, never made)."""
    import hashlib

    from tilescope.profiler import _format

    if _format._filebatch is None:
        pytest.skip("the _filebatch extension is not built")
    fb = _format._filebatch
    theirs = tmp_path / "theirs.json"
    theirs.write_bytes(b"x" * 300_000)  # more than one read's buffer
    written, plain = str(tmp_path / "d" / "parts"), str(tmp_path / "plain")
    parts = (b"ab", "\u00e9", b"")
    for run in (lambda *a: fb.start(*a).wait(), fb.write_files):
        result = run([written, str(theirs), plain], [parts, None, b"{}"], None, [True, True, False])
        assert result == [(False, 4, hashlib.sha256("ab\u00e9".encode()).hexdigest()),
                          (False, 300_000, hashlib.sha256(theirs.read_bytes()).hexdigest()),
                          (False, None, None)]
        assert open(written, "rb").read() == "ab\u00e9".encode() and open(plain, "rb").read() == b"{}"
    with pytest.raises(FileNotFoundError) as err:  # a file to hash that nobody wrote: never created
        fb.start([str(tmp_path / "none.json")], [None], None, [True]).wait()
    assert err.value.filename == str(tmp_path / "none.json") and not (tmp_path / "none.json").exists()
    with pytest.raises(ValueError, match="linked to a source and hashed"):
        fb.write_files([plain], [b"{}"], [(str(theirs), 1, 2, 3)], [True])
    with pytest.raises(ValueError, match="hashed flag.*: 1 paths"):
        fb.write_files([plain], [b"{}"], None, [True, False])


def test_a_file_a_tool_wrote_is_listed_with_the_digest_the_batch_made(tmp_path, writer_path):
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


def test_the_extension_makes_directories_and_takes_over_what_it_is_given(tmp_path):
    """A path ending in "/" with a None data is a directory (parents made); a move renames a
    file or directory to the path first, when it can -- else the path is made as without one."""
    from tilescope.profiler import _format

    if _format._filebatch is None:
        pytest.skip("the _filebatch extension is not built")
    fb = _format._filebatch
    ahead = tmp_path / "ahead"
    (ahead / "sub").mkdir(parents=True)
    (ahead / "kept.json").write_bytes(b"")
    inode = ahead.stat().st_ino
    moved, made, kept = tmp_path / "moved", tmp_path / "a" / "b", tmp_path / "moved" / "kept.json"
    fb.write_files([f"{moved}/", f"{made}/", str(kept), str(tmp_path / "other")],
                   [None, None, b"{}", b"[]"], None, None,
                   [str(ahead), str(tmp_path / "missing"), None, str(tmp_path / "missing")])
    assert moved.stat().st_ino == inode and not ahead.exists() and (moved / "sub").is_dir()
    assert made.is_dir() and kept.read_bytes() == b"{}" and (tmp_path / "other").read_bytes() == b"[]"
    (tmp_path / "again").mkdir()
    fb.write_files([f"{moved}/"], [None], None, None, [str(tmp_path / "again")])  # the path is there: kept
    assert moved.stat().st_ino == inode and (tmp_path / "again").is_dir()
    with pytest.raises(ValueError, match="is a directory: it cannot be hashed"):
        fb.write_files([f"{made}/"], [None], None, [True])
    with pytest.raises(ValueError, match="is a directory: it cannot be linked"):
        fb.write_files([f"{made}/"], [None], [(str(kept), 1, 2, 3)])


def test_the_next_profile_takes_over_the_directory_made_ahead_for_it(tmp_path, monkeypatch):
    """With ``prepare_next`` a finished profile leaves the next one's directory made (its
    subdirectories and reserved files, off the exporter's thread); the next writer there takes
    it over with one rename. Readers never take it for a profile; it is gone at exit."""
    from tilescope.profiler import _format

    if _format._filebatch is None:
        pytest.skip("the _filebatch extension is not built")
    monkeypatch.chdir(tmp_path.parent)
    prog = _program()
    paths = []
    for k in range(3):
        with ProfileWriter(tmp_path, prepare_next=True, device={"kind": "sim"}) as w:
            w.reserve("trace.json", "manifest.json")
            Path(w.target("trace.json")).write_bytes(b'{"traceEvents":[]}') if k else None
            w.add_itrace(prog, simulate(prog), 0)
            if k:
                w.add_written("trace.json")
        paths.append(w.path)
        spare = _format._spares[os.path.abspath(w.path.parent)]
        spare.writer.wait()
        made = os.stat(spare.path).st_ino
        # its reserved files, but no manifest.json (what tools look for to find profiles)
        assert sorted(os.listdir(spare.path)) == ["executables", "itraces", "trace.json"]
        assert os.path.getsize(os.path.join(spare.path, "trace.json")) == 0
        if k == 1:
            shutil.rmtree(spare.path)  # deleted meanwhile: the next profile makes its own
    assert [p.path for p in find_profiles(tmp_path)] == paths  # complete ones only, the spare left out
    assert all(p.complete for p in find_profiles(tmp_path)) and find_profiles(paths[0].parent)[-1].path == paths[-1]
    assert read_profile(paths[-1], verify=True).complete  # the taken-over directory holds a whole profile
    with ProfileWriter(tmp_path) as w:  # a writer that prepares none takes none either
        w.write_json("late.json", {})
    assert w.path.stat().st_ino != made and os.path.isdir(spare.path)
    os.chdir(tmp_path)  # (the spare is found by its absolute path)
    with ProfileWriter(".", prepare_next=True) as w:
        w.write_json("x.json", {})
    assert os.stat(w.path).st_ino == made and not os.path.exists(spare.path)
    _format._remove_spares()
    assert not (tmp_path / paths[0].parent.name / _format.SPARE_DIR).exists() and os.path.isdir(w.path)
    assert not [name for name in os.listdir(tmp_path / paths[0].parent.name) if name.startswith(".")]


def test_a_process_that_exits_leaves_no_spare_directory(tmp_path):
    code = ("from tilescope.profiler._format import ProfileWriter\n"
            f"with ProfileWriter({str(tmp_path)!r}, prepare_next=True) as w:\n"
            "    w.reserve('trace.json'); w.write_json('itraces/a.json', {})\n"
            "print(w.path)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    written = Path(out.strip())
    assert written.is_dir() and sorted(p.name for p in written.parent.iterdir()) == [written.name]


def test_a_reserved_file_is_created_in_the_batch_and_never_truncated(tmp_path, writer_path):
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


def test_sealed_profile_writes_its_manifest_last_and_takes_no_more_files(tmp_path, writer_path, monkeypatch):
    """``seal`` makes the manifest and writes it once every file still to write is written; the
    directory gets its final name only after that."""
    from tilescope.profiler import _format

    order = []  # every path, in the order it is written (a batch's: when it starts)
    unfinished = set()  # the batches not waited for yet
    if writer_path == "batch-thread":
        real = _format._filebatch

        class Waited:
            def __init__(self, batch):
                self.batch = batch
                unfinished.add(self)

            def wait(self):
                result = self.batch.wait()
                unfinished.discard(self)
                return result

        class Recording:
            @staticmethod
            def start(paths, data, *rest):
                order.extend(paths)
                return Waited(real.start(paths, data, *rest))

        monkeypatch.setattr(_format, "_filebatch", Recording)
    write = _format._write_file

    def recording_write(path, data):
        assert not unfinished  # every batch written before the manifest (the only file written here)
        order.append(path)
        write(path, data)

    monkeypatch.setattr(_format, "_write_file", recording_write)
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
def test_a_forked_child_writes_its_profiles_with_its_own_writer_thread(tmp_path):
    """The writer thread runs in the process that started it; a child forked after a profile
    (a DataLoader worker, a launcher) that profiles must not wait for a thread it lacks."""
    prog = _program()
    with ProfileWriter(tmp_path / "parent") as w:  # the parent's thread exists now
        w.add_itrace(prog, simulate(prog), 0)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only with a complete profile
        code = 1
        try:
            signal.alarm(60)  # a child waiting for the parent's thread would hang the test run
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


def test_a_later_profile_links_the_executable_written_before_unless_it_changed(tmp_path, writer_path):
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

    from tilescope.profiler._format import _numpy_column, itrace_bytes, itrace_json, itrace_parts

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


def test_an_exporter_starts_the_writer_thread_before_the_profiled_steps(tmp_path, monkeypatch):
    """Starting a thread costs the exporter a system call or two; it is done when the exporter is made."""
    from tilescope.profiler import ProfileConfig, Profiler, _format

    if _format._filebatch is None:
        pytest.skip("the _filebatch extension is not built")
    started = []

    class Recording:
        start_worker = staticmethod(lambda: started.append(True))

    monkeypatch.setattr(_format, "_filebatch", Recording)
    Profiler(ProfileConfig(output_dir=tmp_path))
    assert started == [True]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_batch_the_parent_was_writing_fails_in_a_forked_child_instead_of_hanging(tmp_path):
    """The writer thread is not in a forked child: a batch it had not finished at the fork
    is cancelled there (ECANCELED), and the child's own batches get the child's thread."""
    from tilescope.profiler import _format

    if _format._filebatch is None:
        pytest.skip("the _filebatch extension is not built")
    paths = [str(tmp_path / "parent" / f"f{i}") for i in range(3000)]
    batch = _format._filebatch.start(paths, [b"x" * 64] * len(paths), None)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(60)
            try:
                batch.wait()  # finished before the fork, or cancelled
            except OSError as e:
                assert e.errno == errno.ECANCELED, e
            child = _format._filebatch.start([str(tmp_path / "child" / "f")], [b"{}"], None)
            assert child.wait() == [False] and (tmp_path / "child" / "f").read_bytes() == b"{}"
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert batch.wait() == [False] * len(paths) and os.path.exists(paths[-1])
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


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

    from tilescope.profiler import _format

    stopped = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)

    class StoppedClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return stopped

    monkeypatch.setattr(_format._dt, "datetime", StoppedClock)
    monkeypatch.setattr(_format, "_last_stamp", [datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)])
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


def test_the_batch_reports_why_a_directory_could_not_be_made(tmp_path):
    """A missing directory the batch cannot make is reported with the reason it cannot (a
    permission, a read-only file system), not as the file's absence."""
    from tilescope.profiler import _format

    if _format._filebatch is None:
        pytest.skip("the _filebatch extension is not built")
    target = "/sys/tilescope-no-such-dir/sub/f.json"  # a file system where nothing can be made
    try:
        os.makedirs(os.path.dirname(target))
    except OSError as e:
        expected = e.errno
    else:
        pytest.skip("this machine lets /sys take new directories")
    if expected == errno.ENOENT:
        pytest.skip("mkdir under /sys reports ENOENT here")
    with pytest.raises(OSError) as err:
        _format._filebatch.write_files([target], [b"{}"])
    assert err.value.errno == expected


@pytest.mark.parametrize("size", [0, 1, 70_000, 3 << 20])
def test_read_file_reads_the_whole_file(tmp_path, size):
    from tilescope.profiler._format import read_file

    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    assert read_file(str(tmp_path / "f")) == data
