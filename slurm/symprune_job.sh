# shellcheck shell=bash
# Sourced by the batch scripts of slurm/: runs one symprune_dist job step and makes it preemption-safe.
#
#   symprune_job_run LAUNCHER [symprune options...]     LAUNCHER: srun | mpirun
#
# Options come from the arguments (and the recipe they name), and from the environment for those not given
# there:
#   SYMPRUNE_MODEL SYMPRUNE_METHOD SYMPRUNE_SPARSITY SYMPRUNE_NM SYMPRUNE_RECIPE SYMPRUNE_CALIB
#   SYMPRUNE_EVAL SYMPRUNE_OUT SYMPRUNE_REPORT SYMPRUNE_CHECKPOINT (each the value of the option of that
#   name), SYMPRUNE_EXTRA_ARGS (more options, split on spaces, counted as given like the arguments).
# Defaults added when not given: --report OUT.report.json, --checkpoint OUT.checkpoint.h5 (in
# SYMPRUNE_CHECKPOINT_DIR instead when set) and --resume auto, so every start of the job, first or
# requeued, is the same command: it starts fresh, continues from the newest checkpoint, or (when the run
# finished before) prints "already complete" and exits 0.
#
# Requeue: the job is sent SIGUSR1 (#SBATCH --signal=B:USR1@SECONDS, or `scancel --signal=USR1 --batch`);
# this script forwards it to the ranks, which finish their block, save the checkpoint and exit 75; the
# script then runs `scontrol requeue` and the job starts again later, resuming. After the warning any end
# of the step counts as that stop (a launcher may report 137 instead of 75: srun --kill-on-bad-exit ends
# the ranks still tearing down when the first exits, and a block that outlasts the lead time is killed at
# the time limit); the checkpoint holds the blocks saved before. A warned start that saved no block
# (the time before the warning covered no block, or only part of the final write and evaluation) is
# idle: SYMPRUNE_MAX_IDLE_REQUEUES (default 2) idle starts in a row are requeued, the next one is not,
# since every further start would end the same way (a new submission counts from 0). SIGTERM (scancel,
# preemption) reaches the ranks from Slurm itself: they save at the next block boundary if it comes
# before KillWait (mpirun passes it on again, which stops them at once: the checkpoint holds the blocks
# saved before); the script reports 75 when the checkpoint exists, and the job is requeued only when
# Slurm does so (preemption with PreemptMode=REQUEUE), never after a user's scancel. Needs bash 4.4 or
# later.
#
# Other environment: SYMPRUNE_HOME (the checkout with build/apps; default SLURM_SUBMIT_DIR),
# SYMPRUNE_DIST (the symprune_dist binary; default SYMPRUNE_HOME/build/apps/symprune_dist, else PATH),
# SYMPRUNE_MODULES (environment modules to `module load` first), SYMPRUNE_SRUN_MPI (srun --mpi, default
# pmix), SYMPRUNE_MPIRUN_ARGS (extra mpirun options), SYMPRUNE_THREADS (CPU threads per rank; default
# SLURM_CPUS_PER_TASK, else 1), SYMPRUNE_MAX_IDLE_REQUEUES (see above).

symprune_job_log() { printf '[symprune-job %s] %s\n' "$(date '+%F %T')" "$*"; }
symprune_job_die() {
  printf '[symprune-job] error: %s\n' "$*" >&2
  exit 2
}

