"""Sample-quality metrics. Molecule metrics need the ``chem`` extra (RDKit)."""

__all__ = ["canonical", "molecule_metrics"]


def __getattr__(name):  # RDKit is imported only when a molecule metric is asked for
    if name in __all__:
        from . import molecules
        return getattr(molecules, name)
    raise AttributeError(name)
