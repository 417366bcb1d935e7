"""Where a run ran: ``provenance.json`` in its run directory, one segment per start.

Rank 0 writes the file when a run starts and adds a segment each time it is resumed::

    {"segments": [{"started_at": "2026-05-01T12:00:00+0000", "start_round": 0, "mpifed": "0.9.0",
                   "git_commit": "1a2b...", "git_dirty": false, "python": "3.11.9", "torch": "2.14.1",
                   "cuda": null, "ranks": [{"rank": 0, "role": "server", "host": "n1",
                   "node_worker": -1, "node_gpus": 0, "cpu": "AMD EPYC 7763 64-Core Processor",
                   "cpu_id": "family 25 model 1 stepping 1 flags 3f2a9c0d1e", "blas": "mkl", "device": "cpu",
                   "gpu": null, "threads": 1}, ...]}]}

``node_worker`` is a rank's number among the workers of its host (-1 for the server), from which
its device is chosen (``cuda:(node_worker % node_gpus)``, see :mod:`mpifed.round.placement`).
``cpu_id`` tells apart machines whose model name a virtual machine masks ("AMD EPYC"): the CPU's
family, model and stepping and a digest of its feature flags (which decide the vector code BLAS
and PyTorch run); ``blas`` is the BLAS PyTorch was built with. Both are absent from runs recorded
before they were added.

``git_commit`` and ``git_dirty`` (tracked files of the checkout changed since that commit, or
files inside the package that git does not track) are recorded when mpifed runs from a git
checkout, else null. ``plugins`` lists the code from outside mpifed that was loaded (name,
origin, SHA-256, what it registered, whether the run uses it, and its copy in the run's
``plugins/`` folder). ``code_changed`` (only in a segment resumed with ``--trust-changed-code``)
maps each kind whose plugin changed since the segment before (``algorithm``) to its hashes
``{"from": ..., "to": ...}``. :func:`machine` describes the machine(s) of a
run in one line, so that runs made on different machines can be told apart.
"""
from __future__ import annotations

import hashlib
import json
import platform
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from mpifed import __version__
from mpifed.run.rundir import PROVENANCE, atomic_write



def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_id() -> str | None:
    """``family 25 model 1 stepping 1 flags <digest>`` from /proc/cpuinfo's first processor; None
    where it has no such fields (another OS, another architecture)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = fields.get("flags") or fields.get("Features")
    if "cpu family" not in fields or flags is None:
        return None
    digest = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:10]
    return (f"family {fields['cpu family']} model {fields.get('model', '?')} stepping {fields.get('stepping', '?')} "
            f"flags {digest}")


def blas() -> str | None:
    """The BLAS PyTorch was built with (``mkl``, ``open``, ...), from its build configuration."""
    import torch
    found = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return found.group(1) if found else None


def rank_details(device: Any) -> dict[str, Any]:
    """This rank's CPU (model name, :func:`cpu_id`), PyTorch's BLAS and, on a GPU, the GPU's name."""
    import torch
    gpu = torch.cuda.get_device_name(device) if getattr(device, "type", "cpu") == "cuda" else None
    return {"cpu": cpu_model(), "cpu_id": cpu_id(), "blas": blas(), "gpu": gpu}


def _git(*args: str) -> str | None:
    source = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_commit() -> tuple[str | None, bool | None]:
    """The git commit of mpifed's source and whether the checkout differs from it: a tracked file
    changed, or a file inside the package that git does not track (a method dropped into
    mpifed/algorithms/); (None, None) when the source is not the top of a git checkout (an
    installed package)."""
    untracked = untracked_source_files()
    if untracked is None:
        return None, None
    changes = _git("status", "--porcelain", "--untracked-files=no")
    if changes is None:
        return _git("rev-parse", "HEAD"), None
    return _git("rev-parse", "HEAD"), bool(changes) or bool(untracked)


def untracked_source_files() -> list[Path] | None:
    """The files inside the package that its git checkout does not track (a method dropped into
    mpifed/algorithms/ and not committed), ignored files left out; None when the source is not the
    top of a git checkout (an installed package)."""
    package = Path(__file__).resolve().parents[1]
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != package.parent:
        return None
    listed = _git("ls-files", "--others", "--exclude-standard", "--full-name", "-z", "--", str(package))
    return None if listed is None else [Path(top) / name for name in listed.split("\0") if name]


