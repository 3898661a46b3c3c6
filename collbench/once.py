"""Placeholder: filled in by its issue."""


def register(subparsers):
    pass
