"""The autoregressive model of a family: the DiT's blocks with causal attention and inputs shifted right
(``DiTConfig.causal``), its rank-1 head predicting p(x^i | x^{<i}) at every position.

It is a ``JointModel`` like the others (checkpoint, card, inference, serving): its exact log-likelihood is one
forward pass over the clean sequence, log p(x) = sum_i log p(x^i | x^{<i}) (``ar_log_prob``), and it generates
by the same denoising loop, one token a step, left to right (the kind's rules: ``Autoregressive.check_run``):
at the leftmost masked position the rank-1 step draws from the head's softmax there, which is exactly
p(x^i | x^{<i}) since that position sees only the tokens before it. Its steps read a key-value cache
(``ttcore.models.kv_cache``): each computes the one position it draws at, so a sequence costs about one forward
pass of length l instead of l of them."""

import torch

from ttcore.errors import InvalidSampler

from .base import ModelKind

ORDERING = "left_to_right"
SCHEDULE = "loglinear"  # n f(t) falls by at most one a step when steps >= n: one token a step


def ar_log_prob(model, x: torch.Tensor) -> torch.Tensor:
    """log p(x) [b] (float32) of sequences x [b, l] under an autoregressive model: exact, one forward pass (every
    position's p(x^i | x^{<i}) from the clean sequence, which causal attention and the shift make legitimate)."""
    return model(x, torch.ones_like(x, dtype=torch.bool)).log_prob(x)


