"""Full disk and unwritable output: a clear error naming the file and the cause, exit 1, no partial output
directory and no temporary file left behind, the input untouched.

We run as root, so chmod-made read-only directories do not stop writes. The cases use
  * RLIMIT_FSIZE (set in the child only): write() past the limit fails with EFBIG ("File too large";
    symprune ignores SIGXFSZ, which would otherwise kill it silently);
  * a small tmpfs, which fills up with ENOSPC ("No space left on device"), and a read-only bind mount
    (EROFS), where mounting is allowed (skipped with the reason otherwise);
  * paths whose parent is a regular file or does not exist."""
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

from prune_support import BIN, DATA, Stories, tree_digest

CHECKPOINT = DATA / "stories260K" / "stories260K.bin"
TOKENIZER = DATA / "stories260K" / "tok512.bin"
PRUNE = ["prune", "--method", "magnitude", "--sparsity", "0.5"]
TOO_LARGE = "file too large"
# LLVM's OpenMP runtime (libomp: clang builds, such as scripts/sanitize.sh's) sizes a 1 KiB shared-memory file
# to register itself when it starts (the first OpenMP call), and aborts when a smaller RLIMIT_FSIZE refuses
# it. GCC's libgomp (the normal build) does not; a limit that small is tested there (and here for commands
# that never start OpenMP, such as convert-llama2c).
LIBOMP = "libomp" in subprocess.run(["ldd", BIN], capture_output=True, text=True).stdout
below_libomp_registration = pytest.mark.skipif(
    LIBOMP, reason="RLIMIT_FSIZE below 1 KiB aborts libomp's start in this clang build (tested in the GCC one)")


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    root = tmp_path_factory.mktemp("stories")
    s = Stories(root)
    s.digest = tree_digest(s.model)
    return s


def run(args, fsize=None):
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True,
                          preexec_fn=limit if fsize is not None else None)


def listing(path):
    """Every entry below path (dotfiles included), to show nothing was left behind."""
    path = Path(path)
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def expect_failure(proc, *words):
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "symprune: error:" in proc.stderr, proc.stderr
    message = proc.stderr.lower()
    for word in words:
        assert str(word).lower() in message, (word, proc.stderr)


def error_line(proc):
    return next(line for line in proc.stderr.splitlines() if line.startswith("symprune: error:"))


# --- RLIMIT_FSIZE --------------------------------------------------------------------------------

@pytest.mark.parametrize("limit", [pytest.param(0, marks=below_libomp_registration), 4096, 256 << 10, 1020 << 10],
                         ids=["0", "4k", "256k", "1020k"])
def test_prune_out_file_too_large(stories, tmp_path, limit):
    # 1020k: model.safetensors (1,044,984 bytes) fails 504 bytes before its end.
    out = tmp_path / "pruned"
    proc = run(["prune", "--model", stories.model, *PRUNE[1:], "--out", out, "--report", tmp_path / "r.json"],
               fsize=limit)
    expect_failure(proc, TOO_LARGE, out / "model.safetensors", "write failed")
    assert ".tmp" not in error_line(proc), "the error names a temporary path instead of the output"
    assert listing(tmp_path) == [], "partial output or temporary left behind"
    assert tree_digest(stories.model) == stories.digest


def test_prune_checkpoint_file_too_large(stories, tmp_path):
    # HDF5 1.10 crashed at exit (SIGSEGV, a raw HDF5 message before it) after failing to finish the file.
    proc = run(["prune", "--model", stories.model, "--method", "wanda", "--sparsity", "0.5", "--calib",
                stories.first, "--nsamples", "4", "--seqlen", "64", "--out", tmp_path / "pruned", "--checkpoint",
                tmp_path / "c.h5"], fsize=150 << 10)
    expect_failure(proc, TOO_LARGE, tmp_path / "c.h5", "cannot write its")
    assert "HDF5" not in proc.stderr and "errno" not in proc.stderr, proc.stderr
    # The last checkpoint that fitted stays, to resume from once there is room; nothing else.
    assert listing(tmp_path) == ["c.h5"], "partial checkpoint or output left behind"


