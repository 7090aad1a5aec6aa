"""Errors the library's layers share (a leaf module: it imports nothing of ttcore)."""


class InvalidSampler(ValueError):
    """Settings a model or no step class can run; ``field`` names the setting (the request field of that name)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
