"""Things kept by name, one way (formats, model kinds, metrics kinds, distillation objectives, grammars): a
``Registry`` is the dict of them, with ``register`` (refusing a second thing of a taken name), ``unregister``
and ``named`` (whose error lists the names a caller may use)."""


class Registry(dict):
    """name -> item. ``what`` names the field or flag that names an item (``decomposition``, ``objective``)."""

    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def register(self, item, name: str | None = None):
        """Keep ``item`` under ``name`` (default: its ``name``) -> ``item``; ValueError if another has it."""
        name = item.name if name is None else name
        if name in self and self[name] is not item:
            raise ValueError(f"a {self.what} named {name!r} is already registered")
        self[name] = item
        return item

    def unregister(self, name: str) -> None:
        """Forget ``name`` (tests and plugins that clean up after them); nothing if it is not kept."""
        self.pop(name, None)

    def named(self, name: str):
        """The item of ``name``; ValueError naming the ones kept otherwise."""
        if name not in self:
            raise ValueError(f"{self.what} must be one of {', '.join(self)}; got {name!r}")
        return self[name]
