"""VADD (Xie et al. 2025, "Variational Autoencoding Discrete Diffusion"), as the paper combines it with
the joint heads (Sec. 4.4, Eq. 21): a Gaussian latent z with prior p(z) = N(0, I) enters the denoiser,
p_theta(x_0 | x_t, z), and a recognition network r_phi(z | x_0, x_t) (a diagonal Gaussian) is trained with
it by the reparameterization trick. What the paper leaves to VADD and we follow from it: the recognition
network is a small bidirectional encoder that reads x_0 and x_t together; at sampling z ~ p(z) is drawn
once per sequence and held fixed through the denoising steps (VADD's consistency sampler)."""

import torch
from torch import nn

from ttcore.distributions import Site, Streams, normal_from_uniform, uniforms

LOG_VAR_RANGE = (-10.0, 5.0)  # clamps r_phi's log-variance: a numerically safe range for exp()


class RecognitionNetwork(nn.Module):
    """r_phi(z | x_0, x_t): token embeddings of x_0 plus those of x_t plus positions, ``n_layers`` of a
    bidirectional Transformer encoder, mean over positions, then the mean and log-variance of z."""

    def __init__(self, vocab_size: int, length: int, latent_dim: int, dim: int = 64, n_layers: int = 2,
                 n_heads: int = 4):
        super().__init__()
        self.clean = nn.Embedding(vocab_size, dim)
        self.noisy = nn.Embedding(vocab_size, dim)
        self.position = nn.Parameter(torch.zeros(length, dim))
        layer = nn.TransformerEncoderLayer(dim, n_heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.out = nn.Linear(dim, 2 * latent_dim)

    def forward(self, x0: torch.Tensor, x_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x0, x_t [b, l] -> (mean, log-variance) [b, latent_dim] each, float32."""
        h = self.encoder(self.clean(x0) + self.noisy(x_t) + self.position[: x0.shape[1]])
        mean, log_var = self.out(h.mean(1)).float().chunk(2, -1)
        return mean, log_var.clamp(*LOG_VAR_RANGE)


def reparameterize(mean: torch.Tensor, log_var: torch.Tensor, generator: torch.Generator | None = None
                   ) -> torch.Tensor:
    """z = mean + exp(log_var / 2) * eps, eps ~ N(0, I): a draw from r_phi differentiable in phi."""
    eps = torch.randn(mean.shape, device=mean.device, generator=generator)
    return mean + (0.5 * log_var).exp() * eps


def gaussian_kl(mean: torch.Tensor, log_var: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, diag exp(log_var)) || N(0, I)) = E_r[log r(z) / p(z)], the expectation of Eq. 21's
    second term in closed form: 1/2 sum_k (mean_k^2 + exp(log_var_k) - 1 - log_var_k). [b, k] -> [b]."""
    return 0.5 * (mean.pow(2) + log_var.exp() - 1.0 - log_var).sum(-1)


def prior_sample(n: int, latent_dim: int, generator, device) -> torch.Tensor:
    """z ~ p(z) = N(0, I) for ``n`` sequences: [n, latent_dim] float32. ``generator``: a torch.Generator, or a
    generation's ``Streams`` (Box-Muller on its ``Site.latent`` uniforms, so each sequence's z is its own)."""
    if isinstance(generator, Streams):
        return normal_from_uniform(uniforms(generator, n, 2 * latent_dim, device, Site.latent)).float()
    return torch.randn(n, latent_dim, device=device, generator=generator)

