"""Joint distributions p(x | x_t) over a whole sequence: factorized, CP and Tensor-Train.

Pure math on tensors (no nn.Module, nothing else of ttcore imported), batched over b.
"""

from .base import JointDistribution
from .categorical import entry_rows, is_one, sample_categorical, softmax64, tempered, tempered_log_normalizer
from .cp import CP, cp_log_prob, cp_marginals, cp_posterior
from .factorized import Factorized
from .streams import Site, Streams, compile_streams, normal_from_uniform, uniforms
from .tensor_train import (
                           TensorTrain,
                           chosen_index,
                           tt_chain_log_value,
                           tt_contract,
                           tt_contracted_from_logits,
                           tt_cores_from_logits,
                           tt_gap_products,
                           tt_h_transform,
                           tt_log_prob,
                           tt_marginals,
                           tt_messages,
                           tt_prefix_products,
                           tt_sample_path,
                           tt_select,
                           tt_shared_log_prob,
                           tt_state_marginals,
)

__all__ = ["CP", "Factorized", "JointDistribution", "TensorTrain", "Site", "Streams", "compile_streams",
           "sample_categorical", "softmax64", "tempered", "tempered_log_normalizer", "is_one", "entry_rows",
           "cp_log_prob", "cp_marginals", "cp_posterior", "chosen_index", "tt_chain_log_value", "tt_contract",
           "tt_contracted_from_logits", "tt_cores_from_logits", "tt_gap_products", "tt_h_transform", "tt_log_prob",
           "tt_marginals", "tt_messages", "tt_prefix_products", "tt_sample_path", "tt_select", "tt_shared_log_prob",
           "tt_state_marginals",
           "normal_from_uniform", "uniforms"]
