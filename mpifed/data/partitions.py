"""How training samples are split over clients.

Each partition is a class with ``Options`` and ``split(labels, num_clients, rng,
options, groups, indices)`` returning one index array (positions in ``labels``) per
client; ``groups`` gives each sample's writer or domain where the data set has one, and
``indices`` each sample's index in the training set (the server's held-out samples are not
among ``labels``). Partitions are registered with
``@PARTITIONS.register("name")`` (:data:`mpifed.plugin.registry.PARTITIONS`). All are deterministic in the
generator they are given; every sample goes to at most one client (every sample to
exactly one, except where a partition says otherwise).
"""
from __future__ import annotations

from dataclasses import dataclass
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any, Literal

import numpy as np

from mpifed.plugin.options import NoOptions, opt
from mpifed.plugin.registry import PARTITIONS


class PartitionError(ValueError):
    """The partition cannot be made with these settings."""


def _check_enough(n: int, num_clients: int) -> None:
    if n < num_clients:
        raise PartitionError(f"{n} training samples cannot be split over {num_clients} clients; lower data.num_clients")


@PARTITIONS.register("iid")
class IID:
    """Uniformly random, equal-sized clients (sizes differ by at most one)."""

    Options = NoOptions

    @staticmethod
    def split(labels: np.ndarray, num_clients: int, rng: np.random.Generator, options: NoOptions,
              groups: np.ndarray | None = None, indices: np.ndarray | None = None) -> list[np.ndarray]:
        _check_enough(len(labels), num_clients)
        return [np.sort(p) for p in np.array_split(rng.permutation(len(labels)), num_clients)]


@PARTITIONS.register("dirichlet")
class Dirichlet:
    """Latent Dirichlet Allocation label skew (FedNTD App. B.5, NIID-Bench/MOON code).

    For every class, proportions over the clients are drawn from Dir(beta) and the
    class's samples are cut accordingly. With ``balance`` (as in the NIID-Bench/MOON
    code that FedCSD, FedCAD and FedGKD use), a client already holding N/K samples gets
    no more. The whole draw is repeated until every client has ``min_size`` samples.
    """

    @dataclass
    class Options:
        beta: float = opt(0.5, "Dirichlet concentration; smaller is more skewed", min=0, exclusive_min=True)
        min_size: int = opt(10, "redraw until every client has at least this many samples", min=0)
        balance: bool = opt(True, "stop giving samples to clients that already hold N/K (NIID-Bench)")
        max_tries: int = opt(10000, "give up after this many draws", min=1)

    @staticmethod
    def split(labels: np.ndarray, num_clients: int, rng: np.random.Generator, options: "Dirichlet.Options",
              groups: np.ndarray | None = None, indices: np.ndarray | None = None) -> list[np.ndarray]:
        n = len(labels)
        if options.min_size * num_clients > n:
            raise PartitionError(
                f"{num_clients} clients x data.partition.min_size={options.min_size} exceeds the {n} training samples; "
                f"lower data.partition.min_size or data.num_clients")
        classes = np.unique(labels)
        by_class = [np.flatnonzero(labels == c) for c in classes]
        for _ in range(options.max_tries):
            parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
            sizes = np.zeros(num_clients, dtype=np.int64)
            for idx in by_class:
                idx = rng.permutation(idx)
                p = rng.dirichlet(np.full(num_clients, options.beta))
                if options.balance:
                    p = p * (sizes < n / num_clients)
                    p = p / p.sum() if p.sum() > 0 else np.full(num_clients, 1.0 / num_clients)
                cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
                for k, piece in enumerate(np.split(idx, cuts)):
                    parts[k].append(piece)
                    sizes[k] += len(piece)
            if sizes.min() >= options.min_size:
                return [np.sort(np.concatenate(p)) for p in parts]
        raise PartitionError(
            f"Dirichlet(beta={options.beta}) did not give every one of {num_clients} clients "
            f"{options.min_size} samples in {options.max_tries} draws; raise data.partition.beta, "
            f"lower data.partition.min_size or data.num_clients")


