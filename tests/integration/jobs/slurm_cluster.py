"""A real one-node Slurm cluster on localhost for the tests (issue 29).

:func:`start_cluster` writes ``slurm.conf`` and a munge key into its own state
directory, starts ``munged``, ``slurmctld`` and ``slurmd`` as child processes
(foreground, their own ports) and returns a :class:`SlurmCluster` whose
:meth:`~SlurmCluster.stop` ends exactly those processes. The client commands
(``sbatch``, ``scontrol``, ``squeue``, ``scancel``) find the cluster through
``SLURM_CONF`` in :attr:`SlurmCluster.env`.

One node: this host, with its memory and at least :data:`CPUS` CPUs (it
claims more than a small machine has, ``SlurmdParameters=config_overrides``,
so that the tests' one-CPU jobs run at once). Partitions: ``main`` (the
default; its jobs are never preempted), ``low`` (preemptable:
``PreemptMode=REQUEUE``, ``GraceTime=20``) and ``high`` (a higher
``PriorityTier``: its jobs preempt ``low``'s). A job asking for more than half
the node's memory cannot run beside another such job, which is how the
preemption test makes room. ``AuthInfo=cred_expire=`` shortens the wait of a
requeued job (Slurm's default is 120 s).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CRED_EXPIRE_S = 5  # how long a requeued job waits in PD (BeginTime); Slurm's default is 120
CPUS = 8  # the node claims at least this many CPUs (config_overrides) so that the tests' jobs run at once


def missing() -> str | None:
    """Why no cluster can be started here (a program not installed), or None."""
    for name in (*DAEMONS, "sbatch", "scontrol", "squeue", "scancel", "sinfo", "munge"):
        if shutil.which(name) is None:
            path = f"/usr/sbin/{name}"
            if not os.access(path, os.X_OK):
                return f"{name} is not installed (apt-get install slurm-wlm munge; .ci/run does)"
    return None


def _program(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _memory_mb() -> int:
    with open("/proc/meminfo") as f:
        kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    return kb // 1024 - 512  # slurmd refuses a node configured with more memory than it finds


def write_conf(state: Path, host: str, ports: list[int]) -> Path:
    """``slurm.conf`` for one node (this host, its CPUs and memory) with the three partitions."""
    cpus, mem = max(CPUS, os.cpu_count() or 1), _memory_mb()
    conf = state / "slurm.conf"
    conf.write_text(
        f"""ClusterName=cktest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={state}/munge/sock,cred_expire={CRED_EXPIRE_S}
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
MailProg=/bin/true
DefMemPerNode=100
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
KillWait=10
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
Waittime=0
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem} State=UNKNOWN
PartitionName=main Nodes={host} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=OFF
PartitionName=low Nodes={host} MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=20
PartitionName=high Nodes={host} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
"""
    )
    return conf


@dataclass
class SlurmCluster:
    """The running cluster: its state directory, ``SLURM_CONF`` environment and daemon processes."""

    state: Path
    env: dict[str, str]
    memory_mb: int
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def cmd(self, *args: str, timeout: float = 30.0, check: bool = True) -> str:
        """Run a Slurm client command against this cluster; its stdout."""
        proc = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (``JobState``, ``Restarts``, ``Reason``...)."""
        out = self.cmd("scontrol", "-o", "show", "job", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def logs(self) -> str:
        """The end of each daemon's log (for an assertion message)."""
        parts = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.state / name
            if path.exists():
                parts.append(f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(parts)

    def stop(self) -> None:
        """End the daemons this cluster started (SIGTERM, then SIGKILL after 10 s) and the jobs' processes."""
        for name in reversed(DAEMONS):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _wait(what: str, ok, timeout: float, cluster: SlurmCluster) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for name, proc in cluster.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode} while waiting for {what}\n{cluster.logs()}")
        if ok():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what}: not within {timeout:g} s\n{cluster.logs()}")


def start_cluster(state: Path, timeout: float = 60.0) -> SlurmCluster:
    """Write the configuration under ``state``, start munged, slurmctld and slurmd; the cluster, its node idle."""
    host = socket.gethostname().split(".")[0]
    (state / "munge").mkdir(parents=True)
    (state / "ctld").mkdir()
    (state / "spool").mkdir()
    for path in (state, state / "munge"):
        path.chmod(0o755)
    key = state / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = write_conf(state, host, _free_ports(2))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for name in ("SLURM_JOB_ID", "SLURM_JOB_END_TIME"):
        env.pop(name, None)
    cluster = SlurmCluster(state, env, _memory_mb())
    m = state / "munge"
    commands = {
        "munged": [_program("munged"), "-F", "--force", f"--socket={m}/sock", f"--key-file={key}",
                   f"--log-file={m}/log", f"--pid-file={m}/pid", f"--seed-file={m}/seed"],
        "slurmctld": [_program("slurmctld"), "-D", "-c", "-f", str(conf)],
        "slurmd": [_program("slurmd"), "-D", "-f", str(conf), "-N", host],
    }  # fmt: skip
    try:
        for name, argv in commands.items():
            out = open(state / f"{name}.out", "wb")  # noqa: SIM115 (the daemon writes it until stop())
            cluster.procs[name] = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
            out.close()
            if name == "munged":
                _wait("munged's socket", (m / "sock").exists, timeout, cluster)
            if name == "slurmctld":
                _wait("slurmctld", lambda: _answers(cluster), timeout, cluster)
        _wait(
            "the node to be idle",
            lambda: "idle" in cluster.cmd("sinfo", "-h", "-o", "%t", check=False),
            timeout,
            cluster,
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _answers(cluster: SlurmCluster) -> bool:
    try:
        return (
            subprocess.run(["scontrol", "ping"], env=cluster.env, capture_output=True, text=True, timeout=10).returncode
            == 0
        )
    except subprocess.TimeoutExpired:
        return False
