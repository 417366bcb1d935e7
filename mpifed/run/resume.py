"""What a run directory that already holds a run allows: continue it, refuse, or nothing to do.

The policy, from the run's status.json and its latest complete checkpoint (rank 0 decides it
at start-up, with the run's lock held):

    --resume, a checkpoint        continue after the checkpoint's round, unless the settings that
                                  change the numbers (``math`` keys) or the prepared data differ
                                  (refused, naming them) or train.rounds is below the rounds done
                                  (refused); a checkpoint that predates a setting takes its default
    --resume, finished            nothing to do when train.rounds is the rounds done (or the run spent
                                  its system.time_budget); more rounds (or a larger budget)
                                  train further from the last checkpoint; with the checkpoints
                                  deleted, more rounds are refused
    --resume, no checkpoint       start from round 1
    --resume, failed              as above, saying that it had failed (also a ``running`` status: the
                                  resumer holds the lock, so its writer is gone); temporary files a
                                  failed write left are removed
    --resume, damaged             a finished run whose metrics.jsonl is torn: its records are written
                                  again from the last checkpoint; without one, refused
    --resume, read-only mount     a finished run with the rounds asked for: nothing to do; else refused
    a new run, directory taken    refused, unless --overwrite, which deletes only a directory
                                  mpifed made (it holds the ``.mpifed-run`` marker)
    a folder mpifed did not make  refused, whatever the request: mpifed writes only into a new or
                                  empty folder or one with its marker, never through a link
"""
from __future__ import annotations

import errno
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mpifed.run import checkpoint, provenance
from mpifed.settings import config, plugins
from mpifed.settings.plugins import COPIES
from mpifed.run.progress import count
from mpifed.run.rundir import CONFIG, KILLED, LOCK, MARKER, NotOurs, RunDir, RunLocked
from mpifed.run.state import RunState


class RunError(RuntimeError):
    """A problem with the run directory or resume request."""


class Unwritable(RunError):
    """The run directory cannot be written (read-only, not the user's, a full disk)."""


@dataclass(frozen=True)
class Decision:
    """How a run starts: after a checkpoint, from round 1, or not at all (``nothing_to_do`` says why)."""

    resume_from: Path | None = None
    nothing_to_do: str | None = None
    code_changed: dict[str, dict[str, str | None]] = field(default_factory=dict)   # kind -> {"from", "to"} hashes


def saved_config(run: RunDir) -> dict[str, Any]:
    """The config.yaml of a run to resume, or a RunError that says how to restore it."""
    if not run.holds_run():
        raise RunError(f"--resume {run.path}: no run there (no config.yaml); give the run directory, e.g. runs/<name>")
    try:
        saved = run.read_config()
    except yaml.YAMLError as exc:
        problem = f"is not valid YAML ({exc})"
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror})"
    else:
        if isinstance(saved, dict):
            return saved
        problem = "is empty" if saved is None else f"holds a {type(saved).__name__}, not a mapping of sections"
    latest = checkpoint.latest(run.checkpoints)
    if latest is None:
        fix = "Restore it from a copy, or start the run again with --overwrite (it has no checkpoint)"
    else:
        fix = (f"Restore it from the run's checkpoint, which holds the resolved config under the key 'config': "
               f"python -c \"import sys, yaml; from pathlib import Path; from mpifed.run.checkpoint import load; "
               f"print(yaml.safe_dump(load(Path(sys.argv[1]))['config'], sort_keys=False), end='')\" "
               f"{latest} > {run.path / CONFIG}")
    raise RunError(f"--resume {run.path}: its config.yaml {problem}, so the run's settings are unknown; nothing "
                   f"was changed. {fix}")


def take_lock(run: RunDir) -> None:
    """Hold the run directory's lock (for this process's life), or say plainly why not: another
    process holds it, or the directory is not mpifed's to write into (:meth:`RunDir.check_ours`)."""
    try:
        run.check_ours()
    except NotOurs as exc:
        raise RunError(str(exc)) from None
    try:
        warning = run.lock()
    except RunLocked as exc:
        raise RunError(str(exc)) from None
    except OSError as exc:
        raise Unwritable(unwritable_root(run.path, exc)) from None
    if warning:
        print(warning, file=sys.stderr, flush=True)


