"""Sample-quality metrics. Molecule metrics need the ``chem`` extra (RDKit); text metrics the ``text``
extra (transformers, gguf) and a judge LM."""

from .kinds import METRICS_KINDS, MetricsKind, default_metrics, get_metrics_kind, register_metrics_kind

__all__ = ["METRICS_KINDS", "MetricsKind", "canonical", "default_metrics", "generative_perplexity",
           "get_metrics_kind", "load_judge", "molecule_metrics", "register_metrics_kind", "unigram_entropy"]
_WHERE = {"canonical": "molecules", "molecule_metrics": "molecules", "generative_perplexity": "text",
          "load_judge": "text", "unigram_entropy": "text"}


def __getattr__(name):  # heavy dependencies are imported only when a metric is asked for
    if name in _WHERE:
        import importlib
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(name)
