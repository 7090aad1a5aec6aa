"""Run a recipe on a Ray cluster with Ray Train (``ray.train.torch.TorchTrainer``), unchanged: each Ray Train
worker runs the recipe's ``main`` with the given arguments; Ray Train sets torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR / PORT) and joins the process group (gloo on CPU, NCCL on GPUs), which
``ttcore.parallel`` reads, so the run is the one ``torchrun`` would make: same global batches, process 0 writes.

    python training/ray_train.py --workers 4 [--gpu] -- training/pretrain.py --config qm9 --out /shared/qm9-base

``--address`` joins a running cluster (default: a local one); ``--out`` must be storage every worker can
reach (a shared filesystem on several nodes). ``--max-failures`` lets Ray Train restart a failed worker group: the
recipe then runs again (from its last train state when its arguments say ``--resume``; from scratch otherwise, to
the same weights, since every batch and mask comes from seeded streams).
"""

import argparse
import runpy
import sys
import tempfile
from pathlib import Path


def run_recipe(config: dict) -> None:
    """The body of each Ray Train worker: the recipe as ``python RECIPE ARGS...`` would run it."""
    recipe = Path(config["recipe"]).resolve()
    sys.path.insert(0, str(recipe.parent))  # the recipes import their siblings (_common, _loop) by name
    sys.argv = [str(recipe), *config["args"]]
    runpy.run_path(str(recipe), run_name="__main__")


def trainer_class():
    """``TorchTrainer`` for a local cluster, without Ray Train 2.60's ``PlacementGroupCleanerCallback``.

    That callback starts a detached actor that polls the state API for the controller every second and removes
    the run's placement group when ``is_actor_alive`` is false (``ray/train/v2/_internal/state/util.py``); on two
    loaded cores the state API has answered "not found" for a live controller, the group was removed and both
    workers died mid-run ("A worker health check failed"). The cleaner guards a long-lived cluster against a
    controller that dies ungracefully; the local cluster this script starts dies with it, so there is nothing
    to guard. On ``--address`` clusters Ray's default trainer (with the cleaner) runs.
    """
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    class LocalTorchTrainer(TorchTrainer):
        def _create_default_callbacks(self):
            return [c for c in super()._create_default_callbacks()
                    if not isinstance(c, PlacementGroupCleanerCallback)]

    return LocalTorchTrainer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="training processes (Ray Train workers)")
    ap.add_argument("--gpu", action="store_true", help="one GPU per worker (NCCL)")
    ap.add_argument("--cpus-per-worker", type=float, default=1)
    ap.add_argument("--address", help="a running Ray cluster (default: start a local one)")
    ap.add_argument("--max-failures", type=int, default=1, help="worker-group restarts Ray Train may make")
    ap.add_argument("recipe", help="training/pretrain.py or training/finetune.py")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the recipe's own arguments")
    args = ap.parse_args()
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=args.address, include_dashboard=False)
    trainer = (TorchTrainer if args.address else trainer_class())(
        run_recipe, train_loop_config={"recipe": args.recipe, "args": args.args[args.args[:1] == ["--"]:]},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=args.gpu,
                                     resources_per_worker={"CPU": args.cpus_per_worker}),
        run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="ttcore-ray-train-"), name="recipe",
                             failure_config=FailureConfig(max_failures=args.max_failures)))
    result = trainer.fit()
    if result.error is not None:
        raise SystemExit(f"the recipe failed on a Ray Train worker: {result.error}")
    print(f"ran {args.recipe} on {args.workers} Ray Train workers")


if __name__ == "__main__":
    main()
