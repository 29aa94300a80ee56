"""The slurm/ scripts' own checks, without a cluster: bad usage fails before anything is submitted or run,
with a clear message, and the collector writes its table with the missing cells marked."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

SOURCE = Path(os.environ["SYMPRUNE_SOURCE_DIR"])
SLURM = SOURCE / "slurm"


def bash(script, env=None, cwd=None):
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=60)


def test_every_script_parses():
    for path in [*SLURM.glob("*.sbatch"), *SLURM.glob("*.sh")]:
        proc = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path}: {proc.stderr}"


def test_job_without_output_fails_with_the_reason(tmp_path):
    proc = bash(f"source {SLURM}/symprune_job.sh; symprune_job_run srun --model m --method wanda",
                env={"SYMPRUNE_DIST": "/bin/true"})
    assert proc.returncode == 2
    assert "no output: give --out DIR (or SYMPRUNE_OUT, or out in the recipe)" in proc.stderr


def test_job_with_unknown_launcher_or_binary_fails(tmp_path):
    proc = bash(f"source {SLURM}/symprune_job.sh; symprune_job_run ssh --out {tmp_path}/o")
    assert proc.returncode == 2 and "launcher must be srun or mpirun, not 'ssh'" in proc.stderr
    proc = bash(f"source {SLURM}/symprune_job.sh; symprune_job_run srun --out {tmp_path}/o",
                env={"SYMPRUNE_DIST": str(tmp_path / "missing")})
    assert proc.returncode == 2 and "is not an executable" in proc.stderr


def test_sweep_cell_outside_an_array_or_beyond_the_grid_fails(tmp_path):
    grid = tmp_path / "grid.tsv"
    grid.write_text("# comment\n\nonly  --method wanda --sparsity 0.5\n")
    env = {k: v for k, v in os.environ.items() if k != "SLURM_ARRAY_TASK_ID"}
    proc = subprocess.run(["bash", "-c", f"source {SLURM}/symprune_job.sh; symprune_job_sweep_cell {grid} {tmp_path}"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "not an array task" in proc.stderr
    proc = bash(f"source {SLURM}/symprune_job.sh; symprune_job_sweep_cell {grid} {tmp_path}",
                env={"SLURM_ARRAY_TASK_ID": "1"})
    assert proc.returncode == 2 and f"{grid} has no cell 1 (it has 1)" in proc.stderr


def test_submit_sweep_refuses_repeated_cells_and_another_grid(tmp_path):
    grid = tmp_path / "grid.tsv"
    grid.write_text("a --method wanda --sparsity 0.5\na --method ria --sparsity 0.5\n")
    # sbatch is never reached: a stand-in that fails loudly if it were.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "sbatch").write_text("#!/bin/sh\necho sbatch must not run >&2\nexit 99\n")
    (fake_bin / "sbatch").chmod(0o755)
    env = {"PATH": f"{fake_bin}:{os.environ['PATH']}"}
    proc = bash(f"bash {SLURM}/submit_sweep.sh {grid} {tmp_path}/sweep", env=env)
    assert proc.returncode == 2 and "cell names repeat" in proc.stderr and " a" in proc.stderr
    sweep = tmp_path / "sweep2"
    sweep.mkdir()
    (sweep / "grid.tsv").write_text("other --method magnitude --sparsity 0.5\n")
    grid.write_text("a --method wanda --sparsity 0.5\n")
    proc = bash(f"bash {SLURM}/submit_sweep.sh {grid} {sweep}", env=env)
    assert proc.returncode == 2 and "holds another grid" in proc.stderr
    proc = bash(f"bash {SLURM}/submit_sweep.sh {grid}", env=env)
    assert proc.returncode == 2 and "submit_sweep.sh GRID SWEEP_DIR" in proc.stderr


def test_collector_marks_missing_cells_and_exits_1(tmp_path):
    sweep = tmp_path / "sweep"
    (sweep / "done-cell").mkdir(parents=True)
    (sweep / "grid.tsv").write_text("# two cells\ndone-cell --method wanda --nm 2:4\nlost-cell --method ria --sparsity 0.5\n")
    report = {"config": {"method": "wanda", "nm": "2:4", "refine": {"method": "dsnot", "guard": True}},
              "sparsity": {"total": 0.5},
              "perplexity": {"dense": 6.25, "pruned": 9.125}, "timings": {"total": 12.5},
              "resumed": {"checkpoint": "x.h5", "block": 3}}
    (sweep / "done-cell" / "report.json").write_text(json.dumps(report))
    proc = subprocess.run(["python3", SLURM / "collect_sweep.py", sweep], capture_output=True, text=True)
    assert proc.returncode == 1 and "not done: lost-cell" in proc.stderr
    rows = json.loads((sweep / "results.json").read_text())["rows"]
    assert [(r["cell"], r["status"]) for r in rows] == [("done-cell", "done"), ("lost-cell", "missing")]
    assert rows[0]["mask"] == "2:4" and rows[0]["perplexity_pruned"] == 9.125 and rows[0]["resumed_at_block"] == 3
    assert rows[1]["options"] == "--method ria --sparsity 0.5"
    markdown = (sweep / "results.md").read_text()
    assert "| done-cell | wanda | 2:4 | dsnot guarded | 0.5000 | 6.250 | 9.125 | 12.5 | 3 | done |" in markdown
    assert "| lost-cell | – | – | – | – | – | – | – | – | missing |" in markdown
    assert "1 of 2 cells done" in markdown
    proc = subprocess.run(["python3", SLURM / "collect_sweep.py", tmp_path], capture_output=True, text=True)
    assert proc.returncode == 2 and "is " in proc.stderr and "a sweep directory" in proc.stderr


def test_defaults_yield_to_the_recipe(tmp_path):
    """Options a recipe sets get no default on the command line (it would override the recipe); the output
    named only by the recipe names the checkpoint. The step is /bin/echo under mpirun: it prints the
    command line, and since no run finished (no .done marker) the job reports a failure."""
    recipe = tmp_path / "run.toml"
    recipe.write_text(f'method = "wanda"\nout = "{tmp_path}/pruned"\nreport: "{tmp_path}/mine.json"\n'
                      "threads = 3  # the recipe's\n")
    proc = bash(f"source {SLURM}/symprune_job.sh; symprune_job_run mpirun --recipe {recipe}",
                env={"SYMPRUNE_DIST": "/bin/echo", "SLURM_NTASKS": "1", "SLURM_CPUS_PER_TASK": "2",
                     "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    echoed = next(line for line in proc.stdout.splitlines() if line.startswith("--recipe"))
    assert echoed == f"--recipe {recipe} --checkpoint {tmp_path}/pruned.checkpoint.h5 --resume auto"
    assert f"{tmp_path}/pruned.checkpoint.h5.done is missing" in proc.stdout


def test_environment_options_yield_to_the_recipe_and_to_the_exclusive_option(tmp_path):
    """SYMPRUNE_* variables fill only options that neither the arguments nor the recipe give: a recipe's
    2:4 mask keeps SYMPRUNE_SPARSITY out (it would replace the mask), and so does --nm on the command line
    (the run would refuse --sparsity with --nm); SYMPRUNE_RECIPE counts like --recipe."""
    recipe = tmp_path / "run.yaml"
    recipe.write_text(f'method: ria\nnm: "2:4"\nout: {tmp_path}/pruned\n')
    env = {"SYMPRUNE_DIST": "/bin/echo", "SLURM_NTASKS": "1", "SLURM_CPUS_PER_TASK": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "SYMPRUNE_SPARSITY": "0.7", "SYMPRUNE_METHOD": "wanda",
           "SYMPRUNE_CALIB": "c4.jsonl"}

    def echoed(command, extra_env):
        proc = bash(f"source {SLURM}/symprune_job.sh; {command}", env={**env, **extra_env})
        return next(line for line in proc.stdout.splitlines() if line.startswith("--")).split()

    args = echoed(f"symprune_job_run mpirun --recipe {recipe}", {})
    assert "--sparsity" not in args and "--method" not in args, args
    assert args[args.index("--calib") + 1] == "c4.jsonl"
    assert echoed("symprune_job_run mpirun", {"SYMPRUNE_RECIPE": str(recipe)}) == args
    args = echoed(f"symprune_job_run mpirun --model m --nm 2:4 --out {tmp_path}/o", {})
    assert "--sparsity" not in args and args[args.index("--method") + 1] == "wanda", args
    # SYMPRUNE_EXTRA_ARGS counts as given too.
    args = echoed(f"symprune_job_run mpirun --model m --out {tmp_path}/o", {"SYMPRUNE_EXTRA_ARGS": "--nm 4:8"})
    assert "--sparsity" not in args and args[args.index("--nm") + 1] == "4:8", args
    # Both variables with neither option given: refused, not one of them chosen.
    proc = bash(f"source {SLURM}/symprune_job.sh; symprune_job_run mpirun --model m --out {tmp_path}/o",
                env={**env, "SYMPRUNE_NM": "2:4"})
    assert proc.returncode == 2 and "SYMPRUNE_SPARSITY and SYMPRUNE_NM are both set" in proc.stderr, proc.stderr


def test_out_with_a_trailing_slash_gets_its_defaults_beside_it(tmp_path):
    """--out DIR/ names the report and checkpoint DIR.report.json and DIR.checkpoint.h5, beside the output
    directory (inside it they would be refused: the run replaces it)."""
    proc = bash(f"source {SLURM}/symprune_job.sh; symprune_job_run mpirun --model m --out {tmp_path}/pruned/",
                env={"SYMPRUNE_DIST": "/bin/echo", "SLURM_NTASKS": "1", "SLURM_CPUS_PER_TASK": "1",
                     "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    echoed = next(line for line in proc.stdout.splitlines() if line.startswith("--model"))
    assert echoed == (f"--model m --out {tmp_path}/pruned/ --report {tmp_path}/pruned.report.json "
                      f"--checkpoint {tmp_path}/pruned.checkpoint.h5 --resume auto --threads 1")


def fake_commands(tmp_path, step_body):
    """A bin directory with stand-ins: srun and mpirun write their options to launcher_args and run the step,
    scontrol writes its arguments to scontrol_calls and fails (so the job script does not wait for Slurm to
    end it); and the step: a bash script that marks itself started and then runs step_body."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    launcher = (f'#!/bin/bash\nwhile [[ $1 == -* ]]; do printf "%s\\n" "$1" >> {tmp_path}/launcher_args; '
                'if [[ $1 == -n || $1 == -x || $1 == --map-by ]]; then shift; printf "%s\\n" "$1" >> '
                f'{tmp_path}/launcher_args; fi; shift; done\nexec "$@"\n')
    (fake_bin / "srun").write_text(launcher)
    (fake_bin / "mpirun").write_text(launcher)
    (fake_bin / "scontrol").write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/scontrol_calls\nexit 1\n')
    step = tmp_path / "step.sh"
    step.write_text(f"#!/bin/bash\ntouch {tmp_path}/started\n{step_body}\n")
    for path in (fake_bin / "srun", fake_bin / "mpirun", fake_bin / "scontrol", step):
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "SYMPRUNE_DIST": str(step)}
    for name in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_CPUS_PER_TASK", "SYMPRUNE_THREADS"):
        env.pop(name, None)
    return env


