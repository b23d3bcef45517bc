"""Damaged, truncated and foreign result files: every reader gives up fast, naming the file.

Readers: ``trace``, ``plot``, ``analyze``, ``run --resume`` and ``sweep --list``. A file cut
at any length from 0 to 64 bytes (inside or just after its HDF5 superblock, where an SWMR
reader used to retry for minutes) and files with damaged contents each get a message
naming the file, exit status 2 (``analyze`` skips the file with a warning), and no
traceback. Commands that write never replace a result file unless asked (``--force``).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.cli.main import main
from hpcpipe.run import superblock
from hpcpipe.run.config import make_config
from hpcpipe.run.results import ResultsError, load, read_state
from hpcpipe.run.runner import run

HERE = Path(__file__).parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
GIVE_UP_SECONDS = 3.0  # per reader and file; measured ~0.01-0.05 s


def _result(path: Path, stop_at: int | None = None, **kw) -> Path:
    """A small result file made in this process; ``stop_at``: SIGTERM there (incomplete)."""
    cfg = make_config(
        dict(
            problem="l1-chain",
            depth=2,
            dim=4,
            optimizer="pprs",
            samples=2,
            gamma=0.05,
            lr=0.05,
            iterations=30,
            flush_every=4,
            output=str(path),
            progress="off",
            **kw,
        )
    )

    def hook(row):
        if stop_at is not None and row[0] == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)

    run(cfg, MPI.COMM_SELF, on_iteration=hook)
    return path


def _flag_as_dead_writer(path: Path) -> None:
    """Set the superblock's status flags as an SWMR writer that was killed leaves them."""
    data = bytearray(path.read_bytes())
    data[11] = 0x05  # open for writing + SWMR write
    data[44:48] = superblock.lookup3(bytes(data[:44])).to_bytes(4, "little")
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    complete = _result(d / "complete.h5")
    incomplete = _result(d / "incomplete.h5", stop_at=10)
    left = d / "left.h5"  # what a writer killed with -9 leaves
    shutil.copy(incomplete, left)
    _flag_as_dead_writer(left)
    return {"complete": complete, "incomplete": incomplete, "left": left}


SCRIPT = r"""
import contextlib, io, json, sys, time
from pathlib import Path
from hpcpipe.cli.main import main
from hpcpipe.studies.sweep import load_sweep

src, work = Path(sys.argv[1]), Path(sys.argv[2])
data = src.read_bytes()
(work / "sweep.toml").write_text(
    '[sweep]\nname = "s"\nout = "%s"\n[base]\nproblem = "l1-chain"\ndepth = 1\n' % (work / "sw")
)
point = load_sweep(work / "sweep.toml").points[0].path
point.parent.mkdir(parents=True, exist_ok=True)
(work / "a").mkdir(exist_ok=True)
out = []
for n in range(65):
    cut = data[:n]
    f = work / f"cut{n}.h5"
    for reader in ("trace", "plot", "analyze", "resume", "sweep-list"):
        if reader == "analyze":
            f = work / "a" / f"cut{n}.h5"
            argv = ["analyze", str(work / "a"), "-o", str(work / "rep")]
        elif reader == "sweep-list":
            f = point
            argv = ["sweep", str(work / "sweep.toml"), "--list"]
        else:
            f = work / f"cut{n}.h5"
            argv = {
                "trace": ["trace", str(f), "-o", str(work / "t.json")],
                "plot": ["plot", "timeline", str(f), "-o", str(work / "p.png")],
                "resume": ["run", "--resume", str(f)],
            }[reader]
        f.write_bytes(cut)
        buf = io.StringIO()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
                rc = main(argv)
        except SystemExit as e:
            rc = e.code
        except BaseException as e:  # a traceback: reported to the test
            import traceback
            rc, _ = "exception", buf.write(traceback.format_exc())
        out.append(dict(n=n, reader=reader, rc=rc, seconds=time.perf_counter() - t0,
                        text=buf.getvalue(), file=str(f)))
        if reader == "analyze":
            f.unlink()
(work / "rows.json").write_text(json.dumps(out))
"""


