"""Tensor parallelism over `torch.distributed`: the process layout of a tensor-parallel engine,
its process group and its collectives. What each rank holds is `gnomon.engine.parallel`'s (no
torch); how a rank builds its runner and which runner an engine gets, `gnomon.engine.launch`'s.

Processes
  Rank 0 holds the one scheduler and the one `BlockAllocator`, and drives the engine; every rank
  uses its block tables, and each rank's KV cache holds its KV heads of every KV-cache group.
  Ranks 1..N-1 are workers started with torch.multiprocessing (spawn): each builds its shard of
  the model, then serves the step loop. Rank 0 sends each `ScheduledBatch` to them once per step
  with ``broadcast_object_list`` (one pickled object: the batch carries only deltas, so it is
  small; see ``bench/test_tp.py`` for its cost), and only rank 0 samples. Under ``torchrun``
  (``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` set) every process joins the existing group
  instead: rank 0 runs the engine and the others serve.

Backends: gloo on the CPU, nccl on CUDA and ROCm (RCCL answers to that name);
``GNOMON_DIST_BACKEND`` overrides. Every collective is torch.distributed's, with the timeout
``GNOMON_DIST_TIMEOUT_S`` (default 300 s) so that a lost rank fails a step instead of hanging it.
A worker that raises sends its traceback to rank 0, which raises a RuntimeError naming the rank;
rank 0 also watches the workers' processes, so a dead one is noticed before the next step.
While the group forms, rank 0 hosts its TCPStore (at a port the OS picks) and waits for every
worker to reach it, watching the processes: a worker that dies on the way (one that imports the
main module of a script without its ``__main__`` guard, say) fails the start within a fraction
of a second, with its error, instead of holding rank 0 in the rendezvous for the whole timeout.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from datetime import timedelta
from typing import Callable, Optional

from gnomon.engine import parallel

DEFAULT_TIMEOUT_S = 300.0


# ---- the process group -----------------------------------------------------------------------

def backend_for(device) -> str:
    """gloo for the CPU, nccl for a GPU (RCCL on ROCm), unless ``GNOMON_DIST_BACKEND`` says."""
    chosen = os.environ.get("GNOMON_DIST_BACKEND")
    if chosen:
        return chosen
    return "gloo" if str(device).startswith("cpu") else "nccl"


def timeout() -> timedelta:
    text = os.environ.get("GNOMON_DIST_TIMEOUT_S", str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"GNOMON_DIST_TIMEOUT_S: expected a positive number of seconds, got "
                         f"{text!r}")
    return timedelta(seconds=seconds)


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def threads_per_rank(size: int) -> int:
    """The CPU threads each of `size` ranks on this machine takes: its share of the cores."""
    return max(1, (os.cpu_count() or 1) // size)


class Collectives:
    """The collectives a sharded forward makes, over the default process group (the runner
    charges their time to the ``communication`` family). On rank 0 a collective that fails
    raises what `on_error` makes of the error: a RuntimeError naming the lost rank."""

    def __init__(self, shard: parallel.Shard, on_error=None):
        import torch.distributed as dist

        self.shard, self._dist, self.on_error = shard, dist, on_error

    def _guard(self, call):
        try:
            return call()
        except RuntimeError as error:  # gloo and nccl raise RuntimeError subclasses
            if self.on_error is None:
                raise
            raise self.on_error(error) from error

    def all_reduce(self, t):
        self._guard(lambda: self._dist.all_reduce(t))
        return t

    def all_gather_last(self, t):
        """Each rank's `t` side by side along the last dimension, in rank order."""
        import torch

        parts = [torch.empty_like(t) for _ in range(self.shard.size)]
        self._guard(lambda: self._dist.all_gather(parts, t.contiguous()))
        return torch.cat(parts, dim=-1)

    def broadcast_object(self, obj):
        box = [obj]
        self._guard(lambda: self._dist.broadcast_object_list(box, src=0))
        return box[0]


def host_store(size: int):
    """Rank 0's TCPStore for a group of `size` ranks, on 127.0.0.1 at a port the OS picks
    (``.port``); it does not wait for the others to connect."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=timeout(),
                         wait_for_workers=False)


def joined_key(rank: int) -> str:
    """The store key a spawned worker sets once it runs gnomon's code and reached the store."""
    return f"gnomon/joined/{rank}"


