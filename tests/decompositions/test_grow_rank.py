"""A CP / TT model grown to a multiple of its rank (``JointModel.with_rank``) is the same joint at every x_t,
checked by enumerating every completion of a tiny model's masked positions; noise then makes it another one."""

import itertools

import pytest
import torch
from tiny import tiny_model

from ttcore.models import JointModel

V, L = 3, 4


def _everything(model: JointModel, x_t: torch.Tensor) -> dict:
    """The model's law at x_t, in float64: p(x_0 | x_t) of every completion (Eq. 9 / the CP mixture), the
    marginals of the masked positions (exact and head contractions), and the step law of T = the first two
    masked positions through the contracted-core head (``chosen_log_prob``)."""
    mask_id = model.cfg.dit.vocab_size - 1
    masked = x_t == mask_id
    free = masked[0].nonzero()[:, 0]
    outcomes = torch.tensor(list(itertools.product(range(V), repeat=len(free))))
    x0 = x_t.repeat(len(outcomes), 1)
    x0[:, free] = outcomes
    n = len(outcomes)
    chosen = torch.zeros_like(masked)
    chosen[0, free[:2]] = True
    with torch.no_grad():
        h = model.features(x_t)
        hn, mn = h.expand(n, -1, -1), masked.expand(n, -1)
        out = {"joint": model.format.outputs(model.head, hn, mn).log_prob(x0),
               "step": model.format.chosen_log_prob(model.head, hn, mn, chosen.expand(n, -1), x0)}
        for contraction in model.format.contractions if hasattr(model.format, "contractions") else ("exact",):
            out[f"marginals {contraction}"] = model.format.marginals_at(model.head, h, masked, masked, 1.0,
                                                                         contraction)
    return out


@pytest.mark.parametrize("decomposition,rank,grown,head", [("tt", 2, 4, "1layer"), ("tt", 2, 6, "2layer"),
                                                            ("cp", 2, 6, "1layer"), ("cp", 3, 6, "2layer")])
def test_a_grown_model_is_its_smaller_models_joint_until_noise_breaks_the_copies(decomposition, rank, grown, head):
    small = tiny_model(decomposition, V, L, rank, perturb=0.5, noise=0.5, head=head).double()
    with torch.no_grad():  # the aux heads (TT's contracted cores, CP's weights) away from their zero start
        for name in small.head.aux:
            getattr(small.head, name).weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(2))
    mask_id = small.cfg.dit.vocab_size - 1
    x_t = torch.tensor([[mask_id, 1, mask_id, mask_id]])
    want = _everything(small, x_t)
    assert want["joint"].exp().sum().item() == pytest.approx(1.0, abs=1e-9)
    big = small.with_rank(grown).eval()
    assert big.cfg.rank == grown and big.head.e == big.format.outputs_per_position(grown)
    got = _everything(big, x_t)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-10, msg=key)
    noisy = _everything(small.with_rank(grown, noise=0.3, generator=torch.Generator().manual_seed(0)).eval(), x_t)
    assert (noisy["joint"] - want["joint"]).abs().max() > 1e-3
    assert noisy["joint"].exp().sum().item() == pytest.approx(1.0, abs=1e-9)


def test_only_a_joint_model_grows_and_only_to_a_multiple_of_its_rank():
    with pytest.raises(ValueError, match="dividing"):
        tiny_model("tt", V, L, 2, perturb=0.5, noise=0.5).with_rank(5)
    with pytest.raises(ValueError, match="CP or TT"):
        tiny_model("none", V, L, 1, perturb=0.5, noise=0.0).with_rank(4)
