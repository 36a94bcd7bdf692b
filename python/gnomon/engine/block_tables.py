"""`BlockTables`: the runner's side of the block-table deltas (`ScheduledSequence`).

Each sequence a runner has seen owns one row of a persistent int32 array ``[groups, rows,
columns]``: one table per KV-cache group, all of one length. A batch's deltas are applied in
place (the full tables on a sequence's first appearance, then only appended ids and entries
replaced in place), so the per-step cost grows with what changed, never with the length of the
tables. Rows of finished sequences are reused. The real runner gathers a step's rows from this
array.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np


def stale_delta(s) -> RuntimeError:
    """The error for a delta (``full`` False) to a sequence the runner never saw in full."""
    return RuntimeError(f"batch: sequence {s.seq_id} (request {s.request_id!r}) carries a "
                        f"block-table delta, but this runner never saw it in full; the "
                        f"scheduler and the runner are out of step")


def _misshaped(s, groups: int) -> RuntimeError:
    return RuntimeError(f"batch: sequence {s.seq_id} carries block ids for "
                        f"{[len(g) for g in s.block_ids]} entries in {len(s.block_ids)} groups; "
                        f"expected the same count in each of {groups}")


class BlockTables:
    """Block tables rebuilt from `ScheduledBatch` deltas (module docstring). `windows` has one
    entry per KV-cache group (None for full attention); a sliding group's entries may be -1,
    the null block. `num_blocks`, when given, bounds every other block id applied."""

    def __init__(self, num_blocks: Optional[int] = None, *,
                 windows: Sequence[Optional[int]] = (None,), rows: int = 16,
                 columns: int = 16) -> None:
        self.num_blocks = num_blocks
        self.windows = tuple(windows)
        self.array = np.zeros((len(self.windows), rows, columns), dtype=np.int32)
        self.lengths = np.zeros(rows, dtype=np.int64)
        self._lowest = [0 if w is None else -1 for w in self.windows]
        self._row: Dict[int, int] = {}
        self._free: List[int] = list(range(rows - 1, -1, -1))
        self.ids_applied = 0  # block ids taken from batches so far: what the deltas cost

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._row

    def __len__(self) -> int:
        return len(self._row)

    def table(self, seq_id: int, group: int = 0) -> Tuple[int, ...]:
        row = self._row[seq_id]
        return tuple(self.array[group, row, :self.lengths[row]].tolist())

    def apply(self, batch) -> np.ndarray:
        """Drop ``batch.finished_seq_ids``, apply each sequence's delta, and return the row of
        each of ``batch.sequences`` (int64, batch order). Raises RuntimeError for a delta to a
        sequence never seen or out of shape, ValueError for a block id out of range; the tables
        are then unchanged up to the failing sequence."""
        rows_of = self._row
        for seq_id in batch.finished_seq_ids:
            row = rows_of.pop(seq_id, None)
            if row is not None:
                self._free.append(row)
        seqs = batch.sequences
        rows = np.empty(len(seqs), dtype=np.int64)
        groups = len(self.windows)
        for i, s in enumerate(seqs):
            row = rows_of.get(s.seq_id)
            ids = s.block_ids
            if len(ids) != groups:
                raise _misshaped(s, groups)
            if s.full:
                if row is None:
                    row = self._take_row(s.seq_id)
                self._write(row, 0, ids, s)
            elif row is None:
                raise stale_delta(s)
            else:
                if any(ids):
                    self._write(row, int(self.lengths[row]), ids, s)
                for g, pairs in enumerate(s.replaced_blocks):
                    for index, block in pairs:
                        if not 0 <= index < self.lengths[row]:
                            raise RuntimeError(
                                f"batch: sequence {s.seq_id} replaces entry {index} of a "
                                f"{int(self.lengths[row])}-entry block table")
                        self._check_ids(g, (block,), s.seq_id)
                        self.array[g, row, index] = block
                        self.ids_applied += 1
            rows[i] = row
        return rows

    def _check_ids(self, group: int, ids, seq_id: int) -> None:
        n, lowest = self.num_blocks, self._lowest[group]
        if min(ids) < lowest or (n is not None and max(ids) >= n):
            raise ValueError(f"batch: sequence {seq_id}: group {group}'s block ids must lie in "
                             f"[{lowest}, {n}), got {min(ids)}..{max(ids)}")

    def _write(self, row: int, start: int, ids, s) -> None:
        count = len(ids[0])
        if any(len(group_ids) != count for group_ids in ids):
            raise _misshaped(s, len(self.windows))
        end = start + count
        if count:
            for g, group_ids in enumerate(ids):
                self._check_ids(g, group_ids, s.seq_id)
            if end > self.array.shape[2]:
                groups, rows, columns = self.array.shape
                grown = np.zeros((groups, rows, max(end, 2 * columns)), dtype=np.int32)
                grown[:, :, :columns] = self.array
                self.array = grown
            self.array[:, row, start:end] = ids
            self.ids_applied += count * len(ids)
        self.lengths[row] = end

    def _take_row(self, seq_id: int) -> int:
        if not self._free:
            n = self.array.shape[1]
            self.array = np.concatenate([self.array, np.zeros_like(self.array)], axis=1)
            self.lengths = np.concatenate([self.lengths, np.zeros_like(self.lengths)])
            self._free = list(range(2 * n - 1, n - 1, -1))
        row = self._free.pop()
        self._row[seq_id] = row
        return row
