"""Decompositions of p(x | x_t): rank 1 (the MDM), CP and TT, one file each, and their registry.

Each file holds its equations (masked log-likelihood, exact marginals, any extra loss), its head-output
type (``HeadOutputs``: builds the joint at a temperature and scores masked targets) and its registry
entry (``Decomposition``: the heads it adds to the model, and its exact predetermined-step draw). A new
decomposition is a new file here plus one line in ``DECOMPOSITIONS``.
"""

from .base import Decomposition, Denoiser, HeadOutputs
from .cp import CPDecomposition, CPOutputs, cp_masked_log_prob, cp_masked_marginal_log_probs
from .factorized import FactorizedOutputs, Rank1, factorized_masked_log_prob
from .tt import (
    CONTRACTIONS,
    TTDecomposition,
    TTOutputs,
    contracted_core_loss,
    exact_contracted_cores,
    sums_cores_exactly,
    tt_masked_log_prob,
    tt_masked_marginal_log_probs,
    tt_selected_log_cores,
)

DECOMPOSITIONS: dict[str, Decomposition] = {d.name: d for d in (Rank1, CPDecomposition, TTDecomposition)}


def get_decomposition(name: str) -> Decomposition:
    if name not in DECOMPOSITIONS:
        raise ValueError(f"decomposition must be one of {', '.join(DECOMPOSITIONS)}; got {name!r}")
    return DECOMPOSITIONS[name]


__all__ = ["CONTRACTIONS", "DECOMPOSITIONS", "CPDecomposition", "CPOutputs", "Decomposition", "Denoiser",
           "FactorizedOutputs", "HeadOutputs", "Rank1", "TTDecomposition", "TTOutputs", "contracted_core_loss",
           "cp_masked_log_prob", "cp_masked_marginal_log_probs", "exact_contracted_cores",
           "factorized_masked_log_prob", "get_decomposition", "sums_cores_exactly", "tt_masked_log_prob",
           "tt_masked_marginal_log_probs", "tt_selected_log_cores"]