# Value of option $1 in the array named by $2 (--name VALUE or --name=VALUE), or nothing.
symprune_job_option() {
  local name=$1
  local -n list=$2
  local i
  for ((i = 0; i < ${#list[@]}; i++)); do
    if [[ ${list[i]} == "$name" ]]; then
      printf '%s' "${list[i + 1]:-}"
      return 0
    elif [[ ${list[i]} == "$name="* ]]; then
      printf '%s' "${list[i]#"$name="}"
      return 0
    fi
  done
  return 1
}

# Value of top-level key $1 (or its dashed form) in the recipe file $2 (TOML `key = value` or YAML
# `key: value`, quotes removed), or nothing: options a recipe sets are not given defaults here, since the
# command line would override them.
symprune_job_recipe_value() {
  local key=$1 recipe=$2
  [[ -n $recipe && -f $recipe ]] || return 1
  local pattern="^[[:space:]]*(${key}|${key//_/-})[[:space:]]*[:=][[:space:]]*"
  local line
  line=$(grep -m 1 -E "$pattern" "$recipe") || return 1
  line=$(sed -E "s/$pattern//; s/[[:space:]]+#.*$//; s/[[:space:]]+$//" <<<"$line")
  line=${line#[\"\']}
  line=${line%[\"\']}
  printf '%s' "$line"
}

# Value of option $1 from the arguments (array $2), else from the recipe they name.
symprune_job_setting() {
  local name=$1
  local -n from=$2
  symprune_job_option "$name" from && return 0
  local recipe
  recipe=$(symprune_job_option --recipe from) || return 1
  symprune_job_recipe_value "${name#--}" "$recipe"
}

# Identity of the checkpoint file (inode, modification time, size), or "none": a save writes a new file and
# renames it into place, so the stamp changes exactly when the step saved a block.
symprune_job_checkpoint_stamp() {
  stat -c '%i %Y %s' -- "$1" 2>/dev/null || printf 'none'
}

# $1: the launcher (srun | mpirun).
symprune_job_environment() {
  if [[ -n ${SYMPRUNE_MODULES:-} ]]; then
    command -v module >/dev/null 2>&1 || symprune_job_die "SYMPRUNE_MODULES is set but 'module' is not available"
    # shellcheck disable=SC2086
    module load $SYMPRUNE_MODULES || symprune_job_die "module load $SYMPRUNE_MODULES failed"
  fi
  # One rank per GPU or per CPU slot; its CPU threads are the task's CPUs.
  export OMP_NUM_THREADS=${SYMPRUNE_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
  [[ $OMP_NUM_THREADS =~ ^[1-9][0-9]*$ ]] ||
    symprune_job_die "threads per rank (SYMPRUNE_THREADS, else --cpus-per-task) must be a count, not '$OMP_NUM_THREADS'"
  # srun binds each rank to its own --cpus-per-task CPUs, so its threads are pinned inside that set. mpirun
  # binds more than two ranks to a whole socket: pinned there, thread k of every rank on the socket would
  # share one core, so under mpirun the threads are left unpinned unless the environment pins them.
  if [[ $1 == srun ]]; then
    export OMP_PROC_BIND=${OMP_PROC_BIND:-close} OMP_PLACES=${OMP_PLACES:-cores}
  fi
  # NCCL (--comm nccl): warnings only; the cluster's own NCCL_SOCKET_IFNAME / NCCL_IB_HCA pass through.
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
  # Open MPI under srun: let it find Slurm's PMIx server; no warnings about the missing InfiniBand.
  export OMPI_MCA_btl_base_warn_component_unused=0
}

symprune_job_run() {
  # Namerefs (local -n) and empty arrays expanded under set -u need bash 4.4 or later.
  if ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 4))); then
    symprune_job_die "these scripts need bash 4.4 or later; this is bash $BASH_VERSION"
  fi
  # The signals are taken from the start: a warning while the options are read or modules load (before the
  # step exists) must not kill this shell, which would end the job unrequeued.
  local warned=0 forwarded=0 terminated=0 status pid=
  # Passes the warning to the step once, when both exist.
  symprune_job_forward_warning() {
    ((warned && !forwarded)) && [[ -n $pid ]] || return 0
    forwarded=1
    symprune_job_log "SIGUSR1: asking the ranks to checkpoint and stop"
    kill -USR1 "$pid" 2>/dev/null
  }
  symprune_job_usr1() {
    if ((warned)); then
      symprune_job_log "SIGUSR1 again: the ranks were asked already; not passed on (a second signal would stop" \
        "them at once, without saving)"
      return
    fi
    warned=1
    [[ -n $pid ]] || symprune_job_log "SIGUSR1 before the step started"
    symprune_job_forward_warning
  }
  trap 'symprune_job_usr1' USR1
  trap 'terminated=1' TERM
  local launcher=$1
  shift
  [[ $launcher == srun || $launcher == mpirun ]] || symprune_job_die "launcher must be srun or mpirun, not '$launcher'"
  local -a args=("$@")
  if [[ -n ${SYMPRUNE_EXTRA_ARGS:-} ]]; then
    local -a extra
    read -r -a extra <<<"$SYMPRUNE_EXTRA_ARGS"
    args+=("${extra[@]}")
  fi
  # The recipe first: an option it sets counts as given. --sparsity and --nm exclude each other, so either
  # one given (by the arguments or the recipe) keeps the other's variable out, and both variables at once
  # are refused rather than one chosen.
  if [[ -n ${SYMPRUNE_RECIPE:-} ]] && ! symprune_job_option --recipe args >/dev/null; then
    args+=(--recipe "$SYMPRUNE_RECIPE")
  fi
  local -a given=("${args[@]}")
  if [[ -n ${SYMPRUNE_SPARSITY:-} && -n ${SYMPRUNE_NM:-} ]] && ! symprune_job_setting --sparsity given >/dev/null &&
    ! symprune_job_setting --nm given >/dev/null; then
    symprune_job_die "SYMPRUNE_SPARSITY and SYMPRUNE_NM are both set: they exclude each other; unset one"
  fi
  local pair var option
  for pair in MODEL:--model METHOD:--method SPARSITY:--sparsity NM:--nm CALIB:--calib EVAL:--eval OUT:--out \
    REPORT:--report CHECKPOINT:--checkpoint; do
    var=SYMPRUNE_${pair%%:*} option=${pair#*:}
    [[ -n ${!var:-} ]] || continue
    symprune_job_setting "$option" given >/dev/null && continue
    if [[ $option == --sparsity ]] && symprune_job_setting --nm given >/dev/null; then continue; fi
    if [[ $option == --nm ]] && symprune_job_setting --sparsity given >/dev/null; then continue; fi
    args+=("$option" "${!var}")
  done

  local out
  out=$(symprune_job_setting --out args) || symprune_job_die "no output: give --out DIR (or SYMPRUNE_OUT, or out in the recipe)"
  [[ -n $out ]] || symprune_job_die "--out needs a directory"
  # The names derived from it (OUT.report.json, OUT.checkpoint.h5) sit beside the directory, not in it.
  while [[ $out == */ && $out != / ]]; do out=${out%/}; done
  mkdir -p "$(dirname "$out")" || symprune_job_die "cannot create the directory of --out $out"
  if ! symprune_job_setting --report args >/dev/null; then args+=(--report "$out.report.json"); fi
  local checkpoint
  if ! checkpoint=$(symprune_job_setting --checkpoint args); then
    local dir=${SYMPRUNE_CHECKPOINT_DIR:-$(dirname "$out")}
    mkdir -p "$dir" || symprune_job_die "cannot create SYMPRUNE_CHECKPOINT_DIR $dir"
    checkpoint=$dir/$(basename "$out").checkpoint.h5
    args+=(--checkpoint "$checkpoint")
  fi
  if ! symprune_job_setting --resume args >/dev/null; then args+=(--resume auto); fi

  local home=${SYMPRUNE_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}
  local dist=${SYMPRUNE_DIST:-}
  if [[ -z $dist ]]; then
    if [[ -x $home/build/apps/symprune_dist ]]; then
      dist=$home/build/apps/symprune_dist
    else
      dist=$(command -v symprune_dist) ||
        symprune_job_die "symprune_dist not found: set SYMPRUNE_DIST, SYMPRUNE_HOME (a build with build/apps), or load its module"
    fi
  fi
  [[ -x $dist ]] || symprune_job_die "SYMPRUNE_DIST=$dist is not an executable"
  symprune_job_environment "$launcher"
  if ! symprune_job_setting --threads args >/dev/null; then args+=(--threads "$OMP_NUM_THREADS"); fi

  local -a command
  if [[ $launcher == srun ]]; then
    # srun does not take --cpus-per-task from the allocation since Slurm 22.05: without it every rank is
    # bound to one CPU and its OMP_NUM_THREADS threads share it.
    command=(srun --mpi="${SYMPRUNE_SRUN_MPI:-pmix}" --kill-on-bad-exit=1
      ${SLURM_CPUS_PER_TASK:+"--cpus-per-task=$SLURM_CPUS_PER_TASK"} "$dist" "${args[@]}")
  else
    local -a mpirun_args
    read -r -a mpirun_args <<<"${SYMPRUNE_MPIRUN_ARGS:-}"
    ((EUID == 0)) && mpirun_args+=(--allow-run-as-root)
    local name
    for name in OMP_NUM_THREADS OMP_PROC_BIND OMP_PLACES NCCL_DEBUG; do
      [[ -n ${!name:-} ]] && mpirun_args+=(-x "$name")
    done
    # Open MPI reads the allocation (nodes, tasks per node) from Slurm; one rank per task.
    command=(mpirun -n "${SLURM_NTASKS:-1}" "${mpirun_args[@]}" "$dist" "${args[@]}")
  fi

  symprune_job_log "job ${SLURM_JOB_ID:-?}${SLURM_ARRAY_TASK_ID:+ (array task $SLURM_ARRAY_TASK_ID)}," \
    "start $((${SLURM_RESTART_COUNT:-0} + 1)) (requeued ${SLURM_RESTART_COUNT:-0} times)," \
    "${SLURM_JOB_NUM_NODES:-1} node(s) ${SLURM_JOB_NODELIST:-$(hostname)}, ${SLURM_NTASKS:-1} rank(s)," \
    "$OMP_NUM_THREADS thread(s) each"
  symprune_job_log "run: ${command[*]}"

  # The step runs in the background so this shell can take the warning signal and pass it on. SIGTERM
  # (scancel, preemption) is not passed on, since Slurm sends it to the step itself (a second one would
  # stop the ranks at once, unsaved); this shell only outlives it to report the end.
  # The warning is passed on once: a second SIGUSR1 (the warning sent twice) would stop the ranks at once,
  # unsaved. A warning before the step started: it is not started (the job is requeued below).
  # Starts in a row that saved no block, kept beside the checkpoint across requeues; a new submission
  # (not a requeued start) counts from 0.
  local idle_file=$checkpoint.idle-starts max_idle=${SYMPRUNE_MAX_IDLE_REQUEUES:-2}
  [[ $max_idle =~ ^[0-9]+$ ]] || symprune_job_die "SYMPRUNE_MAX_IDLE_REQUEUES must be a count, not '$max_idle'"
  ((${SLURM_RESTART_COUNT:-0} > 0)) || rm -f -- "$idle_file"
  local saved_before
  saved_before=$(symprune_job_checkpoint_stamp "$checkpoint")
  if ((terminated)); then
    symprune_job_log "SIGTERM before the step started: not starting it"
    trap - USR1 TERM
    return 143
  elif ((warned)); then
    symprune_job_log "the warning came before the step started: not starting it"
    status=75
  else
    "${command[@]}" &
    pid=$!
    symprune_job_forward_warning  # a warning between the check above and pid=$!
  fi
  while [[ -n $pid ]]; do
    wait "$pid"
    status=$?
    # wait returns >128 when a trapped signal interrupted it. The step may still run (wait again), or have
    # ended meanwhile: wait then gives the status bash kept for it (127 once it was given: status stands).
    ((status > 128)) || break
    kill -0 "$pid" 2>/dev/null && continue
    local ended
    wait "$pid" 2>/dev/null
    ended=$?
    ((ended != 127)) && status=$ended
    break
  done
  # The step has ended: a late warning is ignored (the default action would end this shell before it
  # requeues or reports).
  trap '' USR1
  trap - TERM

  # The ranks exit 75 after saving, but the launcher may report something else: srun --kill-on-bad-exit
  # ends the ranks still tearing down when the first one exits (137 if killed), a block that outlasts the
  # warning's lead time is killed at the time limit, and a signalled mpirun exits 1 whatever the ranks did.
  # Under scancel or preemption Slurm's SIGTERM reaches the ranks and the launcher: mpirun passes it on (a
  # second signal stops them at once), and KillWait ends ranks still working. In each case the checkpoint
  # holds the blocks saved before the block that was running.
  if ((status != 0 && status != 75)); then
    if ((warned)); then
      symprune_job_log "the step ended with exit code $status after the warning: taken as the stop it asked for" \
        "(the checkpoint holds the blocks saved before; a block in progress is done again on resuming)"
      status=75
    elif ((terminated)) && [[ -e $checkpoint ]]; then
      symprune_job_log "SIGTERM: the step exited $status; $checkpoint holds the blocks saved before the signal" \
        "(the block in progress is done again on resuming)"
      status=75
    fi
  fi
  case $status in
    0)
      # A finished run always leaves the marker; a launcher can exit 0 when its step never started.
      if [[ ! -e $checkpoint.done ]]; then
        symprune_job_log "error: the step exited 0 but the run did not finish ($checkpoint.done is missing)"
        return 1
      fi
      rm -f -- "$idle_file"
      symprune_job_log "done: output $out"
      return 0
      ;;
    75)
      local idle=0
      if [[ $(symprune_job_checkpoint_stamp "$checkpoint") != "$saved_before" ]]; then
        rm -f -- "$idle_file"
      elif ((warned)); then  # only warned starts count (a preemption's SIGTERM does not)
        idle=$(cat -- "$idle_file" 2>/dev/null)
        [[ $idle =~ ^[0-9]+$ ]] || idle=0
        idle=$((idle + 1))
        printf '%s\n' "$idle" >"$idle_file"
        symprune_job_log "this start saved no block ($idle in a row; up to $max_idle are requeued)"
      fi
      if ((warned && idle > max_idle)); then
        symprune_job_log "error: $idle starts in a row saved no block: the time before the warning covers" \
          "neither loading the model and one block nor the final write and evaluation; not requeueing" \
          "(give the job more --time, then submit it again; SYMPRUNE_MAX_IDLE_REQUEUES=$max_idle)"
      elif ((warned)) && [[ -n ${SLURM_JOB_ID:-} ]]; then
        symprune_job_log "stopped; requeueing job $SLURM_JOB_ID (it resumes with --resume auto)"
        if scontrol requeue "$SLURM_JOB_ID"; then
          # Slurm ends this batch script itself when it requeues the job; do not report a failure.
          sleep 60
          return 0
        fi
        symprune_job_log "scontrol requeue failed (was the job submitted with --requeue?): submit it again to continue"
      else
        symprune_job_log "stopped with the checkpoint saved; submit the same job again to continue"
      fi
      return 75
      ;;
    *)
      symprune_job_log "symprune_dist failed with exit code $status"
      return "$status"
      ;;
  esac
}

# One cell of a sweep (an array task of sweep.sbatch): line SLURM_ARRAY_TASK_ID of GRID (blank lines and
# '#' comments skipped) is "NAME OPTIONS..."; the cell writes SWEEP_DIR/NAME/{model,report.json,
# checkpoint.h5} with the common options plus its own.
#
#   symprune_job_sweep_cell GRID SWEEP_DIR [common symprune options...]
symprune_job_sweep_cell() {
  (($# >= 2)) || symprune_job_die "usage: sweep.sbatch GRID SWEEP_DIR [common options...]"
  local grid=$1 sweep=$2
  shift 2
  [[ -f $grid ]] || symprune_job_die "grid file $grid not found"
  local task=${SLURM_ARRAY_TASK_ID:-}
  [[ $task =~ ^[0-9]+$ ]] || symprune_job_die "not an array task (SLURM_ARRAY_TASK_ID unset): submit with slurm/submit_sweep.sh"
  local line
  line=$(grep -v -E '^[[:space:]]*(#|$)' "$grid" | sed -n "$((task + 1))p")
  [[ -n $line ]] || symprune_job_die "$grid has no cell $task (it has $(grep -c -v -E '^[[:space:]]*(#|$)' "$grid"))"
  local name
  local -a cell
  read -r name line <<<"$line"
  read -r -a cell <<<"$line"
  # Where a cell writes is the sweep's (SWEEP_DIR/NAME/...): a line naming it would give the option twice.
  local option
  for option in "${cell[@]}"; do
    case $option in
      --out | --out=* | --report | --report=* | --checkpoint | --checkpoint=* | --resume | --resume=*)
        symprune_job_die "$grid, cell $task ($name): ${option%%=*} is set by the sweep (it writes" \
          "$sweep/$name/{model,report.json,checkpoint.h5}); remove it from the grid line"
        ;;
    esac
  done
  symprune_job_log "sweep cell $task: $name: ${cell[*]}"
  mkdir -p "$sweep/$name" || symprune_job_die "cannot create $sweep/$name"
  symprune_job_run "${SYMPRUNE_LAUNCHER:-srun}" "$@" "${cell[@]}" --out "$sweep/$name/model" \
    --report "$sweep/$name/report.json" --checkpoint "$sweep/$name/checkpoint.h5"
}
