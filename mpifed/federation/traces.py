"""Device and availability traces in FedScale's format, read without running code.

FedScale ships two pickled dicts keyed by client id (``docs/trace_formats`` of its repository):

* ``client_device_capacity``: ``{client_id: {"computation": ms per sample, "communication": kbit/s}}``;
* ``client_behave_trace``: ``{client_id: {"active": [s, ...], "inactive": [s, ...], "finish_time": s,
  ...}}``: the client is available from each ``active[i]`` to ``inactive[i]``, and the pattern
  repeats every ``finish_time`` seconds (other keys, such as ``duration`` and ``model``, are
  ignored).

A pickle can run any code when it is loaded, so these are read by an unpickler that builds only
dicts, lists, tuples, strings, numbers, booleans and None, and refuses everything else (a class,
a function: what an attack, or numpy scalars, would need) before it is built. The same traces
can be written as CSV, one client a line with a header:

* device: ``client_id,computation,communication``;
* availability: ``client_id,finish_time,active,inactive``, the two lists ``;``-separated
  (``7,86400,0;43200,3600;50000``).

A trace's rows are sorted by client id; run client ``c`` takes row ``c mod rows``, or, with
``system.trace_mapping: permutation``, row ``perm[c mod rows]`` of a permutation drawn from the
run's seed.
"""
from __future__ import annotations

import csv
import io
import math
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAX_BYTES = 1 << 30          # a trace larger than 1 GiB is refused before it is read


class TraceError(ValueError):
    """A trace file is unreadable, of another format, or holds what a trace cannot."""


class _DataOnly(pickle.Unpickler):
    """Builds the plain data types only: every global a pickle asks for is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise TraceError(f"it asks for {module}.{name}, and a trace holds only dicts, lists, strings and numbers "
                         f"(loading it would run code)")


@dataclass(frozen=True)
class DeviceTrace:
    """Per trace row: milliseconds of computation per sample and kbit/s of bandwidth."""

    ms_per_sample: np.ndarray
    kbit_per_s: np.ndarray

    def __len__(self) -> int:
        return len(self.ms_per_sample)


@dataclass(frozen=True)
class AvailabilityTrace:
    """Per trace row: the period (``finish_time``), and the windows when the client is available."""

    period: np.ndarray                       # seconds
    windows: tuple[np.ndarray, ...]          # per row: (w, 2) [active, inactive) pairs within the period

    def __len__(self) -> int:
        return len(self.period)

    def available(self, row: int, t: float) -> bool:
        """Whether trace row ``row`` is available at simulated time ``t``."""
        phase = math.fmod(t, float(self.period[row])) if self.period[row] > 0 else t
        w = self.windows[row]
        return bool(np.any((w[:, 0] <= phase) & (phase <= w[:, 1])))


def read_device_trace(path: Path) -> DeviceTrace:
    """A FedScale ``client_device_capacity`` pickle, or its CSV form."""
    rows = _rows(path, ("computation", "communication"))
    ms = np.array([_number(r, "computation", path, cid) for cid, r in rows], dtype=np.float64)
    kbit = np.array([_number(r, "communication", path, cid) for cid, r in rows], dtype=np.float64)
    if np.any(ms <= 0) or np.any(kbit <= 0):
        raise TraceError(f"{path}: every client's computation (ms per sample) and communication (kbit/s) must be "
                         f"above 0")
    return DeviceTrace(ms, kbit)


def read_availability_trace(path: Path) -> AvailabilityTrace:
    """A FedScale ``client_behave_trace`` pickle, or its CSV form."""
    rows = _rows(path, ("finish_time", "active", "inactive"))
    periods, windows = [], []
    for cid, r in rows:
        period = _number(r, "finish_time", path, cid)
        active, inactive = _times(r, "active", path, cid), _times(r, "inactive", path, cid)
        if len(active) != len(inactive) or not active or period <= 0:
            raise TraceError(f"{path}: client {cid} needs as many active as inactive times (at least one) and a "
                             f"finish_time above 0; it has {len(active)} and {len(inactive)}, finish_time {period}")
        if any(b < a for a, b in zip(active, inactive)):
            raise TraceError(f"{path}: client {cid} has an inactive time before its active time")
        periods.append(period)
        windows.append(np.array(list(zip(active, inactive)), dtype=np.float64))
    return AvailabilityTrace(np.array(periods, dtype=np.float64), tuple(windows))


def _rows(path: Path, needs: tuple[str, ...]) -> list[tuple[Any, dict[str, Any]]]:
    """(client id, entry) of each client of a trace, sorted by client id."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror})") from None
    if size > MAX_BYTES:
        raise TraceError(f"{path} is {size} bytes, above the {MAX_BYTES} a trace may have")
    raw = path.read_bytes()
    found = _csv(raw, path, needs) if path.suffix.lower() == ".csv" else _pickle(raw, path)
    if not isinstance(found, dict) or not found:
        raise TraceError(f"{path}: a trace maps client ids to their entries (a non-empty dict), got "
                         f"{type(found).__name__}")
    bad = [k for k, v in found.items() if not isinstance(v, dict) or not set(needs) <= set(v)]
    if bad:
        raise TraceError(f"{path}: client {bad[0]!r}'s entry lacks {', '.join(needs)} (FedScale's format: "
                         f"{{client_id: {{{', '.join(repr(n) + ': ...' for n in needs)}}}}})")
    try:
        return sorted(found.items(), key=lambda item: item[0])
    except TypeError:
        return sorted(found.items(), key=lambda item: str(item[0]))


def _pickle(raw: bytes, path: Path) -> Any:
    try:
        return _DataOnly(io.BytesIO(raw)).load()
    except TraceError as exc:
        raise TraceError(f"{path} is refused: {exc}") from None
    except Exception as exc:   # a damaged pickle fails in many ways
        raise TraceError(f"{path} is not a trace pickle ({type(exc).__name__}: {exc}); give FedScale's file or its "
                         f"CSV form") from None


def _csv(raw: bytes, path: Path, needs: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    try:
        reader = csv.DictReader(io.StringIO(raw.decode("utf-8")))
        fields = set(reader.fieldnames or [])
        if not {"client_id", *needs} <= fields:
            raise TraceError(f"{path}: its header must name client_id, {', '.join(needs)}; it names "
                             f"{', '.join(sorted(fields)) or 'nothing'}")
        out: dict[str, dict[str, Any]] = {}
        for line in reader:
            entry = {k: line[k] for k in needs}
            for k in ("active", "inactive"):
                if k in entry:
                    entry[k] = [x for x in (entry[k] or "").split(";") if x.strip()]
            out[_client_id(line["client_id"])] = entry
        return out
    except UnicodeDecodeError:
        raise TraceError(f"{path} is not UTF-8 text") from None


def _client_id(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def _number(entry: dict[str, Any], key: str, path: Path, cid: Any) -> float:
    try:
        value = float(entry[key])
    except (TypeError, ValueError):
        raise TraceError(f"{path}: client {cid}'s {key} is {entry[key]!r}, not a number") from None
    if not math.isfinite(value):
        raise TraceError(f"{path}: client {cid}'s {key} is not finite")
    return value


def _times(entry: dict[str, Any], key: str, path: Path, cid: Any) -> list[float]:
    listed = entry[key]
    if not isinstance(listed, (list, tuple)):
        raise TraceError(f"{path}: client {cid}'s {key} must be a list of times, got {listed!r}")
    return [_number({key: x}, key, path, cid) for x in listed]
