"""`BlockTables`: the runner's side of the block-table deltas (`ScheduledSequence`).

Each sequence a runner has seen owns one row of a persistent int32 array. A batch's deltas are
applied in place (a full table on a sequence's first appearance, then only appended ids and
entries replaced by copy-on-write), so the per-step cost grows with what changed, never with the
length of the tables. Rows of finished sequences are reused. The real runner gathers a step's
rows from this array.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np


def stale_delta(s) -> RuntimeError:
    """The error for a delta (``full`` False) to a sequence the runner never saw in full."""
    return RuntimeError(f"batch: sequence {s.seq_id} (request {s.request_id!r}) carries a "
                        f"block-table delta, but this runner never saw it in full; the "
                        f"scheduler and the runner are out of step")


class BlockTables:
    """Block tables rebuilt from `ScheduledBatch` deltas (module docstring). `num_blocks`, when
    given, bounds every block id applied."""

    def __init__(self, num_blocks: Optional[int] = None, *, rows: int = 16,
                 columns: int = 16) -> None:
        self.num_blocks = num_blocks
        self.array = np.zeros((rows, columns), dtype=np.int32)
        self.lengths = np.zeros(rows, dtype=np.int64)
        self._row: Dict[int, int] = {}
        self._free: List[int] = list(range(rows - 1, -1, -1))
        self.ids_applied = 0  # block ids taken from batches so far: what the deltas cost

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._row

    def __len__(self) -> int:
        return len(self._row)

    def table(self, seq_id: int) -> Tuple[int, ...]:
        row = self._row[seq_id]
        return tuple(self.array[row, :self.lengths[row]].tolist())

    def apply(self, batch) -> np.ndarray:
        """Drop ``batch.finished_seq_ids``, apply each sequence's delta, and return the row of
        each of ``batch.sequences`` (int64, batch order). Raises RuntimeError for a delta to a
        sequence never seen, ValueError for a block id out of range; the tables are then
        unchanged up to the failing sequence."""
        rows_of = self._row
        for seq_id in batch.finished_seq_ids:
            row = rows_of.pop(seq_id, None)
            if row is not None:
                self._free.append(row)
        seqs = batch.sequences
        rows = np.empty(len(seqs), dtype=np.int64)
        for i, s in enumerate(seqs):
            row = rows_of.get(s.seq_id)
            ids = s.block_ids
            if s.full:
                if row is None:
                    row = self._take_row(s.seq_id)
                self._write(row, 0, ids, s.seq_id)
            elif row is None:
                raise stale_delta(s)
            else:
                if ids:
                    self._write(row, int(self.lengths[row]), ids, s.seq_id)
                for index, block in s.replaced_blocks:
                    if not 0 <= index < self.lengths[row]:
                        raise RuntimeError(f"batch: sequence {s.seq_id} replaces entry {index} "
                                           f"of a {int(self.lengths[row])}-entry block table")
                    self._check_ids((block,), s.seq_id)
                    self.array[row, index] = block
                    self.ids_applied += 1
            rows[i] = row
        return rows

    def _check_ids(self, ids, seq_id: int) -> None:
        n = self.num_blocks
        if n is not None and (min(ids) < 0 or max(ids) >= n):
            raise ValueError(f"batch: sequence {seq_id}: block ids must lie in [0, {n}), got "
                             f"{min(ids)}..{max(ids)}")

    def _write(self, row: int, start: int, ids, seq_id: int) -> None:
        end = start + len(ids)
        if ids:
            self._check_ids(ids, seq_id)
            if end > self.array.shape[1]:
                grown = np.zeros((self.array.shape[0], max(end, 2 * self.array.shape[1])),
                                 dtype=np.int32)
                grown[:, :self.array.shape[1]] = self.array
                self.array = grown
            self.array[row, start:end] = ids
            self.ids_applied += len(ids)
        self.lengths[row] = end

    def _take_row(self, seq_id: int) -> int:
        if not self._free:
            n = self.array.shape[0]
            self.array = np.concatenate([self.array, np.zeros_like(self.array)])
            self.lengths = np.concatenate([self.lengths, np.zeros_like(self.lengths)])
            self._free = list(range(2 * n - 1, n - 1, -1))
        row = self._free.pop()
        self._row[seq_id] = row
        return row
