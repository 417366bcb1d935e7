"""Images kept in a temporary file instead of memory, for data sets larger than the memory should hold.

A data set's ``load`` appends its training images to an :class:`ImageRows` a part at a time and
returns it as ``RawData.train_x``; the prepare step then reads one block of clients' rows at a
time, so preparing holds the labels and one block, not every image. ``raw.select`` of it is lazy
(a view of some rows); reading rows (``rows[idx]``) returns them as an array.
"""
from __future__ import annotations

import os
import tempfile
from copy import copy as shallow_copy
from pathlib import Path

import numpy as np

READ_ROWS = 2**10      # scattered rows are read through a mapping of the file this many at a time


class ImageRows:
    """uint8 images N x C x H x W in an unnamed temporary file (gone when the object is, whatever the
    failure), under ``folder`` (default: the system's, ``TMPDIR``)."""

    def __init__(self, row_shape: tuple[int, ...], folder: Path | None = None) -> None:
        self._file = tempfile.TemporaryFile(dir=folder)
        self.row_shape = tuple(int(s) for s in row_shape)
        self._row_bytes = int(np.prod(self.row_shape))
        self._rows = 0                       # rows in the file
        self._index: np.ndarray | None = None   # the file's rows this view holds (None: all, in order)

    def append(self, images: np.ndarray) -> None:
        """Add images (uint8, n x ``row_shape``) at the end."""
        if self._index is not None:
            raise ValueError("rows are appended to the images themselves, not to a selection of them")
        if images.dtype != np.uint8 or tuple(images.shape[1:]) != self.row_shape:
            raise ValueError(f"images must be uint8 n x {self.row_shape}, got {images.dtype} {images.shape}")
        self._file.seek(0, os.SEEK_END)
        self._file.write(np.ascontiguousarray(images).tobytes())
        self._file.flush()
        self._rows += len(images)

    # ------------------------------------------------------------ what an array has
    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self.row_shape)

    dtype = np.dtype(np.uint8)
    itemsize = 1

    @property
    def ndim(self) -> int:
        return 1 + len(self.row_shape)

    def __len__(self) -> int:
        return self._rows if self._index is None else len(self._index)

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        return self[:] if dtype is None else self[:].astype(dtype)

    # ------------------------------------------------------------ rows
    def select(self, idx: np.ndarray | slice) -> "ImageRows":
        """A view of rows ``idx`` (positions in this view), reading nothing."""
        view = shallow_copy(self)
        view._index = self._file_rows(idx)
        return view

    def __getitem__(self, idx: np.ndarray | slice) -> np.ndarray:
        """Rows ``idx``, read from the file."""
        rows = self._file_rows(idx)
        out = np.empty((len(rows), self._row_bytes), dtype=np.uint8)
        if len(rows) and rows[-1] - rows[0] == len(rows) - 1 and np.all(np.diff(rows) == 1):
            self._read_run(int(rows[0]), out)
        else:
            order = np.argsort(rows, kind="stable")
            for i in range(0, len(rows), READ_ROWS):
                part = order[i:i + READ_ROWS]
                mapped = np.memmap(self._file, dtype=np.uint8, mode="r", shape=(self._rows, self._row_bytes))
                out[part] = mapped[rows[part]]
                del mapped                  # unmapped: the pages read leave this process's memory
        return out.reshape(len(rows), *self.row_shape)

    def _file_rows(self, idx: np.ndarray | slice) -> np.ndarray:
        if isinstance(idx, slice):
            positions = np.arange(*idx.indices(len(self)), dtype=np.int64)
        else:
            positions = np.asarray(idx)
            positions = np.flatnonzero(positions) if positions.dtype == bool else positions.astype(np.int64)
            if len(positions) and (positions.min() < -len(self) or positions.max() >= len(self)):
                raise IndexError(f"rows {positions.min()}..{positions.max()} of {len(self)}")
            positions = np.where(positions < 0, positions + len(self), positions)
        return positions if self._index is None else self._index[positions]

    def _read_run(self, first: int, out: np.ndarray) -> None:
        want, got = out.nbytes, 0
        view = memoryview(out.reshape(-1))
        while got < want:
            n = os.preadv(self._file.fileno(), [view[got:]], first * self._row_bytes + got)
            if n == 0:
                raise OSError(f"the temporary image file ends before row {first + got // self._row_bytes}")
            got += n
