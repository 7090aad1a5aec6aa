"""What a family is measured by (its ``data.metrics``), as objects: the recipes, ``evaluate.py``, the service's
registry and its answers, and the playground ask the kind instead of comparing its name.

A kind says which tokenizers it applies to and is the default for, whether each sample can be checked
(``checker``: a valid sample's extra answer fields, None for an invalid one; ``valid_only`` then applies),
whether samples can be drawn (``depicts``: GET /depict), and which of ``evaluate.py``'s evaluations it takes
(``evaluation``). A new kind is one ``register_metrics_kind`` call.
"""

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ttcore.registry import Registry

log = logging.getLogger("ttcore.metrics")

Checker = Callable[[str], dict | None]  # a sample's text -> its extra answer fields when valid, None when not


@dataclass(frozen=True)
class MetricsKind:
    name: str
    description: str  # what it measures (the API's and the docs' wording)
    tokenizers: tuple[str, ...] | None = None  # the tokenizer kinds it applies to (None: any)
    default_for: tuple[str, ...] = ()  # tokenizer kinds (a section's, or a saved tokenizer's) it is the default of
    evaluation: str = "sequences"  # evaluate.py's evaluation: molecules, text or sequences
    depicts: bool = False  # a sample can be drawn (GET /depict: molecules)
    check: Callable[[], Checker | None] | None = None  # builds the per-sample check (None where it cannot run)
    one_molecule: bool = False  # molecules: a valid sample is one connected molecule (several fragments: invalid)

    @property
    def validates(self) -> bool:
        """Whether each sample is checked (answers carry ``valid``; ``valid_only`` applies)."""
        return self.check is not None

    def checker(self) -> Checker | None:
        """The per-sample check, or None (it checks nothing, or its dependency is missing: answers then carry
        ``valid: null``)."""
        return None if self.check is None else _cached_checker(self.check)

    @property
    def molecular(self) -> bool:
        """Whether its samples are molecules (its evaluation is the molecules one: augmentation applies)."""
        return self.evaluation == "molecules"

    def applies_to(self, tokenizer: str) -> bool:
        return self.tokenizers is None or tokenizer in self.tokenizers


@functools.cache
def _cached_checker(build: Callable[[], Checker | None]) -> Checker | None:
    return build()


def _rdkit_properties(one_molecule: bool = True) -> Checker | None:
    """``molecules.properties`` (one parse: None for an invalid SMILES, else its canonical form and descriptors),
    or None where RDKit is not installed (a server without the `chem` extra serves SMILES with ``valid: null``)."""
    try:
        from .molecules import properties
    except ImportError as e:
        log.warning("RDKit is not importable (%s; pip install '.[chem]'): SMILES answers carry valid=null", e)
        return None
    return functools.partial(properties, one_molecule=one_molecule)


def _rdkit_mixtures() -> Checker | None:
    """``_rdkit_properties`` that accepts several fragments (salts, mixtures)."""
    return _rdkit_properties(one_molecule=False)


# the ``data.metrics`` values that recipes record and the service and ``evaluate.py`` honour
METRICS_KINDS: Registry = Registry("metrics")
register_metrics_kind = METRICS_KINDS.register
unregister_metrics_kind = METRICS_KINDS.unregister
get_metrics_kind = METRICS_KINDS.named


def default_metrics(tokenizer: str) -> str:
    """What a family is measured by when its section does not say: the kind that is ``tokenizer``'s default
    (molecules for SMILES, text for BPE: a section's ``bpe`` / ``gpt2`` or a saved tokenizer's ``text``), else
    none."""
    return next((k.name for k in METRICS_KINDS.values() if tokenizer in k.default_for), "none")


for _kind in (
    MetricsKind("molecules", "RDKit validity (one connected molecule), uniqueness, novelty and descriptors",
                ("smiles", "selfies", "safe"), ("smiles", "selfies", "safe"), "molecules", depicts=True,
                check=_rdkit_properties, one_molecule=True),
    MetricsKind("molecule_mixtures", "RDKit validity (any number of fragments: salts, mixtures), uniqueness, "
                "novelty and descriptors", ("smiles", "selfies", "safe"), (), "molecules", depicts=True,
                check=_rdkit_mixtures),
    MetricsKind("text", "generative perplexity under a judge LM and unigram entropy", None, ("bpe", "gpt2", "text"),
                "text"),
    MetricsKind("none", "the sequences only: uniqueness and novelty against the training split"),
):
    register_metrics_kind(_kind)