def ar_conditionals(model, x: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
    """log p(x^i = v | x^{<i}) (float32) for sequences x [b, l]: every position's next-token law given the tokens
    before it, [b, l, V]; or at the positions ``at`` [b, l] (bool) only, [m, V] row-major, the head run there alone
    (positions past a [MASK] read it as a token: callers use only the prefix's)."""
    at_all = torch.ones_like(x, dtype=torch.bool) if at is None else at
    logp = next_token_log_probs(model, model.features(x), at_all)
    return logp.view(*x.shape, -1) if at is None else logp


def next_token_log_probs(model, h: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """log p(x^i = v | x^{<i}) [m, V] (float32) at the positions ``at`` [b, l] (bool, row-major) from an
    autoregressive model's features h [b, l, d] (``features``, or a key-value cache's ``decode`` there)."""
    return torch.log_softmax(model.head_outputs(h, at).logits.float(), -1)


def is_suffix(mask: torch.Tensor) -> bool:
    """Whether each row of ``mask`` [b, l] (bool) is a suffix: no unmasked position after a masked one, the case an
    autoregressive model conditions (a known prefix) and scores exactly."""
    return not bool((mask.int().diff(dim=1) < 0).any())


def ar_score(model, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``scoring.score`` for an autoregressive model: x [b, l], the scored positions ``mask`` [b, l], which must be
    a suffix of each row (the rest a known prefix) -> (log p(x_M | x_prefix) [b] float64, exact: the sum of the
    conditionals; per-position log p(x^i | x^{<i}) [b, l], NaN where not scored). Raises ValueError otherwise."""
    if not is_suffix(mask):
        raise ValueError("an autoregressive model scores a suffix given a prefix: no known token may follow a "
                         "scored one")
    token = torch.full(x.shape, float("nan"), dtype=torch.float64, device=x.device)
    token[mask] = ar_conditionals(model, x, mask).double().gather(1, x[mask][:, None])[:, 0]
    return token.nan_to_num(0.0).sum(1), token


def ar_loss(model, x0: torch.Tensor, generator=None, step: int = 0) -> dict:
    """The autoregressive training objective: -log p(x0) per token (every position, padding included, as the
    diffusion models' NELBO counts it). ``fit``'s ``objective`` contract (``generator`` and ``step`` unused: the
    objective draws nothing)."""
    nll = -ar_log_prob(model, x0)
    per_token = nll.sum() / x0.numel()
    zero = per_token.detach() * 0
    return {"loss": per_token, "nll": per_token.detach(), "lc": zero}


class Autoregressive(ModelKind):
    name = "autoregressive"
    description = "an autoregressive model"
    holds_cache = True
    constrains = False  # its steps draw one position: there is no joint of the masked positions to restrict
    elbo = False  # its log p(x) is exact
    exact_likelihood = True
    joint_heads = False  # its head is the next-token softmax
    companion = True
    by_default = False  # the baseline, not a diffusion model: it answers only when named

    def matches(self, cfg) -> bool:
        return bool(cfg.dit.causal)

    def check_config(self, cfg) -> None:
        if cfg.format.joint_head or cfg.dit.latent_dim or cfg.backbone is not None:
            raise ValueError("an autoregressive model (dit.causal) is a DiT with the rank-1 head and no latent")

    def base(self, cfg) -> str:
        return "ar"

    def head_label(self, cfg) -> str:
        return "ar"  # its next-token head

    def model_id(self, family: str, cfg) -> str:
        return f"{family}-ar"

    def default_steps(self, cfg) -> int:
        return cfg.dit.length  # one token a step

    def request_defaults(self, cfg=None) -> dict:
        return {"ordering": ORDERING}

    def check_run(self, config, steps: int, tokens: torch.Tensor, mask_id: int, constrained: bool) -> None:
        """It draws one token a step, left to right, after a known prefix: every other setting is refused."""
        super().check_run(config, steps, tokens, mask_id, constrained)
        if config.ordering != ORDERING:
            raise InvalidSampler("ordering", f"an autoregressive model generates left to right: ordering must be "
                                             f"{ORDERING!r}, got {config.ordering!r}")
        if config.sampler is not None or config.eb_gamma is not None:
            raise InvalidSampler("sampler", "an autoregressive model draws one token a step: no sampler or eb_gamma")
        if config.schedule != SCHEDULE or config.bernoulli:  # others unmask two tokens in some step at any steps
            raise InvalidSampler("bernoulli" if config.bernoulli else "schedule",
                                 f"an autoregressive model draws one token a step: schedule must be {SCHEDULE!r} "
                                 f"(with steps >= the masked positions, at most one a step) without bernoulli, got "
                                 f"{config.schedule!r}" + (" with bernoulli" if config.bernoulli else ""))
        masked = tokens == mask_id
        n = int(masked.sum(1).max()) if masked.numel() else 0
        if steps < n:
            raise InvalidSampler("steps", f"an autoregressive model draws one token a step: steps must be >= {n} "
                                          f"(the masked positions), got {steps}")
        if not is_suffix(masked):
            raise InvalidSampler("prompt", "an autoregressive model conditions on a prefix only: no known token may "
                                           "follow a masked one")

    def score_refusal(self, cfg, mask: torch.Tensor) -> str | None:
        if is_suffix(mask):
            return None
        return ("an autoregressive model scores a suffix given a prefix: no known token may follow a scored one "
                f"(the template's [MASK]s must run from the first to the model's length, {cfg.dit.length} tokens)")

    def score(self, model, x0: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ar_score(model, x0, mask)

    def exact_nll(self, model, x0: torch.Tensor) -> torch.Tensor:
        return ar_loss(model, x0)["nll"]

    def objective(self, cfg, mask_id: int, eps: float):
        return ar_loss

    def cache_row_bytes(self, cfg, copies: int = 2) -> int:
        """Every block's keys and values at every position, float32 (an upper bound under bf16), ``copies`` times
        (a generation's cache is held between steps and copied once more when runs step together)."""
        return copies * 2 * cfg.dit.n_blocks * cfg.dit.length * cfg.dit.hidden_dim * 4

    def cached_features(self, model, runs: list, sizes: list[int], x: torch.Tensor) -> tuple[torch.Tensor, list]:
        """A prefill of the runs without a usable cache and one position of the others: at most two backbone
        calls (``ttcore.models.kv_cache.cached_features``)."""
        from ttcore.models.kv_cache import cached_features

        return cached_features(model, [run.kv for run in runs], sizes, x)

    def calibration(self, settings: dict, steps: int, cfg) -> tuple[dict, int, bool]:
        """Its only way, one token a step left to right, timed over a whole run: the first step fills the cache
        (a forward of the sequence), the others compute one position each; the mean step is its cost."""
        return dict(settings, ordering=ORDERING), max(steps, cfg.dit.length), True


AUTOREGRESSIVE = Autoregressive()