@PARTITIONS.register("shards")
class Shards:
    """Sort by label, cut into ``K * shards_per_client`` equal shards, deal ``s`` at random to each client.

    McMahan et al.'s pathological split as FedNTD uses it (App. B.5). Shard sizes differ
    by at most one when N is not a multiple of K*s; within a class the order is random.
    """

    @dataclass
    class Options:
        shards_per_client: int = opt(2, "shards per client (s); fewer is more skewed", min=1)

    @staticmethod
    def split(labels: np.ndarray, num_clients: int, rng: np.random.Generator, options: "Shards.Options",
              groups: np.ndarray | None = None, indices: np.ndarray | None = None) -> list[np.ndarray]:
        total = num_clients * options.shards_per_client
        if total > len(labels):
            raise PartitionError(
                f"{num_clients} clients x {options.shards_per_client} shards exceed the {len(labels)} samples; "
                f"lower data.partition.shards_per_client or data.num_clients")
        order = rng.permutation(len(labels))
        order = order[np.argsort(labels[order], kind="stable")]
        shards = np.array_split(order, total)
        deal = rng.permutation(total).reshape(num_clients, options.shards_per_client)
        return [np.sort(np.concatenate([shards[s] for s in row])) for row in deal]


@PARTITIONS.register("label_k")
class LabelK:
    """Each client holds ``k`` classes (NIID-Bench's #C=k): client i gets class i mod C plus k-1
    other random classes; each class's samples are split evenly among the clients holding it.
    Samples of a class no client drew are left out (only possible when K * k < C)."""

    @dataclass
    class Options:
        k: int = opt(2, "classes per client", min=1)

    @staticmethod
    def split(labels: np.ndarray, num_clients: int, rng: np.random.Generator, options: "LabelK.Options",
              groups: np.ndarray | None = None, indices: np.ndarray | None = None) -> list[np.ndarray]:
        classes = np.unique(labels)
        if options.k > len(classes):
            raise PartitionError(f"data.partition.k={options.k} exceeds the {len(classes)} classes")
        held = []
        for i in range(num_clients):
            first = classes[i % len(classes)]
            others = rng.permutation(classes[classes != first])[: options.k - 1]
            held.append({int(first), *map(int, others)})
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            owners = [i for i in range(num_clients) if int(c) in held[i]]
            if owners:
                for i, piece in zip(owners, np.array_split(rng.permutation(np.flatnonzero(labels == c)), len(owners))):
                    parts[i].append(piece)
        return [np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=np.int64) for p in parts]


@PARTITIONS.register("quantity")
class Quantity:
    """Quantity skew with IID labels: client sizes from Dir(beta) proportions (NIID-Bench), or a
    power law (size of the i-th client proportional to (i + 1)^-exponent, clients shuffled);
    samples dealt at random. Every client gets at least ``min_size`` samples."""

    @dataclass
    class Options:
        distribution: Literal["dirichlet", "power_law"] = opt("dirichlet", "how client sizes are drawn")
        beta: float = opt(0.5, "Dirichlet concentration of the size proportions", min=0, exclusive_min=True)
        exponent: float = opt(1.0, "power-law exponent", min=0)
        min_size: int = opt(10, "every client gets at least this many samples", min=1)

    @staticmethod
    def split(labels: np.ndarray, num_clients: int, rng: np.random.Generator, options: "Quantity.Options",
              groups: np.ndarray | None = None, indices: np.ndarray | None = None) -> list[np.ndarray]:
        n = len(labels)
        if options.min_size * num_clients > n:
            raise PartitionError(f"{num_clients} clients x data.partition.min_size={options.min_size} exceed {n} "
                                 "samples")
        if options.distribution == "dirichlet":
            p = rng.dirichlet(np.full(num_clients, options.beta))
        else:
            p = rng.permutation((np.arange(num_clients) + 1.0) ** -options.exponent)
            p = p / p.sum()
        spare = n - options.min_size * num_clients
        sizes = options.min_size + np.floor(p * spare).astype(np.int64)
        sizes[: n - sizes.sum()] += 1
        return [np.sort(piece) for piece in np.split(rng.permutation(n), np.cumsum(sizes)[:-1])]


