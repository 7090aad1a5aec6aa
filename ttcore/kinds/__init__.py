"""Model kinds, one file each, and their registry: what a checkpoint's architecture means to the samplers, the
scorer and the service (the orderings and schedules it allows, what a prompt means to it, how it scores, whether
it holds a cache and what that costs, how it is named and paired), so no code outside a kind's file asks a
model's flags. A new kind is a ``ModelKind`` subclass (anywhere) and one ``register_kind`` call."""

from .autoregressive import AUTOREGRESSIVE, Autoregressive
from .base import MODEL_KINDS, ModelKind, get_kind, kind_of, register_kind, unregister_kind
from .block_diffusion import BLOCK_DIFFUSION, BlockDiffusion
from .diffusion import DIFFUSION, Diffusion
from .pairing import companion, pair, unpair

for _kind in (DIFFUSION, AUTOREGRESSIVE, BLOCK_DIFFUSION):  # diffusion first: it matches every model no later
    # kind claims
    register_kind(_kind)

__all__ = ["AUTOREGRESSIVE", "Autoregressive", "BLOCK_DIFFUSION", "BlockDiffusion", "DIFFUSION", "Diffusion",
           "MODEL_KINDS", "ModelKind", "companion", "get_kind", "kind_of", "pair", "register_kind", "unpair",
           "unregister_kind"]
