"""Shared helpers of the `symprune prune` end-to-end tests (test_prune_*.py): the stories260K model
converted to a Hugging Face directory, TinyStories validation split in two halves (calibration on the
first, evaluation on the second, at the line boundary nearest the middle), and readers for the
pruned output."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

BIN = os.environ["SYMPRUNE_BIN"]
DATA = Path(os.environ["SYMPRUNE_DATA"])
SOURCE = Path(os.environ["SYMPRUNE_SOURCE_DIR"])
SEQLEN = 256


def symprune(*args, check=True, env=None):
    proc = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **env} if env else None)
    if check and proc.returncode != 0:
        raise AssertionError(f"symprune {' '.join(map(str, args))} exited {proc.returncode}:\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


class Run:
    """symprune (or `launcher`, e.g. mpirun ... symprune_dist, then `args`) in the background; wait_for(text)
    blocks until stderr shows it."""

    def __init__(self, args, env=None, preexec_fn=None, launcher=(BIN,)):
        self.proc = subprocess.Popen([*map(str, launcher), *map(str, args)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
                                     preexec_fn=preexec_fn)
        self.lines = []
        self.seen = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            with self.seen:
                self.lines.append(line)
                self.seen.notify_all()

    def wait_for(self, text, timeout=120):
        deadline = time.time() + timeout
        with self.seen:
            while not any(text in line for line in self.lines):
                left = deadline - time.time()
                assert left > 0 and self.proc.poll() is None, f"never saw {text!r}:\n{''.join(self.lines)}"
                self.seen.wait(min(left, 0.5))

    def finish(self, timeout=60):
        rc = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        self.stdout = self.proc.stdout.read()
        self.stderr = "".join(self.lines)
        return rc


def stories_job(stories, *options):
    """The options of a stories260K prune: calibration on the first half, evaluation on the second."""
    return ["--model", stories.model, "--calib", stories.first, "--eval", stories.second, *options]


def uninterrupted_run(job, root):
    """`symprune prune` of `job` into root/out with root/report.json: (output digest, report)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    symprune("prune", *job, "--out", root / "out", "--report", root / "report.json")
    return output_digest(root / "out"), json.loads((root / "report.json").read_text())


def assert_same_as_uninterrupted(root, reference):
    """root/out and root/report.json are those of the uninterrupted run (`reference`, from uninterrupted_run):
    the model's bytes, the perplexity, and per layer the pruned counts and reconstruction errors. Returns the
    report."""
    root = Path(root)
    assert output_digest(root / "out") == reference[0]
    report = json.loads((root / "report.json").read_text())
    assert report["perplexity"] == reference[1]["perplexity"]
    assert [l["pruned"] for l in report["layers"]] == [l["pruned"] for l in reference[1]["layers"]]
    assert [l["recon_error"] for l in report["layers"]] == [l["recon_error"] for l in reference[1]["layers"]]
    return report


class Stories:
    """stories260K as a HF directory plus the two halves of tinystories_val.txt, under `root`."""

    def __init__(self, root):
        root = Path(root)
        self.root = root
        self.model = root / "stories260K-hf"
        self.first = root / "first_half.txt"
        self.second = root / "second_half.txt"
        subprocess.run([sys.executable, SOURCE / "scripts" / "split_text.py",
                        DATA / "tinystories" / "tinystories_val.txt", self.first, self.second],
                       check=True, capture_output=True)
        symprune("convert-llama2c", "--checkpoint", DATA / "stories260K" / "stories260K.bin",
                 "--tokenizer", DATA / "stories260K" / "tok512.bin", "--out", self.model)

    def calib_tokens(self, nsamples, seqlen, seed=0):
        """The windows `symprune prune --calib first_half --nsamples N --seqlen T --seed S` draws."""
        out = self.root / f"calib_{nsamples}x{seqlen}_s{seed}.u32"
        if not out.exists():
            symprune("calib", "--tokenizer", self.model, "--calib", self.first, "--nsamples", nsamples,
                     "--seqlen", seqlen, "--seed", seed, "--out", out)
        data = np.fromfile(out, dtype="<u4")
        assert data.size == nsamples * seqlen
        return data.reshape(nsamples, seqlen).astype(np.int64)

    def eval_ids(self):
        out = symprune("tokenize", "--tokenizer", self.model, "--text-file", self.second)
        return [int(x) for x in out.stdout.strip().split(",")]


def linear_names(n_layers=5):
    names = []
    for i in range(n_layers):
        for lin in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            names.append(f"model.layers.{i}.{lin}.weight")
    return names


def load_tensors(model_dir):
    """{name: array} over every safetensors file of a directory (sharded or not), in the stored dtype."""
    model_dir = Path(model_dir)
    tensors = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        for key, value in load_file(str(path)).items():
            assert key not in tensors, f"{key} stored twice"
            tensors[key] = value
    return tensors


PROVENANCE = "symprune_provenance.json"


def tree_digest(root):
    """{relative path: sha256} of every file below root (to prove a directory was not touched)."""
    root = Path(root)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def output_digest(root):
    """tree_digest of a symprune output without its provenance file, which records when and how the run
    was made (so two runs never have the same one); every other byte must match between equal runs."""
    digest = tree_digest(root)
    assert PROVENANCE in digest, f"{root} has no {PROVENANCE}"
    del digest[PROVENANCE]
    return digest


def read_json(path):
    return json.loads(Path(path).read_text())


def assert_only_the_mask_changed(name, dense, plain, refined, nm):
    """A refined weight tensor keeps every unpruned weight of the dense one, the pruned count of each row
    of the unrefined `plain` one and, for nm = (N, M), N pruned in every group of M."""
    p, r = plain == 0, refined == 0
    assert np.array_equal(refined[~r], dense[~r]), name  # kept weights untouched
    assert np.array_equal(p.sum(axis=1), r.sum(axis=1)), name  # count per row unchanged
    if nm:
        assert np.all(r.reshape(-1, nm[1]).sum(axis=1) == nm[0]), name


def shard_layout(stories, tmp_path, parts=2):
    """A model directory holding the stories260K files but its weights, the weights, and a split of their
    sorted names into `parts` shards of nearly equal counts (to be written by the test)."""
    model = tmp_path / "model"
    model.mkdir()
    for path in stories.model.iterdir():
        if path.suffix != ".safetensors":
            shutil.copy(path, model / path.name)
    tensors = load_file(str(stories.model / "model.safetensors"))
    groups = np.array_split(np.array(sorted(tensors)), parts)
    return model, tensors, {f"model-{i + 1:05d}-of-{parts:05d}.safetensors": [str(name) for name in group]
                            for i, group in enumerate(groups)}


def sharded_stories(stories, tmp_path, parts):
    """stories260K as `parts` shards with their index (shard_layout); returns the model directory and the
    shards' tensor names, in shard order."""
    model, tensors, shards = shard_layout(stories, tmp_path, parts)
    weight_map = {}
    for shard, names in shards.items():
        save_file({name: tensors[name] for name in names}, str(model / shard), metadata={"format": "pt"})
        weight_map.update({name: shard for name in names})
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return model, list(shards.values())


def head_overflowing_model(source, model):
    """A copy of the model directory `source` at `model` with an untied head of 3e38 everywhere: pruning
    never reads the head, so a run gets as far as its final evaluation, whose logits overflow."""
    shutil.copytree(source, model)
    tensors = load_file(str(model / "model.safetensors"))
    tensors["lm_head.weight"] = np.full_like(tensors["model.embed_tokens.weight"], 3e38)
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((model / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (model / "config.json").write_text(json.dumps(config, indent=2))
    return model