def test_prune_force_keeps_existing_out_when_write_fails(stories, tmp_path):
    out = tmp_path / "pruned"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    (out / "symprune_provenance.json").write_text('{"tool": "symprune"}')  # a previous symprune output
    proc = run(["prune", "--model", stories.model, *PRUNE[1:], "--out", out, "--force"], fsize=100 << 10)
    expect_failure(proc, TOO_LARGE, out / "model.safetensors")
    assert listing(tmp_path) == ["pruned", "pruned/keep.txt", "pruned/symprune_provenance.json"]
    assert (out / "keep.txt").read_text() == "user data"
    assert tree_digest(stories.model) == stories.digest


def test_prune_copying_other_files_fails(stories, tmp_path):
    # The weights fit, a large extra file (copied byte-identical) does not: the copy error is reported too.
    model = tmp_path / "model"
    shutil.copytree(stories.model, model)
    (model / "generation_config.json").write_text("{" + " " * (1100 << 10) + "}")
    digest = tree_digest(model)
    work = tmp_path / "work"
    work.mkdir()
    proc = run(["prune", "--model", model, *PRUNE[1:], "--out", work / "pruned"], fsize=1060 << 10)
    expect_failure(proc, TOO_LARGE, work / "pruned" / "generation_config.json")
    assert listing(work) == []
    assert tree_digest(model) == digest


@pytest.mark.parametrize("limit", [0, 64 << 10, 1020 << 10], ids=["0", "64k", "1020k"])
def test_convert_llama2c_file_too_large(tmp_path, limit):
    out = tmp_path / "converted"
    proc = run(["convert-llama2c", "--checkpoint", CHECKPOINT, "--tokenizer", TOKENIZER, "--out", out],
               fsize=limit)
    expect_failure(proc, TOO_LARGE, out / "model.safetensors")
    assert ".tmp" not in error_line(proc)
    assert listing(tmp_path) == []


@below_libomp_registration
def test_eval_report_file_too_large(stories, tmp_path):
    report = tmp_path / "report.json"
    proc = run(["eval", "--model", stories.model, "--text", stories.second, "--seqlen", "64", "--max-chunks", "2",
                "--report", report], fsize=64)
    expect_failure(proc, TOO_LARGE, report)
    assert listing(tmp_path) == []


def test_calib_out_file_too_large(stories, tmp_path):
    out = tmp_path / "calib.u32"
    proc = run(["calib", "--tokenizer", stories.model, "--calib", stories.first, "--nsamples", "8", "--seqlen",
                "64", "--out", out], fsize=1024)
    expect_failure(proc, TOO_LARGE, out)
    assert listing(tmp_path) == []


def test_logits_out_file_too_large(stories, tmp_path):
    out = tmp_path / "logits.f32"
    proc = run(["logits", "--model", stories.model, "--ids", "1,403,407,261", "--out", out], fsize=1024)
    expect_failure(proc, TOO_LARGE, out)
    assert listing(tmp_path) == []


# --- paths that cannot hold the output -----------------------------------------------------------

def test_prune_out_missing_parents_are_not_created(stories, tmp_path):
    out = tmp_path / "a" / "b" / "c"
    proc = run(["prune", "--model", stories.model, *PRUNE[1:], "--out", out])
    expect_failure(proc, out, "does not exist")
    assert listing(tmp_path) == []


def test_prune_out_parent_is_a_file(stories, tmp_path):
    (tmp_path / "file").write_text("user data")
    proc = run(["prune", "--model", stories.model, *PRUNE[1:], "--out", tmp_path / "file" / "pruned"])
    expect_failure(proc, tmp_path / "file", "not a directory")
    assert listing(tmp_path) == ["file"] and (tmp_path / "file").read_text() == "user data"


def test_convert_out_parent_is_a_file(tmp_path):
    (tmp_path / "file").write_text("user data")
    proc = run(["convert-llama2c", "--checkpoint", CHECKPOINT, "--tokenizer", TOKENIZER, "--out",
                tmp_path / "file" / "converted"])
    expect_failure(proc, tmp_path / "file")
    assert listing(tmp_path) == ["file"]