@pytest.mark.parametrize("source", ["complete", "left"])
def test_every_reader_gives_up_on_a_file_cut_at_0_to_64_bytes(files, tmp_path, source):
    """One process runs all 65 lengths x 5 readers; the subprocess bounds a regression."""
    script = tmp_path / "readers.py"
    script.write_text(SCRIPT)
    p = subprocess.run(
        [sys.executable, str(script), str(files[source]), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=65 * 5 * GIVE_UP_SECONDS,
        env=ENV,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert len(rows) == 65 * 5
    for r in rows:
        case = (r["reader"], r["n"], r["text"][-500:])
        assert r["seconds"] < GIVE_UP_SECONDS, case
        assert r["rc"] != "exception" and "Traceback" not in r["text"], case
        assert r["file"] in r["text"], case  # the message names the file
        if r["reader"] in ("trace", "plot", "resume"):
            assert r["rc"] == 2, case
        if r["reader"] == "sweep-list":
            assert "unreadable" in r["text"], case
        if r["reader"] == "analyze":
            assert "warning: skipping" in r["text"], case
    slowest = max(r["seconds"] for r in rows)
    print(f"slowest give-up over 65 lengths x 5 readers: {slowest:.3f} s")


def _edit(src: Path, dst: Path, fn) -> Path:
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        fn(f)
    return dst


def _set(key, value):
    def fn(f):
        f.attrs[key] = value

    return fn


def _del(name):
    def fn(f):
        if name in f.attrs:
            del f.attrs[name]
        else:
            del f[name]

    return fn


def _resize(name, n):
    def fn(f):
        f[name].resize((n,))

    return fn


def _stages_short(f):
    del f["stages/busy"]
    f["stages/busy"] = np.zeros(5)


def _state(index, value):
    def fn(f):
        s = f["state/scalars"][()]
        s[index] = value
        f["state/scalars"][...] = s

    return fn


def _theta_nan(f):
    t = f["state/optimizer/theta"][()]
    t[0] = np.nan
    f["state/optimizer/theta"][...] = t


# (case, source file, edit, readers' message fragment, also refused by --resume only)
DAMAGED = [
    ("config not JSON", "complete", _set("config", "{not json"), "'config' is not JSON"),
    ("info not JSON", "complete", _set("info", "[1, 2"), "'info' is not JSON"),
    ("method not JSON", "complete", _set("method", "nope"), "'method' is not JSON"),
    ("config is a list", "complete", _set("config", "[1, 2]"), "'config' is a list"),
    ("no status", "complete", _del("status"), "status None is not one of"),
    ("unknown status", "complete", _set("status", "partying"), "status 'partying'"),
    ("schema_version 0", "complete", _set("schema_version", 0), "schema_version 0 is not"),
    ("schema_version -7", "complete", _set("schema_version", -7), "schema_version -7 is not"),
    ("schema_version text", "complete", _set("schema_version", "1"), "schema_version '1'"),
    ("schema newer", "complete", _set("schema_version", 99), "schema 99 is newer"),
    ("no schema", "complete", _del("schema_version"), "not an hpcpipe result"),
    (
        "timeline lengths differ",
        "complete",
        _resize("timeline/rank", 3),
        "timeline datasets have different lengths",
    ),
    ("stages lengths differ", "complete", _stages_short, "stages datasets"),
    ("no iterations group", "complete", _del("iterations"), "no iterations group"),
]
# damaged resume states: readers other than --resume still read these files
STATE = [
    ("no state", _del("state"), "has no resumable state"),
    ("NaN state", _state(0, np.nan), "next iteration nan"),
    ("next iteration 1e30", _state(0, 1e30), "next iteration 1e+30 is not a whole number"),
    ("next iteration 0", _state(0, 0.0), "next iteration 0.0"),
    ("next iteration beyond rows", _state(0, 25.0), "the flushed rows end at iteration"),
    ("NaN theta", _theta_nan, "theta holds NaN"),
]


def _cli(argv, capsys):
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.parametrize(
    ("case", "source", "edit", "message"), DAMAGED, ids=[d[0] for d in DAMAGED]
)
def test_damaged_contents_are_refused_naming_the_file(
    files, tmp_path, capsys, case, source, edit, message
):
    bad = _edit(files[source], tmp_path / "bad.h5", edit)
    with pytest.raises(ResultsError) as e:
        load(bad)
    assert str(bad) in str(e.value) and message in str(e.value)
    for argv in (
        ["trace", bad, "-o", tmp_path / "t.json"],
        ["plot", "timeline", bad, "-o", tmp_path / "p.png"],
        ["run", "--resume", bad],
    ):
        rc, text = _cli(argv, capsys)
        assert rc == 2 and str(bad) in text and message in text, (argv, text)
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "p.png").exists()
    rc, text = _cli(["analyze", tmp_path, "-o", tmp_path / "rep"], capsys)
    assert f"warning: skipping {bad}" in text and "Traceback" not in text


@pytest.mark.parametrize(("case", "edit", "message"), STATE, ids=[s[0] for s in STATE])
def test_damaged_resume_state_is_refused_before_launch(
    files, tmp_path, capsys, case, edit, message
):
    bad = _edit(files["incomplete"], tmp_path / "bad.h5", edit)
    before = bad.read_bytes()
    with pytest.raises(ResultsError, match="bad.h5"):
        read_state(bad)
    rc, text = _cli(["run", "--np", "2", "--resume", bad], capsys)
    assert rc == 2 and str(bad) in text and message in text, text
    assert bad.read_bytes() == before  # nothing written
    assert load(bad).status == "incomplete"  # the other readers still read it


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "truncated (0 bytes"),
        (b"\x89HDF\r\n", "truncated (6 bytes"),
        (b"not hdf5 at all, just text", "not an HDF5 file"),
        (b"\x89HDF\r\n\x1a\n\x07" + bytes(60), "damaged HDF5 superblock (version 7)"),
    ],
    ids=["empty", "cut signature", "text", "bad version"],
)
def test_foreign_files(tmp_path, content, message):
    f = tmp_path / "x.h5"
    f.write_bytes(content)
    with pytest.raises(ResultsError) as e:
        load(f)
    assert str(e.value).startswith(f"{f}: ") and message in str(e.value)


