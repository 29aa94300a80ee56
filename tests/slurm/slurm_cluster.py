"""A real one-node Slurm cluster on this machine for the slurm-label tests: munged, slurmctld and slurmd
(Debian's slurm-wlm and munge packages) started in the foreground from a private directory with a config
written here (own munge key and socket, free ports, the machine's CPUs, no accounting, no cgroups). The
daemons are stopped by the pids this module started, whatever happens in the tests.

Client commands (sbatch, squeue, scontrol, scancel) must run with `cluster.env` (SLURM_CONF); jobs inherit
it, so `scontrol requeue` inside a batch script reaches this cluster too."""
import ctypes
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")


class ClusterUnavailable(Exception):
    """The cluster cannot start here (missing packages, not root, a daemon that will not come up)."""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _end_with_parent():
    """In the daemon before exec: SIGTERM when the test process dies, so a test killed by its timeout
    (no finalizer runs) leaves no daemon behind either."""
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _find(name):
    for directory in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        path = Path(directory) / name
        if path.exists():
            return str(path)
    return shutil.which(name)


class LocalSlurmCluster:
    def __init__(self, root, cpus=None, real_memory_mb=8000):
        self.root = Path(root)
        self.cpus = cpus or os.cpu_count() or 1
        self.real_memory_mb = real_memory_mb
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.processes = {}

    # --- start / stop -------------------------------------------------------------------------------
    def start(self, timeout=60):
        missing = [name for name in DAEMONS + CLIENTS if _find(name) is None]
        if missing:
            raise ClusterUnavailable(f"not installed: {', '.join(missing)} (apt install slurmctld slurmd "
                                     "slurm-client munge; scripts/setup.sh does)")
        if os.geteuid() != 0:
            raise ClusterUnavailable("slurmd must run as root to start jobs; this test runs as uid "
                                     f"{os.geteuid()}")
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        for sub in ("state", "spool", "munge"):
            (self.root / sub).mkdir(exist_ok=True)
            os.chmod(self.root / sub, 0o700)
        try:
            self._start_munge()
            self._write_config()
            self._spawn("slurmctld", [_find("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._spawn("slurmd", [_find("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self):
        """Cancels every job, then stops the daemons this object started (SIGTERM, SIGKILL after 10 s)."""
        if "slurmctld" in self.processes and self.processes["slurmctld"].poll() is None:
            subprocess.run([_find("scancel"), "--full", "--user", "root"], env=self.env,
                           capture_output=True, timeout=30)
            deadline = time.time() + 20
            while time.time() < deadline and self.queue():
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.processes.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def _spawn(self, name, argv):
        log = open(self.root / f"{name}.stdout", "wb")
        self.processes[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                                start_new_session=True, preexec_fn=_end_with_parent)
        log.close()
        time.sleep(0.2)
        if self.processes[name].poll() is not None:
            raise ClusterUnavailable(f"{name} exited at once ({self.processes[name].returncode}):\n"
                                     + self.log_tail(name))

    def _start_munge(self):
        munge = self.root / "munge"
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        self.munge_socket = munge / "munge.socket"
        self._spawn("munged", [_find("munged"), "-F", "--force", f"--key-file={key}",
                               f"--socket={self.munge_socket}", f"--pid-file={munge / 'munged.pid'}",
                               f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}"])
        deadline = time.time() + 15
        while not self.munge_socket.exists():
            if time.time() > deadline or self.processes["munged"].poll() is not None:
                raise ClusterUnavailable("munged did not open its socket:\n" + self.log_tail("munged"))
            time.sleep(0.1)

    def _write_config(self):
        r = self.root
        lines = {
            "ClusterName": "symprunetest",
            "SlurmctldHost": f"{self.node}(127.0.0.1)",
            "SlurmctldPort": _free_port(),
            "SlurmdPort": _free_port(),
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "StateSaveLocation": r / "state",
            "SlurmdSpoolDir": r / "spool",
            "SlurmctldPidFile": r / "slurmctld.pid",
            "SlurmdPidFile": r / "slurmd.pid",
            "SlurmctldLogFile": r / "slurmctld.log",
            "SlurmdLogFile": r / "slurmd.log",
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "SlurmdParameters": "config_overrides",
            "MpiDefault": "none",
            "ReturnToService": 2,
            "SchedulerType": "sched/backfill",
            "SchedulerParameters": "sched_interval=2",
            "AccountingStorageType": "accounting_storage/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "JobCompType": "jobcomp/none",
            "InactiveLimit": 0,
            "KillWait": 10,
            "MinJobAge": 3600,
            "SlurmctldTimeout": 30,
            "SlurmdTimeout": 60,
            "MessageTimeout": 20,
        }
        text = "".join(f"{k}={v}\n" for k, v in lines.items())
        text += (f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.real_memory_mb} "
                 "State=UNKNOWN\n")
        text += "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        self.conf.write_text(text)

    def _wait_idle(self, timeout):
        deadline = time.time() + timeout
        state = ""
        while time.time() < deadline:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise ClusterUnavailable(f"{name} exited ({proc.returncode}):\n" + self.log_tail(name))
            out = self.run("sinfo", "-h", "-o", "%T", check=False)
            state = out.stdout.strip()
            if state.startswith("idle"):
                return
            time.sleep(0.5)
        raise ClusterUnavailable(f"the node did not become idle in {timeout} s (state '{state}'):\n"
                                 + self.log_tail("slurmctld") + self.log_tail("slurmd"))

    def log_tail(self, name, lines=20):
        text = ""
        for path in (self.root / f"{name}.log", self.root / f"{name}.stdout", self.root / "munge" / "munged.log"):
            if path.exists() and (name in path.name):
                text += f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
        return text

    # --- clients ------------------------------------------------------------------------------------
    def run(self, command, *args, check=True, timeout=60, cwd=None, env=None):
        proc = subprocess.run([_find(command), *map(str, args)], capture_output=True, text=True,
                              env={**self.env, **(env or {})}, timeout=timeout, cwd=cwd)
        if check and proc.returncode != 0:
            raise AssertionError(f"{command} {' '.join(map(str, args))} exited {proc.returncode}:\n"
                                 f"{proc.stdout}{proc.stderr}")
        return proc

    def sbatch(self, *args, cwd=None, env=None):
        """Submits; returns the job id (for an array, the array's job id)."""
        out = self.run("sbatch", "--parsable", *args, cwd=cwd, env=env).stdout.strip()
        return out.split(";")[0]

    def node_state(self):
        """The node's state as `scontrol show node` gives it, e.g. IDLE, MIXED, ALLOCATED, IDLE+COMPLETING."""
        out = self.run("scontrol", "-o", "show", "node", self.node, check=False).stdout
        match = re.search(r"\bState=(\S+)", out)
        return match.group(1) if match else ""

    def steps_alive(self, job_id):
        """Step daemons of the job still on the node (their sockets in the spool directory)."""
        spool = self.root / "spool"
        return sorted(p.name for p in spool.glob(f"*_{job_id}.*")) + \
            sorted(p.name for p in spool.glob(f"stepd.slurm.pmix.{job_id}.*"))

    def queue(self):
        """Job ids still in the queue (pending, running, completing)."""
        out = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
        return out

    def job(self, job_id):
        """`scontrol show job` as {key: value} per job record (an array gives one per task)."""
        out = self.run("scontrol", "-o", "show", "job", job_id, check=False).stdout
        records = []
        for line in out.splitlines():
            record = {}
            for field in line.split():
                key, _, value = field.partition("=")
                record[key] = value
            if record:
                records.append(record)
        return records

    def wait(self, job_id, timeout=300, poll=1.0):
        """Waits until every record of the job is finished; returns the records."""
        final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                 "BOOT_FAIL", "DEADLINE"}
        deadline = time.time() + timeout
        while True:
            records = self.job(job_id)
            states = [r.get("JobState") for r in records]
            if records and all(s in final for s in states):
                return records
            if time.time() > deadline:
                raise AssertionError(f"job {job_id} not finished after {timeout} s: {states}\n"
                                     + self.log_tail("slurmctld"))
            time.sleep(poll)
