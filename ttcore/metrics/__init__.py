"""Sample-quality metrics. Molecule metrics need the ``chem`` extra (RDKit); text metrics the ``text``
extra (transformers, gguf) and a judge LM."""

__all__ = ["canonical", "generative_perplexity", "load_judge", "molecule_metrics", "unigram_entropy"]
_WHERE = {"canonical": "molecules", "molecule_metrics": "molecules", "generative_perplexity": "text",
          "load_judge": "text", "unigram_entropy": "text"}


def __getattr__(name):  # heavy dependencies are imported only when a metric is asked for
    if name in _WHERE:
        import importlib
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(name)