def unwritable_root(run_path: Path, exc: OSError) -> str:
    """Why the run directory ``run_path`` (or its lock file) could not be made (``exc``), and the fix."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = (f"the disk holding {run_path.parent} is full (or your quota is used up): free space there, or set "
               f"run.root=<folder elsewhere>")
    elif exc.errno == errno.EROFS:
        fix = f"{run_path.parent} is on a read-only file system: set run.root=<a folder you can write to>"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        fix = (f"you may not write into {run_path.parent if not run_path.is_dir() else run_path}: set "
               f"run.root=<a folder of yours>")
    elif exc.errno == errno.EISDIR and (run_path / LOCK).is_dir():
        fix = (f"{run_path / LOCK} is a folder, where mpifed keeps the run's lock file: remove it "
               f"(rmdir {run_path / LOCK})")
    else:
        fix = (f"run.root={run_path.parent} must be a folder you can write to (not a file, not under /proc or /sys); "
               f"set run.root=<folder>")
    return f"cannot create or lock the run directory {run_path} ({exc.strerror}): {fix}"


def make_room(run: RunDir, overwrite: bool) -> None:
    """For a new run: refuse a directory that holds a run, or clear it for ``--overwrite``."""
    if not run.holds_run():
        return
    if not overwrite:
        raise RunError(f"{run.path} already holds a run. Continue it with --resume {run.path}, start a new one "
                       f"with --set run.name=<new name>, or replace it with --overwrite")
    if not run.made_by_mpifed():
        raise RunError(f"--overwrite refused: {run.path} lacks the {MARKER} file that marks a directory mpifed "
                       f"made, so it is not deleted. Remove it yourself if it is a run, or choose another run.name")
    run.clear()


def finished_as_asked(run: RunDir, cfg: config.Config) -> bool:
    """Whether the run is finished with the rounds ``cfg`` asks for (a resume that has nothing to do,
    which even a read-only run directory allows)."""
    return _done_as_asked(run.status(), cfg)


def _done_as_asked(status: dict[str, Any] | None, cfg: config.Config) -> bool:
    """Whether a run with this status has trained what ``cfg`` asks: its rounds, or its simulated time budget."""
    if status is None or status["state"] != RunState.FINISHED:
        return False
    budget = cfg.system.time_budget
    return status.get("rounds_done") == cfg.train.rounds or (bool(budget) and status.get("sim_clock", 0.0) >= budget)


def decide(run: RunDir, cfg: config.Config, resolved: dict[str, Any], saved: dict[str, Any] | None,
           trusted: bool = False, changed_code: bool = False) -> Decision:
    """For ``--resume``: where the run continues from, given its state and the config now
    (``resolved``; ``saved`` is the run's config.yaml), or a RunError saying why it cannot
    (``trusted``: the checkpoint may hold other Python objects, see :func:`mpifed.run.checkpoint.load`;
    ``changed_code``: ``--trust-changed-code``, the plugins' code may differ from the checkpoint's)."""
    status = run.status()
    if status is not None and status["state"] == RunState.RUNNING:   # this process holds the lock: the writer is gone
        status = {**status, "state": RunState.FAILED, "error": KILLED}
    latest = checkpoint.latest(run.checkpoints)
    code_changed: dict[str, dict[str, str | None]] = {}
    if latest is not None:
        decision = _from_checkpoint(run, cfg, resolved, saved, checkpoint.load_run_state(latest, trusted), status,
                                    changed_code)
        if decision.nothing_to_do:
            return decision
        code_changed = decision.code_changed
    elif status is not None and status["state"] == RunState.FINISHED:
        return _finished_without_checkpoint(run, cfg, status)
    elif status is not None and status["state"] == RunState.DAMAGED:
        raise RunError(f"cannot resume {run.path}: {run.metrics_problem(status.get('rounds_done'))}, and it has no "
                       f"checkpoint left to write it from; nothing was changed. Start it again with --overwrite")
    if status is not None and status["state"] == RunState.DAMAGED:
        print(f"[mpifed] {run.path} is finished, but {run.metrics_problem(status.get('rounds_done'))}: writing its "
              f"records again from {latest}", flush=True)
    elif status is not None and status.get("error"):
        print(f"[mpifed] {run.path} had failed ({status['error']}); resuming it", flush=True)
    removed = run.remove_temporary()
    if removed:
        print(f"[mpifed] removed {len(removed)} temporary file(s) a failed write left in {run.path}", flush=True)
    return Decision(resume_from=latest, code_changed=code_changed)


def _from_checkpoint(run: RunDir, cfg: config.Config, resolved: dict[str, Any], saved: dict[str, Any] | None,
                     state: dict[str, Any], status: dict[str, Any] | None, changed_code: bool = False) -> Decision:
    rounds = cfg.train.rounds
    if state["rounds_done"] > rounds:
        raise RunError(f"cannot resume {run.path} with train.rounds={rounds}: it has already completed "
                       f"{count(state['rounds_done'], 'round')}. Set train.rounds to at least that")
    changed, predates = config.checkpoint_changes(state["config_math"], resolved, saved)
    code = [k for k in changed if k.split(".")[0] == "code"]
    if code and not changed_code:
        which = ", ".join(k.split(".", 1)[-1] for k in code)
        raise RunError(f"cannot resume {run.path}: the code of its {which} differs from the code the checkpoint was "
                       f"trained with ({_hashes(state['config_math'], resolved, code)}). Load the plugin the run "
                       f"started with (it keeps a copy in {run.path / COPIES}), or start a new run (another run.name), "
                       f"or, to continue this run with the changed code (a fix after the method failed; its "
                       f"provenance records both), add {plugins.CHANGED_FLAG}")
    code_changed = {k.split(".", 1)[1]: {"from": config.lookup(state["config_math"], k),
                                         "to": config.lookup(resolved, k)} for k in code}
    if code_changed:
        print(f"[mpifed] {run.path} continues with changed code ({_hashes(state['config_math'], resolved, code)}), "
              f"as {plugins.CHANGED_FLAG} allows; its provenance records both", flush=True)
    changed = [k for k in changed if k not in code]
    if changed:
        raise RunError(f"cannot resume {run.path}: these settings differ from the checkpoint and change the results: "
                       f"{', '.join(changed)}. Undo them, or start a new run (another run.name)")
    shown = ", ".join(f"{k}={config.lookup(resolved, k)!r}" for k in predates if k.split(".")[0] != "code")
    if shown:
        print(f"[mpifed] {run.path}'s checkpoint predates the settings {shown}: resuming with these defaults",
              flush=True)
    if any(k.split(".")[0] == "code" for k in predates) and any((resolved.get("code") or {}).values()):
        print(f"[mpifed] {run.path}'s checkpoint predates the record of a run's code: resuming with the plugins "
              f"loaded now", flush=True)
    if _done_as_asked(status, cfg) and state["rounds_done"] == status.get("rounds_done"):
        done = count(state["rounds_done"], "round")
        more = f"--set train.rounds=<more than {rounds}>" if state["rounds_done"] == rounds else \
            f"--set system.time_budget=<more than {cfg.system.time_budget:g}>"
        return Decision(nothing_to_do=f"[mpifed] {run.path} is finished ({done}): nothing to resume, "
                                      f"nothing changed. To train it further, resume with {more}")
    check_same_data(run.path, state, cfg)
    return Decision(code_changed=code_changed)


def _finished_without_checkpoint(run: RunDir, cfg: config.Config, status: dict[str, Any]) -> Decision:
    done = status.get("rounds_done")
    if not _done_as_asked(status, cfg):
        raise RunError(f"cannot resume {run.path} with train.rounds={cfg.train.rounds}: it is finished ({done} "
                       f"rounds) and has no checkpoint left in {run.checkpoints}, so it cannot be trained further; "
                       f"nothing was changed. Start a new run (another run.name) instead")
    return Decision(nothing_to_do=f"[mpifed] {run.path} is finished ({done} rounds; its checkpoints were deleted): "
                                  f"nothing to resume, nothing changed")


def _hashes(stored: dict[str, Any], now: dict[str, Any], keys: list[str]) -> str:
    def short(v: Any) -> str:
        return f"{v[:12]}..." if isinstance(v, str) else "mpifed's own"
    return "; ".join(f"{k.split('.', 1)[-1]}: {short(config.lookup(stored, k))} then, "
                     f"{short(config.lookup(now, k))} now" for k in keys)


def restore_code(run: RunDir, trust: bool = False, changed_code: bool = False) -> None:
    """Load the plugins the run in ``run`` recorded using (its provenance), before its config is read:
    the same code loaded already (``--plugin``, a config's ``plugins:``, an installed package), else,
    with ``trust`` (``--trust-run-code``), where it came from or the run's copy; a PluginError when
    that code changed (unless ``changed_code``, ``--trust-changed-code``) or is not allowed to run."""
    recorded = provenance.recorded_plugins(run.path)
    if recorded:
        plugins.restore(recorded, run.path, f"cannot resume {run.path}", changed="accept" if changed_code else "refuse",
                        trust=trust)


def check_same_data(run_path: Path, state: dict[str, Any], cfg: config.Config) -> None:
    """Refuse to resume when the prepared data the checkpoint was trained on would differ now (a
    ``from_file`` partition edited since, another tokenizer). A checkpoint that predates this
    record is not checked."""
    from mpifed.data.partitions import PartitionError
    from mpifed.preparation.spec import prepare_spec
    stored = state.get("data_spec")
    if stored is None:
        return
    try:
        now = prepare_spec(cfg)
    except (PartitionError, FileNotFoundError):
        return  # the file is gone: preparing the data reports it
    changed = config.diff_keys(stored, now)
    if any(k.startswith("partition.fingerprint") for k in changed):
        raise RunError(f"cannot resume {run_path}: the partition file {cfg.data.partition.options.path} changed since "
                       f"the run started (its content differs from the file the checkpoint was trained on), so the "
                       f"clients would not hold the same samples. Put back the file the run started with, or start "
                       f"a new run (another run.name)")
    if changed:
        raise RunError(f"cannot resume {run_path}: the data it was trained on changed since it started (differing: "
                       f"{', '.join(changed)}). Put back what the run started with, or start a new run "
                       f"(another run.name)")