def segment(ranks: list[dict[str, Any]], start_round: int, plugins: list[dict[str, Any]] | None = None,
            code_changed: dict[str, dict[str, str | None]] | None = None) -> dict[str, Any]:
    """One start of a run: when, from which round, which software (with every plugin loaded, see
    :func:`mpifed.settings.plugins.keep_copies`, and the plugins changed since the start before), and
    each rank's machine."""
    import torch
    commit, dirty = source_commit()
    keep = ("rank", "role", "host", "node_worker", "node_gpus", "cpu", "cpu_id", "blas", "device", "gpu", "threads")
    return {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "start_round": start_round, "mpifed": __version__,
            "git_commit": commit, "git_dirty": dirty, "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "plugins": list(plugins or []),
            **({"code_changed": code_changed} if code_changed else {}),
            "ranks": [{k: r.get(k) for k in keep} for r in ranks]}


def read(run_dir: Path) -> dict[str, Any] | None:
    """A run's provenance (``{"segments": [...]}``); None when it has none or it cannot be read."""
    try:
        data = json.loads((Path(run_dir) / PROVENANCE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("segments"), list) else None


def record(run_dir: Path, ranks: list[dict[str, Any]], start_round: int, plugins: list[dict[str, Any]] | None = None,
           code_changed: dict[str, dict[str, str | None]] | None = None) -> None:
    """Add this start's segment to the run's provenance (atomically; the file is made on the first start)."""
    found = read(run_dir) or {"segments": []}
    found["segments"].append(segment(ranks, start_round, plugins, code_changed))
    atomic_write(Path(run_dir) / PROVENANCE, json.dumps(found, indent=1) + "\n")


def recorded_plugins(run_dir: Path) -> list[dict[str, Any]]:
    """The plugins the run's latest start recorded (empty for a run that used none, or from before
    runs recorded them)."""
    found = read(run_dir)
    segments = found["segments"] if found else []
    last = segments[-1] if segments and isinstance(segments[-1], dict) else {}
    listed = last.get("plugins")
    return [p for p in listed if isinstance(p, dict) and {"kind", "origin", "module", "sha256"} <= set(p)] \
        if isinstance(listed, list) else []


HARDWARE = ("cpu_id", "blas", "gpu")    # what makes a run's numbers differ between machines, with torch


def hardware(provenance: dict[str, Any]) -> dict[str, frozenset[str]]:
    """What of a run's machine(s) its numbers depend on, field by field: the CPUs' :func:`cpu_id`, the
    BLAS, the GPUs' names and the torch versions, each the set of values recorded (empty where not
    recorded, as in runs from before mpifed recorded it). Host names are left out: identical nodes of
    a cluster are one machine here."""
    segments = provenance.get("segments", [])
    ranks = [r for s in segments for r in s.get("ranks", [])]
    found = {k: frozenset(str(r[k]) for r in ranks if r.get(k)) for k in HARDWARE}
    found["torch"] = frozenset(str(s["torch"]) for s in segments if s.get("torch"))
    return found


def hardware_conflict(a: dict[str, frozenset[str]], b: dict[str, frozenset[str]]) -> str | None:
    """Where two runs' :func:`hardware` differ in a field both recorded (``cpu_id A against B``), else None."""
    for k in (*HARDWARE, "torch"):
        if a.get(k) and b.get(k) and a[k] != b[k]:
            return f"{k} {' + '.join(sorted(a[k]))} against {' + '.join(sorted(b[k]))}"
    return None


def machine(provenance: dict[str, Any]) -> str:
    """The machine(s) a run ran on, in one stable line: host names, CPUs (the model name, with the
    :func:`cpu_id` where recorded), GPU names, torch versions (each sorted, several joined by " + "),
    e.g. ``n1; CPU AMD EPYC (family 25 model 1 stepping 1 flags 3f2a9c0d1e); GPU none; torch 2.14.1``."""
    segments = provenance.get("segments", [])
    ranks = [r for s in segments for r in s.get("ranks", [])]

    def values(found: Any) -> str:
        return " + ".join(sorted({str(v) for v in found if v})) or "none"

    def cpu(r: dict[str, Any]) -> Any:
        return f"{r.get('cpu')} ({r['cpu_id']})" if r.get("cpu") and r.get("cpu_id") else r.get("cpu")
    return (f"{values(r.get('host') for r in ranks)}; CPU {values(cpu(r) for r in ranks)}; "
            f"GPU {values(r.get('gpu') for r in ranks)}; torch {values(s.get('torch') for s in segments)}")
