"""A tiny real JointModel with random (perturbed) weights, for sampler tests that run the real heads."""

import torch

from ttcore.models import DiTConfig, JointModel, ModelConfig


def tiny_model(decomposition: str, v: int, l: int, rank: int, perturb: float, noise: float,
               head: str = "1layer") -> JointModel:
    """Seed 0; a rank-1 base with every parameter perturbed by ``perturb`` * N(0, 1), then (unless
    ``decomposition`` is none) its joint fine-tuning start with a ``head`` of noise ``noise``; eval mode."""
    torch.manual_seed(0)
    base = JointModel(ModelConfig(DiTConfig(vocab_size=v + 1, out_vocab=v, length=l, hidden_dim=16, cond_dim=8,
                                            n_blocks=1, n_heads=2)))
    with torch.no_grad():
        for prm in base.parameters():
            prm.add_(perturb * torch.randn_like(prm))
    if decomposition == "none":
        return base.eval()
    return JointModel.from_base(base, decomposition, rank, head, noise=noise).eval()


def tiny_ar(v: int, l: int, perturb: float = 0.5) -> JointModel:
    """A tiny autoregressive model (``DiTConfig.causal``) with every weight perturbed by ``perturb`` * N(0, 1)
    (seed 0), eval mode."""
    torch.manual_seed(0)
    model = JointModel(ModelConfig(DiTConfig(vocab_size=v + 1, out_vocab=v, length=l, hidden_dim=16, cond_dim=8,
                                             n_blocks=2, n_heads=2, causal=True)))
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(perturb * torch.randn_like(prm))
    return model.eval()


def run_together(model, runs: list) -> list:
    """Step ``runs`` together (``ttcore.sampling.batch_step``, the service's batched step) until all are done;
    runs leave as they finish. -> each run's final state."""
    from ttcore.sampling import batch_step

    final = {}
    while live := [run for run in runs if not run.done]:
        for run, state in zip(live, batch_step(model, live).states):
            final[id(run)] = state
    return [final[id(run)] for run in runs]


def tiny_block_model(decomposition: str = "tt", rank: int = 2, v: int = 3, length: int = 4, block: int = 2,
                     seed: int = 0, head_scale: float = 1.0, shifted: bool = False) -> JointModel:
    """A tiny block diffusion model (``DiTConfig.block_size``) of ``decomposition`` and ``rank`` with every weight
    perturbed by 0.1 * N(0, 1) (away from the initialization's symmetric joint), the head's then times
    ``head_scale`` (> 1: sharper joints), eval mode. ``shifted``: inputs shifted right (``DiTConfig.causal``, the
    layout of a block model started from an autoregressive one)."""
    torch.manual_seed(seed)
    dit = DiTConfig(vocab_size=v + 1, out_vocab=v, length=length, hidden_dim=32, cond_dim=16, n_blocks=2, n_heads=2,
                    block_size=block, causal=shifted)
    model = JointModel(ModelConfig(dit, decomposition, rank, "1layer"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        for p in model.head.parameters():
            p.mul_(head_scale)
    return model.eval()
