"""A step class's own settings: a small frozen dataclass each sampler file declares (``Step.Settings``), as each
diffusers scheduler owns its config. Each field is a ``setting``: its default, its bounds and what it does,
which ``SamplerConfig`` validates and the service's request schema turns into a documented field, so a new
sampler with a setting is one file."""

from dataclasses import MISSING, dataclass, field, fields
from typing import get_type_hints

from ttcore.errors import InvalidSampler


def setting(default, doc: str, *, ge: float | None = None, gt: float | None = None, le: float | None = None):
    """A step setting's field: ``default``, its bounds (``ge`` / ``gt`` below, ``le`` above; None: unbounded) and
    ``doc``, what it does (the request field's description)."""
    return field(default=default, metadata={"doc": doc, "ge": ge, "gt": gt, "le": le})


@dataclass(frozen=True)
class StepSettings:
    """No settings of its own (the base of every step's settings class)."""

    @classmethod
    def of(cls, config) -> "StepSettings":
        """This class's settings in a run's ``SamplerConfig`` (``SamplerConfig.option``)."""
        return cls(**{f.name: config.option(f.name) for f in fields(cls)})

    def check(self, config) -> None:
        """Rules across settings (``InvalidSampler`` naming the field); each field's bounds are checked apart
        (``check_bounds``)."""


def bounds_rule(f) -> str:
    """A setting's bounds in words: ``[1, 16]``, ``(0, 1]`` or ``>= 1``."""
    m = f.metadata
    low, high = m["ge"] if m["ge"] is not None else m["gt"], m["le"]
    if low is not None and high is not None:
        return f"lie in {'[' if m['ge'] is not None else '('}{low}, {high}]"
    if low is not None:
        return f"be {'>=' if m['ge'] is not None else '>'} {low}"
    return f"be <= {high}" if high is not None else "be any value"


def check_bounds(f, value) -> None:
    """Refuse a value outside its setting's bounds (``InvalidSampler`` naming the setting); None passes where
    it is the default."""
    if value is None and f.default is None:
        return
    m = f.metadata
    ok = value is not None and (m["ge"] is None or value >= m["ge"]) and (m["gt"] is None or value > m["gt"]) \
        and (m["le"] is None or value <= m["le"])
    if not ok:
        raise InvalidSampler(f.name, f"{f.name} must {bounds_rule(f)}, got {value}")


def declared(step_classes) -> dict:
    """Every setting the step classes declare: name -> (its dataclass field, its type, the owning settings
    class). Two classes may share a setting only with one default (``ValueError`` otherwise)."""
    out = {}
    for cls in step_classes:
        hints = get_type_hints(cls.Settings)
        for f in fields(cls.Settings):
            assert f.default is not MISSING, f"{cls.Settings.__name__}.{f.name} needs a default"
            if f.name in out and out[f.name][0].default != f.default:
                raise ValueError(f"setting {f.name!r} is declared twice with different defaults")
            out.setdefault(f.name, (f, hints[f.name], cls.Settings))
    return out
