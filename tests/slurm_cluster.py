"""A real Slurm cluster started for a test session: one slurmctld and a slurmd per node.

As root, the cluster installs Debian's slurm-wlm, munge and libpmix-dev when missing and starts
munged (if not running). Its nodes are separate hosts on this machine: each slurmd runs in a
network namespace of its own, linked to a bridge by a veth pair, with its
own host name (a UTS namespace), its own ``/etc/hosts`` naming every node, and a node-local
``/tmp`` (a mount namespace; pytest's folders, and the repository and Python where they are under
/tmp, stay visible in it, as a cluster's shared file system is). Ranks on different nodes talk
over TCP on those links, as on a cluster. The bridge
and slurmctld are in a namespace of their own too, and every Slurm command of the tests runs in
it: the root namespace gains no interface or address, so an mpirun of another test, which lists
the host's interfaces as it starts, never sees the cluster's come and go. Where namespaces cannot
be made, the cluster is one slurmd on this host and :meth:`Cluster.need_nodes` skips the
multi-node tests.

Each node declares 16 CPUs (SlurmdParameters=config_overrides); job ids start at a random
number (a step killed in an earlier session leaves its pmix folder under its job id, and a
later job of that id would fail to start); credentials expire after 20 s instead of 120 (Slurm
holds a requeued job that long before starting it again). :meth:`Cluster.stop` cancels what is
left, stops the daemons, and removes the namespaces and links, however the tests ended.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

PACKAGES = ["slurm-wlm", "munge", "libpmix-dev"]
PREFIX = "mpifedt"          # names of this cluster's namespaces, bridge and links


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def installed() -> bool:
    libpmix = any(Path(d, "libpmix.so").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                                                           "/usr/lib64", "/usr/lib"))
    return all(shutil.which(t) for t in ("slurmctld", "slurmd", "sbatch", "munged")) and libpmix


def install() -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=True)
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            pytest.skip(f"could not install {' '.join(PACKAGES)}: {p.stderr[-500:]}")


def _sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True)


def _links() -> set[str]:
    """The names of the root network namespace's interfaces."""
    return {line.split(":")[1].strip().split("@")[0] for line in _sh("ip", "-o", "link").stdout.splitlines()}


def _kill_all(ns: str, remove: bool = False) -> None:
    """Kill every process in the network namespace ``ns`` at once (and then remove it)."""
    for _ in range(50):
        pids = _sh("ip", "netns", "pids", ns).stdout.split()
        if not pids:
            break
        _sh("kill", "-9", *pids)
        time.sleep(0.1)
    if remove:
        _sh("ip", "netns", "del", ns)


