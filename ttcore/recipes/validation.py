"""Where and how a recipe computes: the device, bf16 autocast, and the validation metrics (``evaluate_loss``)."""

import torch

from ttcore.losses import mdlm_loss, vadd_loss
from ttcore.models.vadd import prior_sample


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast(device: torch.device, precision: str):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


@torch.no_grad()
def evaluate_loss(model, tokens: torch.Tensor, mask_id: int, *, batch_size: int, batches: int, precision: str,
                  eps: float, device, kl_weight: float = 1.0) -> dict:
    """Validation metrics with a fixed RNG (comparable across runs), each the mean over
    ``min(batches, len(tokens) // batch_size)`` batches of what ``mdlm_loss`` returns per batch:
    ``nll`` (joint NLL per masked token, the training objective), ``marginal_nll`` (per masked token,
    each scored by its exact single-position marginal) and ``nelbo`` (the continuous-time bound's
    one-sample estimate, nats per position, padding included; comparable across ranks). An autoregressive model
    (``ttcore.kinds.autoregressive``): ``nll``, its exact -log p(x) per position, padding included (an upper bound's
    counterpart: comparable with the diffusion models' ``nelbo``)."""
    model.eval()
    kind = model.cfg.kind
    if kind.exact_likelihood:  # its exact NLL (``ModelKind.exact_nll``), nothing drawn
        n = min(batches, max(1, len(tokens) // batch_size))
        total = 0.0
        for k in range(n):
            with autocast(device, precision):
                total += kind.exact_nll(model, tokens[k * batch_size:(k + 1) * batch_size].to(device)).item() / n
        model.train()
        return {"nll": total}  # -log p(x) per position (padding included), exact: comparable with ``nelbo``
    g = torch.Generator(device).manual_seed(1234)
    vadd = getattr(model, "recognition", None) is not None
    mixture = bool(getattr(model, "latent_dim", 0)) and not vadd  # a Di4C student (``ModelConfig.latent_draw``)
    # a mixture E_z prod_i p(x^i | x_t, z): its terms for one z ~ p(z) a sequence, so ``nll`` is then an estimate
    # of E_z[-log p(x | x_t, z)] per masked token, an upper bound (Jensen) on the mixture's own NLL
    # a VADD model: Eq. 21's terms instead (``vadd_loss``): ``nll`` given z ~ r_phi, ``kl``, and ``objective``,
    # the Eq. 21 estimate at lambda = ``kl_weight``, nats per token: the training objective, NOT a bound on
    # -log p(x) (z is drawn given x at every t and its KL weighted by 1/t there; measured below the data
    # entropy on a two-token toy), so it compares VADD runs with each other only
    totals = {"nll": 0.0, "kl": 0.0, "objective": 0.0} if vadd else {"nll": 0.0, "marginal_nll": 0.0, "nelbo": 0.0}
    n = min(batches, max(1, len(tokens) // batch_size))
    for k in range(n):
        x0 = tokens[k * batch_size:(k + 1) * batch_size].to(device)
        with autocast(device, precision), torch.no_grad():
            if vadd:
                out = vadd_loss(model, x0, mask_id, kl_weight, eps, generator=g)
                out["objective"] = out["loss"] - out["lc"]
            else:
                z = prior_sample(len(x0), model.latent_dim, g, device) if mixture else None
                out = mdlm_loss(model, x0, mask_id, eps, generator=g, z=z)
        for key in totals:
            totals[key] += out[key].item() / n
    model.train()
    return totals