def test_superblock_checksum_and_recovery(files, tmp_path):
    bad = tmp_path / "flip.h5"
    data = bytearray(files["complete"].read_bytes())
    data[30] ^= 0x01  # inside the superblock: its checksum no longer matches
    bad.write_bytes(bytes(data))
    with pytest.raises(ResultsError, match="checksum mismatch"):
        load(bad)
    left = tmp_path / "left.h5"
    shutil.copy(files["left"], left)
    with pytest.raises(OSError, match="already open for write"):
        h5py.File(left, "r+")  # what --resume used to fail with
    assert load(left).status == "incomplete"  # readers open it as SWMR readers
    assert superblock.clear_status_flags(left) is True
    assert superblock.read(left).flags == 0 and not superblock.clear_status_flags(left)
    with h5py.File(left, "r+") as f:  # HDF5 agrees: writable again, contents intact
        assert (
            f["iterations/iteration"].shape
            == load(files["incomplete"]).iterations["iteration"].shape
        )
    if shutil.which("h5clear"):  # the same bytes as HDF5's own tool
        ours, theirs = tmp_path / "ours.h5", tmp_path / "theirs.h5"
        shutil.copy(files["left"], ours)
        shutil.copy(files["left"], theirs)
        superblock.clear_status_flags(ours)
        subprocess.run(["h5clear", "-s", str(theirs)], check=True)
        assert ours.read_bytes()[:48] == theirs.read_bytes()[:48]


# (argv after the result file is made; expected exit, message fragment)
def test_no_command_overwrites_a_result(files, tmp_path, capsys):
    r = tmp_path / "run.h5"
    shutil.copy(files["complete"], r)
    other = tmp_path / "other.h5"
    shutil.copy(files["complete"], other)
    (tmp_path / "afile").write_text("x")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling.json")
    keep = {p: p.read_bytes() for p in (r, other)}
    cases = [
        (["trace", r, "-o", r], "is the file this command reads"),
        (["plot", "timeline", r, "-o", r], "is the file this command reads"),
        (["trace", r, "-o", other], "holds an HDF5 file (a result?): kept (--force"),
        (["plot", "timeline", r, "-o", other], "holds an HDF5 file"),
        (["simulate", "gpipe", "--plot", other], "--plot " + str(other)),
        (["trace", r, "-o", tmp_path / "missing" / "t.json"], "does not exist (create it"),
        (["trace", r, "-o", tmp_path / "afile" / "t.json"], "is a file, not a folder"),
        (["trace", r, "-o", tmp_path / "dangling.json"], "dangling symbolic link"),
        (["trace", r, "-o", tmp_path], "is a folder"),
        (["trace", r, "-o", tmp_path / "t.json", "--iteration", 99999], "--iteration 99999 was"),
        (["plot", "timeline", r, "-o", tmp_path / "p.png", "--iteration", 99999], "not recorded"),
        (["trace", r, "-o", tmp_path / "t.json", "--iteration", -1], "--iteration -1 was not"),
        (["analyze", tmp_path / "nope", "-o", tmp_path / "rep"], str(tmp_path / "nope")),
        (["analyze", tmp_path, "-o", tmp_path / "afile"], "must be a folder"),
        (["run", "--resume", r], "status is 'complete'"),
        (["run", "--resume", tmp_path / "nope.h5"], "nope.h5: no such file"),
    ]
    for argv, message in cases:
        rc, text = _cli(argv, capsys)
        assert rc == 2 and message in text and "Traceback" not in text, (argv, text)
    assert all(p.read_bytes() == b for p, b in keep.items())
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "p.png").exists()
    rc, text = _cli(["trace", r, "-o", other, "--force"], capsys)  # explicitly asked
    assert rc == 0 and json.loads(other.read_text())["traceEvents"]
    rc, text = _cli(["trace", r, "-o", tmp_path / "t.json", "--iteration", 3], capsys)
    assert rc == 0 and {e["args"]["iteration"] for e in _events(tmp_path / "t.json")} == {3}


def _events(path: Path) -> list[dict]:
    return [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
