"""resources.mps: the job's MPS control daemon, with a stand-in nvidia-cuda-mps-control that records its calls."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, env
from mpifed.entry import launch, cuda_mps as mps
from mpifed.settings.config import ResourcesConfig

# The stand-in: "-d" starts a "daemon" (a file in the pipe folder); a command read from stdin is
# answered while that file exists (or MPS_STANDIN_RUNNING is set: a daemon someone else started).
# MPS_STANDIN_REFUSE makes start_server fail as on a GPU whose compute mode forbids MPS.
STANDIN = """#!/bin/bash
pipe="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
if [ "$1" = -d ]; then
    echo "-d pipe=$pipe log=$CUDA_MPS_LOG_DIRECTORY" >> "$MPS_STANDIN_LOG"
    # what the daemon would inherit: grep's own masks (bash gives a child the masks it started with; its own
    # /proc/$$ can show the signals it blocks for a moment while it forks)
    grep -E '^Sig(Blk|Ign):' /proc/self/status > "$MPS_STANDIN_LOG.signals"
    touch "$pipe/control"; echo "daemon started" > "$CUDA_MPS_LOG_DIRECTORY/control.log"; exit 0
fi
read -r cmd
echo "$cmd pipe=$pipe" >> "$MPS_STANDIN_LOG"
if [ -z "$MPS_STANDIN_RUNNING" ] && [ ! -e "$pipe/control" ]; then
    echo "Cannot find MPS control daemon process" >&2; exit 1
fi
case "$cmd" in
    get_server_list) if [ -n "$MPS_STANDIN_RUNNING" ] || [ -e "$pipe/server" ]; then echo 4242; fi ;;
    start_server*) if [ -n "$MPS_STANDIN_REFUSE" ]; then
                       echo "Server failed to start: the GPU's compute mode forbids MPS" \
                           >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
                   else touch "$pipe/server"; fi ;;
    quit) rm -f "$pipe/control" "$pipe/server" ;;
esac
exit 0
"""

# A stand-in mpirun: records the MPS pipe folder the ranks would see, then exits with
# FAKE_MPIRUN_EXIT, or waits for SIGUSR1 (the launcher's Ctrl-C) and exits with 75.
FAKE_MPIRUN = """#!/bin/bash
if [ "$1" = --version ]; then echo "a stand-in mpirun"; exit 0; fi
echo "job pipe=${CUDA_MPS_PIPE_DIRECTORY:-none}" >> "$MPS_STANDIN_LOG"
if [ -n "$FAKE_MPIRUN_WAIT" ]; then
    trap 'echo "job got USR1" >> "$MPS_STANDIN_LOG"; exit 75' USR1
    touch "$FAKE_MPIRUN_WAIT"
    while true; do sleep 0.05; done
fi
exit "${FAKE_MPIRUN_EXIT:-0}"
"""


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """PATH with the stand-in control program (and mpirun), one visible GPU, and the call record."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("nvidia-cuda-mps-control", STANDIN), ("mpirun", FAKE_MPIRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "calls.txt"
    record.touch()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for name, value in (("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}"), ("CUDA_VISIBLE_DEVICES", "0"),
                        ("MPS_STANDIN_LOG", str(record)), ("TMPDIR", str(tmp))):
        monkeypatch.setenv(name, value)
    for name in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "MPS_STANDIN_RUNNING", "MPS_STANDIN_REFUSE"):
        monkeypatch.delenv(name, raising=False)
    return record, tmp


def calls(record: Path) -> list[str]:
    return record.read_text().splitlines()


def test_visible_gpus_follow_cuda_visible_devices():
    assert mps.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}) == 3
    assert mps.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert mps.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,-1,1"}) == 1
    assert mps.visible_gpus({"PATH": "/nonexistent"}) == 0          # no nvidia-smi: no GPU


def test_auto_wants_a_daemon_only_when_ranks_share_a_gpu():
    gpu = ResourcesConfig()
    assert mps.decide("auto", 5, 4, gpu, "ctl") == (False, "")                       # 4 workers, 4 GPUs
    assert mps.decide("auto", 6, 4, gpu, "ctl") == (True, "5 ranks share 4 GPUs")
    assert mps.decide("auto", 3, 1, ResourcesConfig(server_device="cuda"), "ctl") == (True, "3 ranks share 1 GPU")
    assert mps.decide("auto", 11, 1, ResourcesConfig(device="cpu"), "ctl") == (False, "")
    assert mps.decide("auto", 11, 0, gpu, None) == (False, "")
    assert mps.decide("auto", 1, 1, gpu, "ctl") == (False, "")                       # one process
    wanted, why = mps.decide("auto", 11, 1, gpu, None)
    assert not wanted and "not installed" in why
    assert mps.decide("off", 11, 1, gpu, "ctl") == (False, "")
    assert mps.decide("on", 2, 1, gpu, "ctl")[0]                                     # one worker alone on its GPU
    with pytest.raises(mps.MpsError, match="not on PATH"):
        mps.decide("on", 11, 1, gpu, None)
    with pytest.raises(mps.MpsError, match="no rank uses a GPU"):
        mps.decide("on", 11, 0, gpu, "ctl")


