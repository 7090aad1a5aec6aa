"""Formats of p(x | x_t): rank 1 (the MDM), CP and TT, one file each, and their registry.

Each file holds its equations (masked log-likelihood, exact marginals, any extra loss), its head module
(``build_head``: the outputs and extra heads it adds to the model), its head-output type (``HeadOutputs``:
builds the joint at a temperature and scores masked targets) and its format object (``Decomposition``:
the exact draws and marginals it answers from its head's outputs). A new format is a new file (here or
anywhere) and one ``register_decomposition`` call.
"""

from ttcore.registry import Registry

from .base import Decomposition, Denoiser, HeadOutputs, SumsNothing
from .cp import CPDecomposition, CPHead, CPOutputs, cp_masked_log_prob, cp_masked_marginal_log_probs
from .factorized import FactorizedOutputs, Rank1, draw_from_components, factorized_masked_log_prob
from .heads import HEAD_KINDS, BaseHead, ComponentHead, OutputHead
from .tt import (
    CONTRACTIONS,
    TTDecomposition,
    TTHead,
    TTOutputs,
    contracted_core_loss,
    exact_contracted_cores,
    sums_cores_exactly,
    tt_masked_log_prob,
    tt_masked_marginal_log_probs,
    tt_selected_log_cores,
)

# the formats models, checkpoints, samplers and the service accept by ``name``
DECOMPOSITIONS: Registry = Registry("decomposition")
register_decomposition = DECOMPOSITIONS.register
unregister_decomposition = DECOMPOSITIONS.unregister
get_decomposition = DECOMPOSITIONS.named


for _fmt in (Rank1(), CPDecomposition(), TTDecomposition()):
    register_decomposition(_fmt)

__all__ = ["CONTRACTIONS", "DECOMPOSITIONS", "HEAD_KINDS", "BaseHead", "CPDecomposition", "CPHead", "CPOutputs",
           "ComponentHead", "Decomposition", "Denoiser", "FactorizedOutputs", "HeadOutputs", "OutputHead", "Rank1",
           "SumsNothing", "TTDecomposition", "TTHead", "TTOutputs", "contracted_core_loss", "cp_masked_log_prob",
           "cp_masked_marginal_log_probs", "draw_from_components", "exact_contracted_cores",
           "factorized_masked_log_prob", "get_decomposition", "register_decomposition", "sums_cores_exactly",
           "tt_masked_log_prob", "tt_masked_marginal_log_probs", "tt_selected_log_cores",
           "unregister_decomposition"]
