"""The engine's own runner: `RunnerBuilder`, what every rank needs to build its shard of the
`ModelRunner`, and `start_runner`, which runner an engine gets: one rank's `ModelRunner`, rank
0's `DistributedRunner` over spawned workers, or (a torchrun rank other than 0) none, after
serving rank 0's step loop. The processes are `gnomon.engine.distributed`'s."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from gnomon.engine import distributed
from gnomon.engine.engine_config import EngineConfig
from gnomon.engine.parallel import Shard


@dataclass(frozen=True)
class RunnerBuilder:
    """What every rank needs to build its shard of the engine's runner (picklable: spawned
    workers get it): the model, where its weights come from, and the engine's settings with
    every default resolved (`EngineConfig`: dtype, ``max_model_len``, KV blocks, device, tp).
    `module` is the architecture's module path, which a worker registers again, so an
    architecture registered from a user's module works there too."""

    config: object
    folder: Optional[str]
    random_weights: bool
    engine: EngineConfig
    kv_groups: object
    module: str

    @property
    def device(self) -> str:
        return self.engine.device

    def __call__(self, shard: Shard, comm: Optional[distributed.Collectives], sample=None):
        import torch

        from gnomon.engine import models
        from gnomon.engine.config import torch_dtype
        from gnomon.engine.runner import ModelRunner
        from gnomon.engine.random_weights import random_weights
        from gnomon.engine.weight_shards import shard_weights
        from gnomon.engine.weights import load_weights

        if self.config.architecture not in models.architectures():
            models.register(self.config.architecture, self.module)
        dtype = torch_dtype(self.engine.dtype, "dtype")
        if self.random_weights:
            weights = shard_weights(random_weights(self.config, dtype), self.config, shard)
        else:
            weights = load_weights(self.folder, self.config, dtype=dtype, shard=shard)
        device = torch.device(self.device)
        if device.type == "cuda" and shard.size > 1:
            device = torch.device("cuda", distributed.local_device_index(shard.rank))
        # a group of one (torchrun with one process) runs as one rank, without collectives
        comm = comm if shard.size > 1 else None
        runner = ModelRunner(self.config, weights, num_kv_blocks=self.engine.num_kv_blocks,
                             block_size=self.engine.block_size, device=device, dtype=dtype,
                             sample=sample, max_position=self.engine.max_model_len,
                             kv_groups=self.kv_groups, shard=shard, comm=comm)
        if comm is not None:  # every rank built: a failed build surfaces here, by rank
            comm.all_reduce(torch.zeros(1, device=device))
        return runner

    def serve(self, shard: Shard, comm: distributed.Collectives) -> None:
        """A rank other than 0: builds its shard, then serves the step loop."""
        distributed.serve(self(shard, comm), comm)


def start_runner(build: RunnerBuilder, sample=None):
    """The runner `build` gives this process: one rank's when there is one rank and no torchrun,
    rank 0's `DistributedRunner` (spawning the other ranks unless torchrun started them), or
    None on a torchrun rank other than 0, which serves rank 0's step loop before returning."""
    tensor_parallel_size = build.engine.tensor_parallel_size
    torchrun = distributed.launched_by_torchrun()
    if not torchrun and tensor_parallel_size == 1:
        return build(Shard(), None, sample)
    if torchrun and int(os.environ["RANK"]) != 0:
        distributed.serve_torchrun_rank(build.serve, build.device, tensor_parallel_size)
        return None
    group = distributed.WorkerGroup(tensor_parallel_size, build.device, build.serve)
    return distributed.DistributedRunner(group, build, sample)
