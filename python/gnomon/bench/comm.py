"""The process group the ``comm`` suite's collectives run over, and the lockstep that keeps its
ranks on the same case and the same sample.

Rank 0 is the bench process: it samples a comm case as it samples any other (the adaptive rule
of `timing.sample`), while ranks 1..world-1, spawned through the engine's `WorkerGroup`, build
the same cases and follow. Before a case rank 0 broadcasts its index; before each sample it
all-reduces a one-element control tensor (1: one more call, 0: the case is done), outside the
timed region. An all-reduce rather than a broadcast, so every rank leaves it at about the same
moment and the timed collective measures the transfer, not one rank waiting for another.
Closing broadcasts None, which ends the workers, as it ends the engine's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence, Tuple

from gnomon.bench.cases import Case


def _control(device: str):
    import torch

    return torch.zeros(1, dtype=torch.int64, device=device)


def _exchange(comm, control, value: int) -> bool:
    """The lockstep signal: rank 0's `value` reaches every rank; True for one more call."""
    control.fill_(value)
    comm.all_reduce(control)
    return bool(control.item())


@dataclass(frozen=True)
class CommWorker:
    """What a rank other than 0 runs (picklable: spawned workers get it): builds every case,
    then calls the one rank 0 names, once per signal, until rank 0 closes."""

    cases: Tuple[Case, ...]
    device: str

    def __call__(self, shard, comm) -> None:
        built = [case.build(self.device, seed=shard.rank) for case in self.cases]
        control = _control(self.device)
        while True:
            index = comm.broadcast_object(None)
            if index is None:
                return
            fn, args = built[index]
            while _exchange(comm, control, 0):
                fn(*args)


class CommGroup:
    """Rank 0's side: the group of `world` ranks on `device` that `cases` run over."""

    def __init__(self, cases: Sequence[Case], device: str) -> None:
        from gnomon.engine.distributed import WorkerGroup, launched_by_torchrun

        worlds = sorted({case.p["world"] for case in cases})
        if len(worlds) != 1:
            raise ValueError(f"comm cases: expected one world size, got {worlds}")
        world = worlds[0]
        if launched_by_torchrun():
            raise ValueError("--suite comm starts its own process group; run gnomon bench "
                             "outside torchrun")
        if device != "cpu":
            import torch

            if torch.cuda.device_count() < world:
                raise ValueError(f"--suite comm: its collectives run over {world} GPUs and "
                                 f"this machine has {torch.cuda.device_count()}; run it with "
                                 f"--device cpu (gloo), or on a machine with {world}")
        self.cases = tuple(cases)
        self._index = {case.key: i for i, case in enumerate(self.cases)}
        self.group = WorkerGroup(world, device, CommWorker(self.cases, device))
        self._control = _control(device)

    @contextlib.contextmanager
    def session(self, case: Case) -> Iterator[None]:
        """The workers run `case` with rank 0 until the block ends."""
        self.group.check_alive()
        self.group.comm.broadcast_object(self._index[case.key])
        try:
            yield
        finally:
            _exchange(self.group.comm, self._control, 0)

    def before_sample(self) -> None:
        """Every rank is about to make one call of the current case."""
        _exchange(self.group.comm, self._control, 1)

    def close(self) -> None:
        self.group.close()