def init_group(rank: int, size: int, device, store=None) -> None:
    """Joins the group of `size` ranks through `store` (a spawned group's TCPStore, which rank
    0 hosts), or through torchrun's environment when `store` is None."""
    import torch
    import torch.distributed as dist

    if str(device).startswith("cuda"):  # nccl's object collectives use the current device
        torch.cuda.set_device(local_device_index(rank))
    global _excepthook_outside_group
    _excepthook_outside_group = sys.excepthook
    dist.init_process_group(backend_for(device), rank=rank, world_size=size,
                            timeout=timeout(), **({} if store is None else {"store": store}))


# init_process_group wraps sys.excepthook to prefix "[rank0]: " to each line, and
# destroy_process_group leaves the wrapper: a process that ran several engines printed a
# traceback with the prefix once per engine.
_excepthook_outside_group = None


def leave_group() -> None:
    """Destroys the process group and puts back the excepthook that was there before it."""
    import torch.distributed as dist

    global _excepthook_outside_group
    dist.destroy_process_group()
    if _excepthook_outside_group is not None:
        sys.excepthook, _excepthook_outside_group = _excepthook_outside_group, None


def local_device_index(rank: int) -> int:
    """The GPU a rank uses: torchrun's LOCAL_RANK where set (multi-node), else the rank."""
    return int(os.environ.get("LOCAL_RANK", rank))


def serve(runner, comm: Collectives) -> None:
    """A worker rank's step loop: each batch rank 0 broadcasts, run (its logits are gathered
    for rank 0 inside); None ends it."""
    while True:
        batch = comm.broadcast_object(None)
        if batch is None:
            return
        runner.execute_logits(batch)


def worker_main(rank: int, size: int, port: int, device: str, serve_rank, errors) -> None:
    """A spawned worker: joins the group, then does its part with ``serve_rank(shard, comm)``
    (the engine's: build the shard and serve the step loop). An exception is sent to rank 0
    through `errors` (rank, traceback) before the process exits with status 1."""
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads_per_rank(size))
        shard = parallel.Shard(rank, size)
        store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=timeout())
        store.set(joined_key(rank), "1")
        init_group(rank, size, device, store)
        serve_rank(shard, Collectives(shard))
    except BaseException:  # noqa: BLE001 - everything reaches rank 0, then the process ends
        errors.put((rank, traceback.format_exc()))
        raise SystemExit(1)
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                leave_group()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


# ---- rank 0 ----------------------------------------------------------------------------------

