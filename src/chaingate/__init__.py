"""chaingate: a self-hostable blockchain infrastructure API."""

__version__ = "0.1.0"