def test_report_parent_is_a_file(stories, tmp_path):
    (tmp_path / "file").write_text("user data")
    proc = run(["eval", "--model", stories.model, "--text", stories.second, "--seqlen", "64", "--max-chunks", "1",
                "--report", tmp_path / "file" / "report.json"])
    expect_failure(proc, tmp_path / "file" / "report.json")
    assert listing(tmp_path) == ["file"]


# --- mounts: a full tmpfs and a read-only bind mount ------------------------------------------------

def mount(*args):
    proc = subprocess.run(["mount", *map(str, args)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount here ({' '.join(map(str, args))}): {proc.stderr.strip() or proc.returncode}")


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 512 KiB tmpfs: smaller than the stories260K weights (1 MB)."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    point = tmp_path / "tmpfs"
    point.mkdir()
    mount("-t", "tmpfs", "-o", "size=512k", "tmpfs", point)
    yield point
    subprocess.run(["umount", point], check=True)


@pytest.fixture
def read_only_dir(tmp_path):
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    point = tmp_path / "ro"
    point.mkdir()
    (point / "existing.txt").write_text("user data")
    mount("--bind", point, point)
    proc = subprocess.run(["mount", "-o", "remount,bind,ro", point], capture_output=True, text=True)
    if proc.returncode != 0:
        subprocess.run(["umount", point], check=True)
        pytest.skip(f"cannot remount read-only: {proc.stderr.strip()}")
    yield point
    subprocess.run(["umount", point], check=True)


def test_prune_out_no_space(stories, small_tmpfs):
    out = small_tmpfs / "pruned"
    proc = run(["prune", "--model", stories.model, *PRUNE[1:], "--out", out])
    expect_failure(proc, "no space left on device", out / "model.safetensors")
    assert listing(small_tmpfs) == []
    assert tree_digest(stories.model) == stories.digest


def test_convert_llama2c_no_space(small_tmpfs):
    out = small_tmpfs / "converted"
    proc = run(["convert-llama2c", "--checkpoint", CHECKPOINT, "--tokenizer", TOKENIZER, "--out", out])
    expect_failure(proc, "no space left on device", out / "model.safetensors")
    assert listing(small_tmpfs) == []


def test_prune_report_no_space(stories, tmp_path, small_tmpfs):
    # The model fits on the normal disk; the report goes to a tmpfs that is already full.
    (small_tmpfs / "filler").write_bytes(b"\0" * (512 << 10))
    out = tmp_path / "pruned"
    report = small_tmpfs / "report.json"
    proc = run(["prune", "--model", stories.model, *PRUNE[1:], "--out", out, "--report", report])
    expect_failure(proc, "no space left on device", report)
    assert listing(small_tmpfs) == ["filler"], "report or its temporary left behind"
    assert tree_digest(stories.model) == stories.digest


def test_prune_report_failure_leaves_no_model(stories, tmp_path, small_tmpfs):
    (small_tmpfs / "filler").write_bytes(b"\0" * (512 << 10))
    out = tmp_path / "pruned"
    proc = run(["prune", "--model", stories.model, *PRUNE[1:], "--out", out, "--report", small_tmpfs / "r.json"])
    assert proc.returncode == 1, proc.stderr
    assert not out.exists(), "the model was installed although the run failed"


def test_prune_out_read_only(stories, read_only_dir):
    out = read_only_dir / "pruned"
    proc = run(["prune", "--model", stories.model, *PRUNE[1:], "--out", out])
    expect_failure(proc, "read-only file system", out)
    assert "block 1/" not in proc.stderr, "the unwritable output should be refused before pruning"
    assert listing(read_only_dir) == ["existing.txt"]


def test_convert_llama2c_read_only(read_only_dir):
    proc = run(["convert-llama2c", "--checkpoint", CHECKPOINT, "--tokenizer", TOKENIZER, "--out",
                read_only_dir / "converted"])
    expect_failure(proc, "read-only file system", read_only_dir)
    assert listing(read_only_dir) == ["existing.txt"]