def _outside_worker_hint() -> str:
    """Why a worker exits with status 1 and no traceback: it raised before `worker_main` (whose
    errors all reach rank 0), that is while the spawned process imported the main module."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    where = f"the main module {path}" if path else "the main module"
    return (f": it failed before reaching gnomon's worker, while the spawned process imported "
            f"{where} (its traceback is on stderr). A script that builds a tensor-parallel "
            f"engine at module level needs `if __name__ == \"__main__\":` around that code: "
            f"each worker re-imports the script, and would build an engine of its own")


class WorkerGroup:
    """Rank 0's side of a group of `size` ranks on `device`: the spawned workers, each running
    ``serve_rank(shard, comm)`` (none under torchrun, whose ranks are already running), the
    errors they report, and the collectives over them. Closing broadcasts None, which ends
    every rank's loop."""

    def __init__(self, size: int, device: str, serve_rank) -> None:
        self.size, self.processes = size, []
        if launched_by_torchrun():
            init_group(int(os.environ["RANK"]), size, device, None)
        else:
            self._spawn(size, device, serve_rank)
        self.comm = Collectives(parallel.Shard(0, size), on_error=self.failure)

    def _spawn(self, size: int, device: str, serve_rank) -> None:
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")
        self.errors = context.Queue()
        store = host_store(size)
        self.processes = [context.Process(target=worker_main, daemon=True,
                                          args=(rank, size, store.port, device, serve_rank,
                                                self.errors))
                          for rank in range(1, size)]
        for p in self.processes:
            p.start()
        self._await_workers(store)
        init_group(0, size, device, store)

    def _await_workers(self, store) -> None:
        """Waits until every worker has reached the store, watching their processes: one
        that dies first (an import error, the main module re-imported without its
        ``__main__`` guard, out of memory) fails the start at once with its own error, rather
        than after the group's whole timeout."""
        keys = [joined_key(rank) for rank in range(1, self.size)]
        limit = timeout().total_seconds()
        deadline = time.monotonic() + limit
        while not store.check(keys):
            if any(not p.is_alive() for p in self.processes):
                error = self.failure()
                self._stop_processes()
                raise error
            if time.monotonic() > deadline:
                self._stop_processes()
                raise RuntimeError(f"the process group of {self.size} ranks did not form: its "
                                   f"workers did not start within {limit:g} s "
                                   f"(GNOMON_DIST_TIMEOUT_S)")
            time.sleep(0.02)

    def failure(self, error: Optional[BaseException] = None) -> RuntimeError:
        """The RuntimeError for a lost rank: its own traceback when it sent one, else how its
        process ended."""
        import queue

        deadline = 5.0 if error is not None else 0.5
        errors = getattr(self, "errors", None)
        if errors is not None:
            try:
                rank, text = errors.get(timeout=deadline)
                return RuntimeError(f"tensor parallel rank {rank} failed:\n{text}")
            except queue.Empty:
                pass
        for rank, p in enumerate(self.processes, start=1):
            if not p.is_alive():
                return RuntimeError(f"tensor parallel rank {rank} exited with status "
                                    f"{p.exitcode} and sent no error"
                                    + (_outside_worker_hint() if p.exitcode == 1 else ""))
        return RuntimeError(f"tensor parallel collective failed: {error}")

    def check_alive(self) -> None:
        if any(not p.is_alive() for p in self.processes):
            raise self.failure()

    def broadcast(self, batch) -> None:
        self.check_alive()
        self.comm.broadcast_object(batch)

    def _stop_processes(self) -> None:
        for p in self.processes:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        self.processes = []

    def close(self) -> None:
        """Ends the workers' step loop, waits for them, and leaves the process group."""
        import torch.distributed as dist

        if dist.is_initialized():
            try:
                if all(p.is_alive() for p in self.processes):
                    self.comm.broadcast_object(None)
            except RuntimeError:
                pass  # a lost rank: the processes are stopped below either way
            leave_group()
        self._stop_processes()


class DistributedRunner:
    """Rank 0's runner under tensor parallelism: sends each batch to the other ranks of
    `group`, then runs its own shard, ``build(shard, comm, sample)`` (it samples). Its
    ``communication`` family includes the broadcast."""

    def __init__(self, group: WorkerGroup, build: Callable, sample=None) -> None:
        self.group = group
        try:
            self.runner = build(parallel.Shard(0, group.size), group.comm, sample)
        except BaseException:
            group.close()
            raise
        self.send_seconds = []  # each step's broadcast, for the benchmark

    def _send(self, batch) -> float:
        start = time.perf_counter()
        self.group.broadcast(batch)
        seconds = time.perf_counter() - start
        self.send_seconds.append(seconds)
        return seconds

    def execute(self, batch):
        from .batch import StepOutput

        sent = self._send(batch)
        out = self.runner.execute(batch)
        breakdown = dict(out.breakdown)
        breakdown["communication"] = breakdown.get("communication", 0.0) + sent
        return StepOutput(out.sampled_token_ids, out.seconds + sent, breakdown, out.logprobs,
                          out.logits)

    def execute_logits(self, batch):
        sent = self._send(batch)
        logits, breakdown = self.runner.execute_logits(batch)
        breakdown["communication"] = breakdown.get("communication", 0.0) + sent
        return logits, breakdown

    def close(self) -> None:
        self.group.close()

    def __getattr__(self, name):  # the shard's state (tables, kv_caches, weights) for callers
        return getattr(self.runner, name)


def serve_torchrun_rank(serve_rank, device: str, size: int) -> None:
    """A torchrun rank other than 0: joins the group, runs ``serve_rank(shard, comm)`` until
    rank 0 closes, and leaves the group."""
    rank = int(os.environ["RANK"])
    init_group(rank, size, device, None)
    try:
        shard = parallel.Shard(rank, size)
        serve_rank(shard, Collectives(shard))
    finally:
        leave_group()