def test_the_resources_section_is_read_without_torch(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("resources: {mps: off, device: cuda}\ntrain: {rounds: 3}\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("resources: {mps: on, server_device: cuda}\n")
    code = ("import sys; from mpifed.entry.cuda_mps import job_resources; "
            f"r = job_resources(['--config', {str(f)!r}, '--set', 'resources.threads=2', 'train.rounds=5', "
            f"'--overwrite']); s = job_resources(['--resume', {str(run)!r}, '--set', 'resources.cache_mb=7']); "
            "print(r.mps, r.device, r.threads, s.mps, s.server_device, s.cache_mb, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, check=True).stdout
    assert out.split() == ["off", "cuda", "2", "on", "cuda", "7", "False"]


def test_a_job_starts_and_stops_its_own_daemon(standin):
    record, tmp = standin
    said = []
    daemon = mps.for_job(4, ["--set", "resources.device=cuda"], os.environ, said.append)
    folder = daemon.folder
    assert folder.parent == tmp and folder.name.startswith("mpifed-mps-")
    assert daemon.env == {"CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
                          "CUDA_MPS_LOG_DIRECTORY": str(folder / "log")}
    assert said == ["MPS: 3 ranks share 1 GPU: started a control daemon for this job (pipe and log folders in "
                    f"{folder})"]
    pipe = f"pipe={folder / 'pipe'}"
    assert calls(record) == ["get_server_list pipe=/tmp/nvidia-mps", f"-d {pipe} log={folder / 'log'}",
                             f"start_server -uid {os.getuid()} {pipe}", f"get_server_list {pipe}"]
    daemon.stop(said.append)
    daemon.stop(said.append)                                 # idempotent
    assert calls(record)[-1] == f"quit {pipe}" and len(calls(record)) == 5
    assert said[-1] == "MPS: control daemon stopped" and not folder.exists()


def test_a_daemon_already_running_is_used_and_left_alone(standin, monkeypatch):
    record, tmp = standin
    monkeypatch.setenv("MPS_STANDIN_RUNNING", "1")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/site/mps")
    said = []
    daemon = mps.for_job(11, [], os.environ, said.append)
    daemon.stop(said.append)
    assert daemon.env == {} and calls(record) == ["get_server_list pipe=/site/mps"]
    assert said == ["MPS: 10 ranks share 1 GPU: using the control daemon already running (/site/mps)"]
    assert list(tmp.iterdir()) == []


def test_a_gpu_that_refuses_mps_gets_a_message_and_the_job_runs_without(standin, monkeypatch):
    record, tmp = standin
    monkeypatch.setenv("MPS_STANDIN_REFUSE", "1")
    monkeypatch.setattr(mps, "SERVER_WAIT_S", 0.3)
    said = []
    daemon = mps.for_job(3, ["--set", "resources.mps=on"], os.environ, said.append)
    assert daemon.env == {} and daemon.folder is None
    assert len(said) == 1 and "refused an MPS server" in said[0] and "running without MPS" in said[0]
    assert "compute mode forbids MPS" in said[0]                      # the daemon's log is shown
    assert calls(record)[-1].startswith("quit ") and list(tmp.iterdir()) == []


def test_on_without_the_control_program_is_an_error_and_off_asks_nothing(standin, monkeypatch):
    record, _ = standin
    with pytest.raises(mps.MpsError, match="nvidia-cuda-mps-control is not on PATH"):
        mps.for_job(3, ["--set", "resources.mps=on"], {**os.environ, "PATH": "/nonexistent"}, print)
    assert mps.for_job(11, ["--set", "resources.mps=off"], os.environ, print).env == {}
    assert mps.for_job(11, ["--set", "resources.mps=bogus"], os.environ, print).env == {}   # mpifed.main reports it
    assert calls(record) == []


def test_the_launcher_stops_the_daemon_after_the_job_and_after_a_failure(standin, monkeypatch, capsys):
    record, tmp = standin
    monkeypatch.setattr(launch, "open_mpi_version", lambda mpirun: None)
    for code in (0, 3):
        monkeypatch.setenv("FAKE_MPIRUN_EXIT", str(code))
        assert launch.main(["-n", "3", "--set", "resources.device=cuda"]) == code
        lines = calls(record)
        job = next(line for line in lines if line.startswith("job pipe="))
        assert job.startswith(f"job pipe={tmp}/mpifed-mps-") and lines[-1].startswith("quit ")
        assert list(tmp.iterdir()) == []
        record.write_text("")
    err = capsys.readouterr().err
    assert err.count("MPS: control daemon stopped") == 2


def test_the_launcher_stops_the_daemon_after_ctrl_c(standin, tmp_path):
    record, tmp = standin
    started = tmp_path / "started"
    p = subprocess.Popen([sys.executable, "-m", "mpifed.launch", "-n", "3", "--set", "resources.mps=on"], cwd=REPO,
                         env={**env(), "FAKE_MPIRUN_WAIT": str(started)}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 75
    lines = calls(record)
    assert "job got USR1" in lines and lines[-1].startswith("quit ") and list(tmp.iterdir()) == []
    assert "started a control daemon" in err and "MPS: control daemon stopped" in err


def test_the_shell_functions_of_the_slurm_scripts(standin):
    record, tmp = standin
    script = (f"source {REPO}/slurm/common.sh; set -e; mpifed_mps_start 5 --set resources.device=cuda; "
              "echo \"ranks see $CUDA_MPS_PIPE_DIRECTORY\"; mpifed_mps_stop; mpifed_mps_stop")
    p = subprocess.run(["bash", "-c", script], env={**env(), "PYTHON": sys.executable}, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert f"ranks see {tmp}/mpifed-mps-" in p.stdout
    assert "started a control daemon" in p.stderr and p.stderr.count("control daemon stopped") == 1
    assert calls(record)[-1].startswith("quit ") and list(tmp.iterdir()) == []


def test_tasks_per_node_and_a_node_without_the_server():
    assert [mps.tasks_on_node("3(x2),1", n) for n in range(3)] == [3, 3, 1]
    assert mps.tasks_on_node("5", 0) == 5
    for bad, node in (("3(x2", 0), ("a", 0), ("2,2", 2)):
        with pytest.raises(ValueError):
            mps.tasks_on_node(bad, node)
    gpu = ResourcesConfig()
    assert mps.decide("auto", 2, 1, gpu, "ctl") == (False, "")                   # the server + 1 worker
    assert mps.decide("auto", 2, 1, gpu, "ctl", server=False) == (True, "2 ranks share 1 GPU")
    assert mps.decide("auto", 4, 4, gpu, "ctl", server=False) == (False, "")
    assert mps.gpu_ranks(1, gpu, 1, server=False) == 1       # one worker alone on a node: not the debug mode
    assert mps.gpu_ranks(1, gpu, 1, server=True) == 0        # the server alone on the first node, on the CPU
    assert mps.gpu_ranks(1, ResourcesConfig(server_device="cuda"), 1, server=True) == 1
    assert mps.decide("on", 1, 1, gpu, "ctl", server=True) == (False, "no rank of this node uses its GPU "
                                                                        "(resources.mps=on)")
    with pytest.raises(mps.MpsError, match="no rank uses a GPU"):
        mps.decide("on", 3, 0, gpu, "ctl", server=False)


def test_a_node_keeps_its_daemon_in_the_given_folder_until_sigterm(standin):
    record, tmp = standin
    folder = tmp / "job-7"
    (folder / "pipe").mkdir(parents=True)           # left by an earlier start of the job on this node
    (folder / "pipe" / "control").touch()
    proc = subprocess.Popen([sys.executable, "-m", "mpifed.mps", "node", "--folder", str(folder), "--tasks-per-node",
                             "2(x2)", "--set", "resources.device=cuda"],
                            env={**env(), "SLURM_NODEID": "1", "SLURM_STEP_ID": "3"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line == f"mpifed-mps {socket.gethostname()} started 3\n"
    assert f"quit pipe={folder / 'pipe'}" == calls(record)[1]            # the earlier daemon, ended first
    assert (folder / "pipe" / "server").exists()
    proc.send_signal(signal.SIGUSR1)                                      # the job's warning: not for it
    time.sleep(0.3)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "2 ranks share 1 GPU: started" in err and "control daemon stopped" in err
    assert calls(record)[-1] == f"quit pipe={folder / 'pipe'}" and not folder.exists()
    # the daemon starts with the signals the node's task handles neither blocked nor ignored: Slurm's
    # SIGTERM can end it
    masks = dict(line.split(":") for line in Path(f"{record}.signals").read_text().splitlines())
    handled = sum(1 << (s - 1) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1))
    assert int(masks["SigBlk"], 16) & handled == 0 and int(masks["SigIgn"], 16) & handled == 0, masks


def test_a_node_that_cannot_honour_mps_on_reports_an_error(standin):
    p = subprocess.run([sys.executable, "-m", "mpifed.mps", "node", "--folder", "/nonexistent/x", "--tasks-per-node",
                        "3", "--set", "resources.mps=on"], capture_output=True, text=True,
                       env={**env(), "SLURM_NODEID": "0", "CUDA_VISIBLE_DEVICES": ""})
    assert p.returncode == 2 and p.stdout == f"mpifed-mps {socket.gethostname()} error\n"
    assert "no rank uses a GPU" in p.stderr