@PARTITIONS.register("natural")
class Natural:
    """The data set's own groups (FEMNIST's writers): groups are shuffled and dealt to the clients
    in K nearly equal runs (NIID-Bench's "real" FEMNIST split; FedCAD's ~2,000 writers into
    10 clients)."""

    Options = NoOptions

    @staticmethod
    def split(labels: np.ndarray, num_clients: int, rng: np.random.Generator, options: NoOptions,
              groups: np.ndarray | None = None, indices: np.ndarray | None = None) -> list[np.ndarray]:
        if groups is None:
            raise PartitionError("partition 'natural' needs a data set with writers or users (femnist); use dirichlet "
                                 "otherwise")
        ids = np.unique(groups)
        if len(ids) < num_clients:
            raise PartitionError(f"{len(ids)} writers cannot be split over {num_clients} clients; set "
                                 f"data.num_clients to {len(ids)} (a client per writer) or fewer")
        owner = np.empty(len(ids), dtype=np.int64)          # each writer's client, writers in ``ids`` order
        for client, run in enumerate(np.array_split(rng.permutation(ids), num_clients)):
            owner[np.searchsorted(ids, run)] = client
        client_of = owner[np.searchsorted(ids, groups)]
        order = np.argsort(client_of, kind="stable")       # by client, each client's rows in ascending order
        return np.split(order, np.cumsum(np.bincount(client_of, minlength=num_clients))[:-1])


@PARTITIONS.register("domain")
class Domain:
    """One client per domain (Office-Caltech-10's amazon, caltech, dslr, webcam), in the data set's order."""

    Options = NoOptions

    @staticmethod
    def split(labels: np.ndarray, num_clients: int, rng: np.random.Generator, options: NoOptions,
              groups: np.ndarray | None = None, indices: np.ndarray | None = None) -> list[np.ndarray]:
        if groups is None:
            raise PartitionError("partition 'domain' needs a data set with domains (office_caltech)")
        ids = np.unique(groups)
        if len(ids) != num_clients:
            raise PartitionError(f"partition 'domain' makes one client per domain: set data.num_clients={len(ids)}")
        return [np.flatnonzero(groups == g) for g in ids]


