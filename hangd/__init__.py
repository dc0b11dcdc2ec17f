"""hangd: what each GPU process is doing, and whether a distributed job is hung, why and who is to blame."""

__version__ = "0.1.0"