class Cluster:
    """``nodes`` slurmd hosts (or one on this host, see :attr:`single_reason`)."""

    def __init__(self, root: Path, repo: Path, nodes: int = 3) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.want = nodes
        self.env = dict(os.environ, SLURM_CONF=str(self.conf), PYTHON=sys.executable, TMPDIR="/tmp",
                        PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.repo = repo
        self.started_munged = False
        self.tag = f"{random.randrange(16 ** 4):04x}"
        self.netns: dict[str, str] = {}          # node -> its network namespace
        self.addr: dict[str, str] = {}
        self.nodes: list[str] = []
        self.single_reason = ""                   # why the cluster is one node, when it is
        self.ctl_ns = ""                          # the namespace of the bridge and slurmctld
        self.ctl: list[str] = []                  # the prefix that runs a command there

    # --- start and stop ----------------------------------------------------------------------------
    def start(self) -> None:
        host = socket.gethostname().split(".")[0]
        for d in ("state", "spool", "log", "nodes"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self._remove_stale_namespaces()
        try:
            ctl = self._make_hosts(host)
        except RuntimeError as exc:
            self.single_reason = f"separate hosts could not be made on this machine ({exc})"
            self.nodes, ctl = [host], host
        port = _free_port()
        if self.netns:
            node_lines = "\n".join(f"NodeName={n} NodeAddr={self.addr[n]} CPUs=16 RealMemory=8000 State=UNKNOWN"
                                   for n in self.nodes)
        else:
            node_lines = f"NodeName={host} CPUs=16 RealMemory=8000 State=UNKNOWN"
        self.conf.write_text(f"""ClusterName=mpifedtest
SlurmctldHost={ctl}
AuthType=auth/munge
AuthInfo=cred_expire=20
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool/%n
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd-%n.pid
SlurmctldLogFile={self.root}/log/slurmctld.log
SlurmdLogFile={self.root}/log/slurmd-%n.log
SlurmctldPort={_free_port()}
SlurmdPort={port}
SlurmdTimeout=15
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=3600
FirstJobId={random.randint(1000, 60_000_000)}
SlurmdParameters=config_overrides
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        if _sh("pgrep", "-x", "munged").returncode != 0:
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["munged", "--force"], check=True, capture_output=True)
            self.started_munged = True
        subprocess.run([*self.ctl, "slurmctld", "-f", str(self.conf)], check=True, env=self.env)
        for node in self.nodes:
            self.start_slurmd(node)
        self.wait_nodes_up()

    def wait_nodes_up(self, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            p = subprocess.run([*self.ctl, "sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True,
                               text=True)
            states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
            if p.returncode == 0 and len(states) == len(self.nodes) and \
                    all(s in ("idle", "mix", "alloc") for s in states.values()):
                return
            time.sleep(1)
        logs = "\n".join(f.read_text()[-1500:] for f in sorted((self.root / "log").glob("slurmd*.log")))
        raise RuntimeError(f"the Slurm nodes did not come up ({p.stdout.strip()}): {logs}")

    def start_slurmd(self, node: str) -> None:
        """Start ``node``'s slurmd, in its namespaces when it has them."""
        cmd = ["slurmd", "-f", str(self.conf)]
        if node not in self.netns:
            subprocess.run(cmd, check=True, env=self.env)
            return
        node_tmp = self.root / "nodes" / node / "tmp"
        node_tmp.mkdir(parents=True, exist_ok=True)
        keep = ""
        for shared in self._shared_tmp():       # seen through the node's own /tmp
            (node_tmp / shared.name).mkdir(exist_ok=True)
            keep += f"mount --bind {shared} {node_tmp / shared.name} && "
        script = (f"hostname {node} && mount --bind {self.root / 'hosts'} /etc/hosts && {keep}"
                  f"mount --rbind {node_tmp} /tmp && exec {' '.join(cmd)} -N {node}")
        subprocess.run(["nsenter", f"--net=/run/netns/{self.netns[node]}", "unshare", "--uts", "--mount",
                        "--propagation", "private", "sh", "-c", script], check=True, env=self.env)

    def stop(self) -> None:
        """Cancel the jobs a failed test left (their slurmstepd outlives slurmd and would clash with the
        next session's job of the same id), stop the daemons, remove the namespaces and links."""
        p = subprocess.run([*self.ctl, "squeue", "-h", "-o", "%A"], env=self.env, capture_output=True, text=True)
        jobs = p.stdout.split()
        stuck = []
        if jobs:
            subprocess.run([*self.ctl, "scancel", *jobs], env=self.env, capture_output=True)
            for jid in jobs:
                try:
                    self.wait_for_steps_to_end(jid)
                except AssertionError as exc:        # the rest of the teardown still runs
                    stuck.append(str(exc))
        for pid_file in [*self.root.glob("slurmd-*.pid"), self.root / "slurmctld.pid"]:
            if pid_file.exists():
                _sh("kill", pid_file.read_text().strip())
        for ns in [*self.netns.values(), *([self.ctl_ns] if self.ctl_ns else [])]:
            _kill_all(ns, remove=True)
        if self.started_munged:
            _sh("pkill", "-x", "munged")
        deadline = time.time() + 10
        while self.left_over() and time.time() < deadline:     # the kernel removes veth pairs shortly after
            time.sleep(0.2)
        assert not stuck, "; ".join(stuck)

    def left_over(self) -> list[str]:
        """What of this cluster is still there: its daemons, namespaces and links."""
        left = [line for line in _sh("pgrep", "-a", "-f", f"slurm(ctld|d) -f {self.conf}").stdout.splitlines()]
        left += [line for line in _sh("ip", "netns", "list").stdout.splitlines() if f"{PREFIX}-{self.tag}-" in line]
        return left

    # --- hosts -----------------------------------------------------------------------------------
    def _shared_tmp(self) -> list[Path]:
        """The folders directly under /tmp that hold what a job needs: pytest's files, the repository,
        the Python that runs it (a clone or a virtual environment under /tmp)."""
        found = []
        for path in (self.root, self.repo, Path(sys.prefix)):
            parts = path.resolve().parts
            if len(parts) > 2 and parts[1] == "tmp" and Path("/tmp", parts[2]) not in found:
                found.append(Path("/tmp", parts[2]))
        return found

    def _remove_stale_namespaces(self) -> None:
        """Namespaces of an earlier session that ended without removing them, with nothing left inside."""
        for line in _sh("ip", "netns", "list").stdout.splitlines():
            name = line.split()[0] if line.strip() else ""
            stale = re.fullmatch(rf"{PREFIX}-[0-9a-f]{{4}}-\d+", name)
            if stale and not _sh("ip", "netns", "pids", name).stdout.strip():
                _sh("ip", "netns", "del", name)

    def _make_hosts(self, host: str) -> str:
        """Create the nodes' namespaces and links; the SlurmctldHost line's value. Raises RuntimeError."""
        if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "nsenter", "unshare")):
            raise RuntimeError("it needs root and ip, nsenter and unshare")
        subnet = f"10.213.{random.randrange(1, 255)}"     # it exists only inside the cluster's namespaces
        host_links = _links()

        def ip(*args: str) -> None:
            p = _sh("ip", *args)
            if p.returncode != 0:
                raise RuntimeError(f"`ip {' '.join(args)}`: {p.stderr.strip()}")

        ctl = f"{PREFIX}-{self.tag}-0"
        try:
            ip("netns", "add", ctl)
            self.ctl_ns, self.ctl = ctl, ["nsenter", f"--net=/run/netns/{ctl}"]
            ip("-n", ctl, "link", "set", "lo", "up")
            ip("-n", ctl, "link", "add", "br0", "type", "bridge")
            ip("-n", ctl, "addr", "add", f"{subnet}.1/24", "dev", "br0")
            ip("-n", ctl, "link", "set", "br0", "up")
            for i in range(1, self.want + 1):
                node, ns, veth = f"pnode{i}", f"{PREFIX}-{self.tag}-{i}", f"veth{i}"
                ip("netns", "add", ns)
                self.netns[node] = ns
                ip("link", "add", veth, "netns", ctl, "type", "veth", "peer", "name", "eth0", "netns", ns)
                ip("-n", ctl, "link", "set", veth, "master", "br0", "up")
                ip("-n", ns, "addr", "add", f"{subnet}.{10 + i}/24", "dev", "eth0")
                ip("-n", ns, "link", "set", "lo", "up")
                ip("-n", ns, "link", "set", "eth0", "up")
                self.addr[node] = f"{subnet}.{10 + i}"
                self.nodes.append(node)
            probe = _sh("ip", "netns", "exec", self.netns["pnode1"], "ping", "-c", "1", "-W", "5", f"{subnet}.1") \
                if shutil.which("ping") else None
            if probe is not None and probe.returncode != 0:
                raise RuntimeError(f"a node cannot reach the bridge: {probe.stdout.strip()} {probe.stderr.strip()}")
            if _links() != host_links:
                raise RuntimeError(f"the machine's own interfaces changed: {sorted(_links() ^ host_links)}")
        except RuntimeError:
            for ns in [*self.netns.values(), *([self.ctl_ns] if self.ctl_ns else [])]:
                _sh("ip", "netns", "del", ns)
            self.netns, self.addr, self.nodes, self.ctl_ns, self.ctl = {}, {}, [], "", []
            raise
        original = [line for line in Path("/etc/hosts").read_text().splitlines()
                    if host not in line.split()[1:] and not any(n in line.split()[1:] for n in self.nodes)]
        lines = [*original, f"{subnet}.1 {host}", *(f"{self.addr[n]} {n}" for n in self.nodes)]
        (self.root / "hosts").write_text("\n".join(lines) + "\n")
        return f"{host}({subnet}.1)"

    def need_nodes(self, count: int) -> None:
        """Skip the calling test unless the cluster has ``count`` nodes."""
        if len(self.nodes) < count:
            pytest.skip(f"this test needs {count} Slurm nodes; the test cluster has {len(self.nodes)}: "
                        f"{self.single_reason}")

    def crash(self, node: str) -> None:
        """``node`` fails: every process on it is killed at once (slurmd, slurmstepd, the ranks)."""
        _kill_all(self.netns[node])

    def node_tmp(self, node: str) -> Path:
        """The folder that is ``node``'s /tmp."""
        return self.root / "nodes" / node / "tmp"

    # --- jobs ------------------------------------------------------------------------------------
    def sbatch(self, *args: str, env: dict[str, str] | None = None) -> str:
        p = subprocess.run([*self.ctl, "sbatch", "--parsable", *args], cwd=self.repo, env={**self.env, **(env or {})},
                           capture_output=True, text=True)
        assert p.returncode == 0, f"sbatch {' '.join(args)}: {p.stderr.strip()}"
        return p.stdout.strip().split(";")[0]

    def job(self, jid: str) -> dict[str, str]:
        p = subprocess.run([*self.ctl, "scontrol", "show", "job", jid], env=self.env, capture_output=True, text=True)
        return dict(f.split("=", 1) for f in p.stdout.split() if "=" in f)

    def wait(self, jid: str, states: tuple[str, ...] = ("COMPLETED",), timeout: float = 300) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = self.job(jid).get("JobState", "")
            if state in states or state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
                return state
            time.sleep(1)
        raise TimeoutError(f"job {jid} still {self.job(jid).get('JobState')} after {timeout} s")

    def log_lines(self, jid: str) -> str:
        """The lines of the daemons' logs that name job ``jid`` (for a failed test's message)."""
        lines = [f"{log.stem}: {line}" for log in sorted((self.root / "log").glob("*.log"))
                 for line in log.read_text(errors="replace").splitlines() if jid in line]
        return "\n".join(lines)

    def start_requeued_when_eligible(self, jid: str, timeout: float = 60) -> None:
        """Once the requeued job ``jid`` may start again, have the scheduler start it now.

        Slurm keeps a requeued job pending until the old job's credentials have expired
        (cred_expire). Started sooner with StartTime=now, a restarted job once failed in CI
        before its script printed anything; after EligibleTime, StartTime=now only saves the
        wait for the next backfill cycle.
        """
        eligible = time.mktime(time.strptime(self.job(jid)["EligibleTime"], "%Y-%m-%dT%H:%M:%S"))
        assert eligible - time.time() < timeout, f"job {jid} is not eligible until {self.job(jid)['EligibleTime']}"
        self.wait_for_steps_to_end(jid)
        time.sleep(max(0.0, eligible + 1 - time.time()))
        p = subprocess.run([*self.ctl, "scontrol", "update", f"JobId={jid}", "StartTime=now"], env=self.env,
                           capture_output=True, text=True)
        state = self.job(jid).get("JobState")
        # an error is fine when the scheduler has just started the job itself
        assert p.returncode == 0 or state != "PENDING", f"job {jid} {state}: {p.stderr.strip()}"

    def wait_for_steps_to_end(self, jid: str, timeout: float = 60) -> None:
        """Until no slurmstepd of job ``jid`` is left on any node."""
        deadline = time.time() + timeout
        while _sh("pgrep", "-f", rf"slurmstepd: \[{jid}\.").returncode == 0:
            assert time.time() < deadline, f"job {jid}'s slurmstepd still there after {timeout} s"
            time.sleep(0.3)

    def run(self, *cmd: str) -> str:
        """A Slurm command (``scontrol ...``), run where slurmctld can be reached."""
        p = subprocess.run([*self.ctl, *cmd], env=self.env, capture_output=True, text=True)
        assert p.returncode == 0, f"{' '.join(cmd)}: {p.stderr.strip()}"
        return p.stdout
