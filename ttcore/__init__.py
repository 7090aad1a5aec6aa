"""ttcore: few-step masked diffusion with tensor-decomposed joint distributions.

Shape vocabulary (used in every shape comment of the package):
    b  batch               l  sequence length (N in the paper)
    v  vocabulary size      r  rank (CP rank or TT rank)
    m  number of masked positions, flattened over the batch
    t  number of positions chosen in one step (|T| in the paper)
    d  model width          h  attention heads        s  denoising steps
    e  head outputs per position (E = r for CP, r*r for TT)
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