def run_job(tmp_path, env, launcher="srun", warnings=1, sent=signal.SIGUSR1):
    """Runs symprune_job_run with --out tmp_path/o and sends it `sent` (SIGUSR1: the warning) `warnings`
    times (0.5 s apart) once the step has started. Returns (exit code, log)."""
    (tmp_path / "started").unlink(missing_ok=True)
    job = subprocess.Popen(["bash", "-c", f"source {SLURM}/symprune_job.sh; symprune_job_run {launcher} --out "
                            f"{tmp_path}/o"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 30
    while warnings and not (tmp_path / "started").exists() and time.time() < deadline:
        time.sleep(0.05)
    for i in range(warnings):
        if i:
            time.sleep(0.5)
        job.send_signal(sent)
    stdout, stderr = job.communicate(timeout=60)
    return job.returncode, stdout + stderr


def test_the_warning_signal_is_passed_on_to_the_step_once(tmp_path):
    """The warning sent twice (`scancel --signal=USR1 --batch` again) used to reach the ranks twice: a second
    signal stops them at once, without saving. A stand-in step counts the SIGUSR1 it gets and exits 75."""
    env = fake_commands(tmp_path, f"trap 'echo usr1 >> {tmp_path}/signals' USR1\n"
                        "for i in $(seq 100); do sleep 0.05; done\nexit 75")
    status, log = run_job(tmp_path, env, warnings=2)
    assert status == 75, log
    assert (tmp_path / "signals").read_text() == "usr1\n", log
    assert "SIGUSR1 again: the ranks were asked already; not passed on" in log


def test_any_end_of_the_step_after_the_warning_is_the_stop_it_asked_for(tmp_path):
    """srun --kill-on-bad-exit kills the ranks still tearing down when the first exits 75, and a block that
    outlasts the lead time is killed at the time limit: srun then reports 137 or 143, not 75. After the
    warning that is still the stop (requeued); without a warning it is a failure."""
    env = fake_commands(tmp_path, "trap 'exit 137' USR1\nfor i in $(seq 100); do sleep 0.05; done\nexit 3")
    status, log = run_job(tmp_path, env)
    assert status == 75, log
    assert "the step ended with exit code 137 after the warning: taken as the stop it asked for" in log
    status, log = run_job(tmp_path, env, warnings=0)
    assert status == 3 and "symprune_dist failed with exit code 3" in log, log


def test_starts_that_save_no_block_are_requeued_only_a_few_times_in_a_row(tmp_path):
    """A warning before any block is saved (the allocation too short for loading and one block, or for the
    final write and evaluation) would requeue the job for ever: the third such start in a row is not
    requeued. A start that saves a block (the checkpoint file is replaced) counts from 0 again."""
    checkpoint = tmp_path / "o.checkpoint.h5"
    env = fake_commands(tmp_path, f"trap 'if [[ -e {tmp_path}/save ]]; then echo new > {checkpoint}.tmp; "
                        f"mv {checkpoint}.tmp {checkpoint}; fi; exit 75' USR1\n"
                        "for i in $(seq 100); do sleep 0.05; done\nexit 3")
    env.update(SLURM_JOB_ID="42", SLURM_RESTART_COUNT="1")
    calls = tmp_path / "scontrol_calls"
    for start in (1, 2):
        status, log = run_job(tmp_path, env)
        assert status == 75 and f"this start saved no block ({start} in a row; up to 2 are requeued)" in log, log
        assert calls.read_text().splitlines() == ["requeue 42"] * start, log
    status, log = run_job(tmp_path, env)
    assert status == 75 and "error: 3 starts in a row saved no block" in log, log
    assert calls.read_text().splitlines() == ["requeue 42"] * 2, log
    # A start that saves a block: requeued, and the count starts again.
    (tmp_path / "save").touch()
    status, log = run_job(tmp_path, env)
    assert status == 75 and "saved no block" not in log, log
    assert not (tmp_path / "o.checkpoint.h5.idle-starts").exists()
    assert calls.read_text().splitlines() == ["requeue 42"] * 3, log
    # A start ended by SIGTERM without a warning (scancel, preemption) does not count.
    (tmp_path / "o.checkpoint.h5.idle-starts").write_text("2\n")
    run_job(tmp_path, env, sent=signal.SIGTERM)
    assert (tmp_path / "o.checkpoint.h5.idle-starts").read_text() == "2\n"
    # A new submission (not a requeued start) counts from 0 too.
    (tmp_path / "save").unlink()
    (tmp_path / "o.checkpoint.h5.idle-starts").write_text("7\n")
    status, log = run_job(tmp_path, {**env, "SLURM_RESTART_COUNT": "0"})
    assert "this start saved no block (1 in a row" in log, log


def test_launchers_get_the_tasks_cpus_and_threads_are_pinned_only_under_srun(tmp_path):
    """srun takes --cpus-per-task from the allocation no longer (Slurm 22.05): the script passes it, and srun
    binds each rank to those CPUs, inside which the threads are pinned. mpirun binds more than two ranks to
    a whole socket, where pinned threads of every rank would share cores: there they are left unpinned
    unless the environment pins them. A thread count that is not a count is refused."""
    env = {**fake_commands(tmp_path, "exit 3"), "SLURM_CPUS_PER_TASK": "3", "SLURM_NTASKS": "2"}
    for name in ("OMP_PROC_BIND", "OMP_PLACES"):
        env.pop(name, None)
    args = tmp_path / "launcher_args"
    run_job(tmp_path, env, warnings=0)
    assert "--cpus-per-task=3" in args.read_text().split(), args.read_text()
    args.unlink()
    run_job(tmp_path, env, launcher="mpirun", warnings=0)
    exported = args.read_text().split()
    assert "OMP_NUM_THREADS" in exported and "OMP_PROC_BIND" not in exported, exported
    args.unlink()
    run_job(tmp_path, {**env, "OMP_PROC_BIND": "spread"}, launcher="mpirun", warnings=0)
    assert "OMP_PROC_BIND" in args.read_text().split(), args.read_text()
    status, log = run_job(tmp_path, {**env, "SYMPRUNE_THREADS": "auto"}, warnings=0)
    assert status == 2 and "threads per rank (SYMPRUNE_THREADS, else --cpus-per-task) must be a count, not 'auto'" \
        in log, log


def test_a_sweep_line_may_not_set_where_its_cell_writes(tmp_path):
    grid = tmp_path / "grid.tsv"
    grid.write_text("a --method wanda --sparsity 0.5 --report=/tmp/elsewhere.json\n")
    proc = bash(f"source {SLURM}/symprune_job.sh; symprune_job_sweep_cell {grid} {tmp_path}/sweep",
                env={"SLURM_ARRAY_TASK_ID": "0", "SYMPRUNE_DIST": "/bin/true"})
    assert proc.returncode == 2, proc.stderr
    assert f"{grid}, cell 0 (a): --report is set by the sweep" in proc.stderr
    assert not (tmp_path / "sweep").exists()