@PARTITIONS.register("dirichlet_chunks")
class DirichletChunks:
    """FedGKD's official split (``pcode/datasets/partition_data.py``, ``build_non_iid_by_dirichlet``):
    the shuffled training set is cut into ceil(K / ``group``) equal parts; each part is split
    over ``group`` clients by a Dirichlet(beta) per class with NIID-Bench's balance rule,
    redrawn until each of them holds at least ``min_fraction`` of its fair share; each of
    those lists is ordered by class; all lists are concatenated and the result re-cut into K
    equal contiguous slices. Every client holds the same number of samples, so uniform and
    sample-weighted averaging agree; a client's classes come from up to two Dirichlet lists."""

    @dataclass
    class Options:
        beta: float = opt(0.5, "Dirichlet concentration; smaller is more skewed", min=0, exclusive_min=True)
        group: int = opt(10, "clients per Dirichlet draw (the code's n_auxi_workers)", min=1)
        min_fraction: float = opt(0.5, "redraw until every client of a draw holds this fraction of its "
                                       "fair share", min=0, max=1)
        max_tries: int = opt(10000, "give up after this many draws", min=1)

    @staticmethod
    def split(labels: np.ndarray, num_clients: int, rng: np.random.Generator, options: "DirichletChunks.Options",
              groups: np.ndarray | None = None, indices: np.ndarray | None = None) -> list[np.ndarray]:
        _check_enough(len(labels), num_clients)
        order = rng.permutation(len(labels))
        parts = -(-num_clients // options.group)
        size = len(labels) // parts
        lists: list[np.ndarray] = []
        for p in range(parts):
            chunk = order[p * size: (p + 1) * size]
            clients = min(options.group, num_clients - p * options.group)
            opts = Dirichlet.Options(beta=options.beta, min_size=int(options.min_fraction * size / clients),
                                     balance=True, max_tries=options.max_tries)
            for piece in Dirichlet.split(labels[chunk], clients, rng, opts):
                members = chunk[piece]
                lists.append(members[np.argsort(labels[members], kind="stable")])
        flat = np.concatenate(lists)
        share = len(flat) // num_clients
        return [np.sort(flat[k * share: (k + 1) * share]) for k in range(num_clients)]


def _npz_order(name: str) -> tuple[int, str]:
    """numpy.savez(f, *clients) names them arr_0, arr_1, ...: their number orders them (then names)."""
    found = re.fullmatch(r"(?:arr_)?(\d+)", name)
    return (int(found.group(1)), "") if found else (sys.maxsize, name)


@PARTITIONS.register("from_file")
class FromFile:
    """A split made elsewhere, exactly: a JSON file mapping each client to its training-sample
    indices (``{"0": [...], "1": [...]}`` or a list of lists), a NumPy ``.npz`` file of one index
    array per client (``numpy.savez(f, *clients)``) or a ``.npy`` file of a 2-D array of
    equal-sized clients; NumPy files are read without unpickling (an object array is refused).
    Indices refer to the training set as mpifed reads it (after ``data.train_subset``). They are checked: the number of
    clients, indices in range, no sample given twice, none held by the server."""

    @dataclass
    class Options:
        path: str = opt("", "JSON, .npz or .npy file mapping each client to its training-sample indices")

    @staticmethod
    def fingerprint(options: "FromFile.Options") -> dict[str, str]:
        """The file's content hash, part of the prepared data's spec (a changed file re-prepares)."""
        path = FromFile._existing(options.path)
        try:
            return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        except OSError as exc:
            raise PartitionError(f"partition file {path} cannot be read ({exc.strerror})") from None

    @staticmethod
    def _existing(path: str | Path) -> Path:
        """``path`` as a Path, or a PartitionError saying why it is not a file to read."""
        if not str(path):
            raise PartitionError("data.partition.path is not set: give the JSON, .npz or .npy file that maps each "
                                 "client to its training-sample indices")
        path = Path(path)
        if path.is_dir():
            raise PartitionError(f"partition file {path} is a folder, not a file; set data.partition.path to the "
                                 f"JSON, .npz or .npy file")
        if not path.is_file():
            raise PartitionError(f"partition file {path} does not exist; set data.partition.path")
        return path

    @staticmethod
    def read(path: str | Path) -> list[np.ndarray]:
        path = FromFile._existing(path)
        clients = FromFile._read_npy(path) if path.suffix in (".npy", ".npz") else FromFile._read_json(path)
        if not clients:
            raise PartitionError(f"partition file {path} lists no clients; it must map each client 0..K-1 to its "
                                 f"training-sample indices")
        out = []
        for k, c in enumerate(clients):
            try:
                arr = np.asarray(c)
                indices = arr.ndim == 1 and (not arr.size or np.issubdtype(arr.dtype, np.integer))
            except ValueError:   # a ragged nested list
                indices = False
            if not indices:
                raise PartitionError(f"partition file {path}: client {k} is not a list of integer indices")
            out.append(arr.astype(np.int64))
        return out

    @staticmethod
    def _read_npy(path: Path) -> list[Any]:
        """A .npy file of a 2-D integer array (a row per client), or a .npz file of one index array
        per client; read without unpickling (which could run code from the file)."""
        with open(path, "rb") as f:
            head = f.read(6)
        if not head.startswith((b"\x93NUMPY", b"PK")):
            raise PartitionError(f"partition file {path} is not a NumPy .npy or .npz file (it lacks their header); "
                                 f"write it with numpy.save or numpy.savez, or use a JSON file")
        try:
            data = np.load(path, allow_pickle=False)
            if isinstance(data, np.lib.npyio.NpzFile):   # its arrays are read (and refused) here, inside the guard
                with data:
                    return [data[name] for name in sorted(data.files, key=_npz_order)]
        except ValueError as exc:
            if "allow_pickle" not in str(exc):
                raise PartitionError(f"partition file {path} is not a readable NumPy file ({exc})") from None
            raise PartitionError(f"partition file {path} holds Python objects (an object array), which NumPy reads "
                                 f"only by unpickling, and unpickling can run code from the file, so it was not read. "
                                 f"Save one index array per client without pickling: numpy.savez('{path.stem}.npz', "
                                 f"*clients) (clients of any sizes), or a JSON file") from None
        except Exception as exc:  # a damaged file fails inside numpy in many ways
            raise PartitionError(f"partition file {path} is not a readable NumPy file ({type(exc).__name__}: "
                                 f"{exc}); write it with numpy.save or numpy.savez, or use a JSON file") from None
        if not isinstance(data, np.ndarray) or data.ndim == 0:
            raise PartitionError(f"partition file {path} holds a single value, not one index array per client: save "
                                 f"a 2-D array of equal-sized clients, or numpy.savez('{path.stem}.npz', *clients)")
        return list(data)

    @staticmethod
    def _read_json(path: Path) -> list[Any]:
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PartitionError(f"partition file {path} is not valid JSON ({exc}); a NumPy file must end in .npz or "
                                 ".npy") from None
        except OSError as exc:
            raise PartitionError(f"partition file {path} cannot be read ({exc.strerror})") from None
        if isinstance(data, dict):
            try:
                keys = sorted(data, key=int)
            except ValueError:
                raise PartitionError(f"partition file {path}: keys must be client numbers 0..K-1") from None
            if [int(k) for k in keys] != list(range(len(keys))):
                raise PartitionError(f"partition file {path}: clients must be numbered 0..{len(keys) - 1}")
            return [data[k] for k in keys]
        if isinstance(data, list):
            return data
        raise PartitionError(f"partition file {path} must hold a mapping or a list of index lists")

    @staticmethod
    def split(labels: np.ndarray, num_clients: int, rng: np.random.Generator, options: "FromFile.Options",
              groups: np.ndarray | None = None, indices: np.ndarray | None = None) -> list[np.ndarray]:
        path = Path(options.path)
        clients = FromFile.read(options.path)
        if len(clients) != num_clients:
            raise PartitionError(f"partition file {path} has {len(clients)} clients; set "
                                 f"data.num_clients={len(clients)}")
        indices = np.arange(len(labels)) if indices is None else indices
        total = int(indices.max()) + 1 if len(indices) else 0
        position = np.full(max(total, 1), -1, dtype=np.int64)
        position[indices] = np.arange(len(indices))
        seen = np.zeros(max(total, 1), dtype=bool)
        out = []
        for k, idx in enumerate(clients):
            bad = idx[(idx < 0) | (idx >= total)]
            if len(bad):
                raise PartitionError(f"partition file {path}: client {k} has index {int(bad[0])}, outside the "
                                     f"{total} training samples")
            values, counts = np.unique(idx, return_counts=True)
            if (counts > 1).any() or seen[idx].any():
                again = idx[seen[idx]] if seen[idx].any() else values[counts > 1]
                raise PartitionError(f"partition file {path}: sample {int(again[0])} is given twice (client {k})")
            seen[idx] = True
            held = idx[position[idx] < 0]
            if len(held):
                raise PartitionError(f"partition file {path}: sample {int(held[0])} (client {k}) is held by the server "
                                     "(data.server_holdout_per_class); set it to 0 or leave those samples out of the "
                                     "file")
            out.append(np.sort(position[idx]))
        return out


def split_summary(parts: list[np.ndarray], labels: np.ndarray, num_classes: int, group: int = 65536) -> np.ndarray:
    """Per-client class counts, K x C (counted ``group`` clients at a time: no array per client)."""
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for first in range(0, len(parts), group):
        some = parts[first:first + group]
        owner = np.repeat(np.arange(len(some)), [len(p) for p in some])
        rows = np.concatenate(some).astype(np.int64, copy=False)
        counts[first:first + len(some)] = np.bincount(owner * num_classes + labels[rows],
                                                      minlength=len(some) * num_classes).reshape(-1, num_classes)
    return counts


def hold_out_per_class(labels: np.ndarray, per_class: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(held-out indices, remaining indices): ``per_class`` random samples of every class held out."""
    held = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if len(idx) <= per_class:
            raise PartitionError(
                f"class {c} has {len(idx)} training samples, not more than data.server_holdout_per_class={per_class}; "
                "lower it")
        held.append(rng.choice(idx, size=per_class, replace=False))
    held_idx = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    mask = np.ones(len(labels), dtype=bool)
    mask[held_idx] = False
    return held_idx, np.flatnonzero(mask)


def hold_out_stratified(labels: np.ndarray, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(held-out indices, remaining indices), both sorted: ``size`` random samples whose classes
    are in proportion to ``labels`` (each class's share rounded down, the samples left over going
    to the classes with the largest remainders, the lower class first on a tie)."""
    if size >= len(labels):
        raise PartitionError(f"data.val_size={size} leaves no training samples of the {len(labels)}; lower it")
    classes, counts = np.unique(labels, return_counts=True)
    take, remainder = np.divmod(size * counts, len(labels))
    order = np.argsort(-remainder, kind="stable")
    take[order[:size - int(take.sum())]] += 1
    held = [rng.choice(np.flatnonzero(labels == c), size=k, replace=False) for c, k in zip(classes, take)]
    held_idx = np.sort(np.concatenate(held))
    mask = np.ones(len(labels), dtype=bool)
    mask[held_idx] = False
    return held_idx, np.flatnonzero(mask)
