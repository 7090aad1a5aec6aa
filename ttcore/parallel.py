"""Data-parallel training across processes (``torchrun``), one model replica per process.

    torchrun --nproc_per_node 4 training/pretrain.py --config qm9 --out runs/qm9-base --resume
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 training/finetune.py ...

Every process reads the same global batch order (``BatchOrder``, the run's seed) and trains on its share of
each batch (rows ``rank::world``), so the global batch size and the data order are those of a one-process run
with the same config. Each process's loss is its part of the global batch's objective, normalized by the
global masked-token count (``mdlm_loss(..., processes=workers)``), and gradients are averaged across processes
after each backward pass (one flattened all-reduce), so every process holds the gradient a single process
computes on the global batch and the replicas stay identical. Process 0 validates, logs and writes checkpoints
(with every process's mask-stream state, gathered); the others wait for it at the next collective. Decisions
that depend on a clock or a signal (time budget, checkpoint due, SIGTERM) are agreed by all processes each
step, so they stop and checkpoint on the same step. Backend: NCCL on CUDA, gloo on CPU. Without torchrun's
environment (``WORLD_SIZE`` unset or 1) nothing here communicates.
"""

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Workers:
    """This process's place among the training processes."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls, device: torch.device) -> "Workers":
        """torchrun's RANK / WORLD_SIZE / LOCAL_RANK; joins the process group when there are several. On CUDA
        each process takes the GPU of its local rank."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":
            torch.cuda.set_device(local_rank)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return cls(rank, world, local_rank)

    @property
    def main(self) -> bool:
        """Process 0: the one that validates, logs and writes."""
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """This process's device: on CUDA the GPU of its local rank."""
        return torch.device("cuda", self.local_rank) if device.type == "cuda" and self.world > 1 else device

    def share(self, batch: torch.Tensor) -> torch.Tensor:
        """This process's rows of a global batch (of indices or tokens)."""
        return batch[self.rank::self.world]

    def check_batch(self, batch_size: int) -> None:
        if batch_size % self.world:
            raise ValueError(f"batch_size {batch_size} must be divisible by the {self.world} training processes "
                             "(each trains on an equal share of every global batch)")

    def all_sum(self, value: torch.Tensor) -> torch.Tensor:
        """The sum of ``value`` over the processes (no gradient flows through it: a count or a normalizer)."""
        if self.world == 1:
            return value
        total = value.detach().clone()
        dist.all_reduce(total)
        return total

    def average_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Replace each gradient by its average over the processes (one all-reduce of all of them). A parameter
        that no process gave a gradient keeps none, as in a single process (so AdamW skips it, neither
        decaying it nor moving its moments); one that only some processes reached counts as zeros on the
        others (its true contribution there)."""
        if self.world == 1:
            return
        reached = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=params[0].device)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([reached] + [g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        reached, flat = flat[:len(params)] > 0, flat[len(params):] / self.world
        offset = 0
        for p, g, any_grad in zip(params, grads, reached.tolist()):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(p).to(p.dtype) if any_grad else None
            offset += n

    def gather_states(self, state: torch.Tensor) -> list[torch.Tensor]:
        """Every process's ``state`` (a generator's byte state, say), in rank order, on every process."""
        if self.world == 1:
            return [state]
        everyone = [None] * self.world
        dist.all_gather_object(everyone, state.cpu())
        return everyone

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every process when it is true on any (a stop decision all of them take on the same step)."""
        return self.any_of([flag], device)[0]

    def any_of(self, flags: list[bool], device: torch.device) -> list[bool]:
        """``any`` for several decisions in one all-reduce."""
        if self.world == 1:
            return list(flags)
        t = torch.tensor([int(f) for f in flags], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [bool(v) for v in t.tolist()]

    def broadcast_parameters(self, model: torch.nn.Module) -> None:
        """Process 0's weights everywhere (the replicas start identical whatever each process loaded)."""
        if self.world == 1:
            return
        with torch.no_grad():
            for p in model.state_dict().values():
                dist.broadcast(p, 0)

    def check_replicas(self, model: torch.nn.Module) -> None:
        """Raise unless every process holds the same weights (a float64 sum of each tensor, compared across
        processes): what averaging the gradients promises."""
        if self.world == 1:
            return
        sums = torch.stack([p.detach().double().sum() for p in model.state_dict().values()])
        sums = sums.to(next(model.parameters()).device)
        everyone = [torch.empty_like(sums) for _ in range(self.world)]
        dist.all_gather(everyone, sums)
        if not all(torch.equal(everyone[0], s) for s in everyone[1:]):
            raise RuntimeError("the training processes' weights diverged: their gradients were not averaged alike")

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def is_main_process() -> bool:
    """Whether this process is torchrun's rank 0 (or the only process): the one recipes print from."""
    return int(os.environ.get("RANK", "0")) == 0
