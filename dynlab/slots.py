"""Quick makers of frozen slotted dataclasses, for the objects a replay makes once per request.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (its own
``__setattr__`` refuses); :func:`quick_maker` builds a function that sets the slots through their
descriptors instead, about half the cost (measured 2026-12-02 on ``BlockStored``: 0.37 against 0.65
us). It makes the same object: the same type, fields, ``==``, ``hash`` and ``repr``.
"""
from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Callable, Sequence


def quick_maker(cls: type, positional: Sequence[str]) -> Callable:
    """``make(*values)`` returning ``cls(*values)``: ``positional`` names the leading fields the values
    fill, in order; every other field takes its default.

    ``cls`` must be a ``slots=True`` dataclass without ``__post_init__``. Raises ``ValueError`` when
    ``positional`` is not a prefix of the fields or a field left out has no plain default (a
    ``default_factory``), ``TypeError`` when ``cls`` is not such a dataclass.
    """
    fs = fields(cls)
    names = [f.name for f in fs]
    if list(positional) != names[:len(positional)]:
        raise ValueError(f"{cls.__name__}: {list(positional)} is not a prefix of its fields {names}")
    ns = _setters(cls, fs)
    lines = []
    for i, f in enumerate(fs):
        if i < len(positional):
            lines.append(f"    set{i}(ob, {f.name})")
            continue
        if f.default is MISSING:
            raise ValueError(f"{cls.__name__}.{f.name} has no plain default")
        ns[f"d{i}"] = f.default
        lines.append(f"    set{i}(ob, d{i})")
    src = f"def make({', '.join(positional)}):\n    ob = new(cls)\n" + "\n".join(lines) + "\n    return ob\n"
    exec(src, ns)  # as dataclasses builds its own __init__
    make = ns["make"]
    make.__doc__ = f"``{cls.__name__}({', '.join(positional)})``, built by :func:`dynlab.slots.quick_maker`."
    return make


def _setters(cls: type, fs) -> dict:
    """The namespace the generated functions run in: ``new``, ``cls`` and ``set{i}``, the slot setter of the
    ``i``-th of ``fs`` (``cls``'s fields). Raises ``TypeError`` unless ``cls`` is slotted, without ``__post_init__``."""
    if "__slots__" not in cls.__dict__ or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} is not a slotted dataclass without __post_init__")
    ns: dict = {"new": object.__new__, "cls": cls}
    for i, f in enumerate(fs):
        ns[f"set{i}"] = getattr(cls, f.name).__set__
    return ns


def quick_replacer(cls: type, changed: Sequence[str]) -> Callable:
    """``replace(ob, *values)`` returning ``dataclasses.replace(ob, **dict(zip(changed, values)))``: the
    fields ``changed`` names take the values, in order; every other field is ``ob``'s.

    ``cls`` must be a ``slots=True`` dataclass without ``__post_init__`` (``TypeError`` otherwise);
    ``ValueError`` for a name in ``changed`` that is not one of its fields.
    """
    fs = fields(cls)
    names = [f.name for f in fs]
    unknown = [c for c in changed if c not in names]
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}")
    ns = _setters(cls, fs)
    lines = []
    for i, f in enumerate(fs):
        value = f.name if f.name in changed else f"ob0.{f.name}"
        lines.append(f"    set{i}(ob, {value})")
    src = f"def replace(ob0, {', '.join(changed)}):\n    ob = new(cls)\n" + "\n".join(lines) + "\n    return ob\n"
    exec(src, ns)  # as dataclasses builds its own __init__
    replace = ns["replace"]
    replace.__doc__ = f"``dataclasses.replace(ob0, {', '.join(c + '=' for c in changed)})``, built by " \
                      ":func:`dynlab.slots.quick_replacer`."
    return replace
