"""Full-sequence masked diffusion (MDLM, and its latent variants VADD and Di4C): every position attends to every
other, a step unmasks any positions, and the joint head scores the masked positions given the rest exactly."""

import torch

from .base import ModelKind


class Diffusion(ModelKind):
    name = "diffusion"
    description = "a masked diffusion model"
    takes_companion = True

    def matches(self, cfg) -> bool:
        return True  # the kind every model is unless a later-registered kind claims it

    def base(self, cfg) -> str:
        """``mdlm``, or a latent model: VADD's z per sequence (``vadd``) or a Di4C mixture with z per step
        (``di4c``; ``ModelConfig.latent_draw``)."""
        if not cfg.dit.latent_dim:
            return "mdlm"
        return "di4c" if cfg.latent_draw == "step" else "vadd"

    def score(self, model, x0: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The joint head's exact log p(x_M | x_t), x_t = x0 with ``mask`` masked, at the masked fraction's time."""
        x_t = torch.where(mask, torch.full_like(x0, model.cfg.dit.mask_id), x0)
        t = mask.float().mean(1)  # the masked fraction: the diffusion time of x_t under the log-linear schedule
        out = model(x_t, mask, sigma=t)
        token = torch.full(x0.shape, float("nan"), dtype=torch.float64, device=x0.device)
        token[mask] = out.marginal_log_probs(x0).double()
        return out.log_prob(x0).double(), token


DIFFUSION = Diffusion()
