"""The plugin manager and the registries of strategies, eviction policies, trace formats, latency models,
scorers, workload generators, engine kinds, queue policies and admission policies.

The manager is built on first use (:func:`get_plugin_manager`), never at import
time, from the ``dynlab`` entry-point group; the registries are rebuilt from the
manager's hooks on each call, so a plugin registered at run time (as the tests
do) is seen at once.
"""
from __future__ import annotations

import functools
import importlib.metadata
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

import pluggy

from dynlab import hookspecs
from dynlab.errors import DynlabError


class RegistryError(DynlabError, ValueError):
    """A plugin registered a class with an empty or duplicate name, or of the wrong kind."""


class UnknownNameError(KeyError):
    """A name that no plugin registered; ``str()`` lists what exists."""

    def __str__(self) -> str:  # KeyError would add quotes around the message
        return self.args[0]


@dataclass(frozen=True)
class Entry:
    """One registered class and the plugin source (a distribution name) that registered it."""

    name: str
    cls: type
    source: str

    @property
    def description(self) -> str:
        """First line of the class docstring ('' when there is none)."""
        doc = (self.cls.__doc__ or "").strip()
        return doc.splitlines()[0].strip() if doc else ""


class Registry:
    """Names -> classes for one plugin kind (``strategy``, ``eviction policy``, ``trace format``).

    Raises :class:`RegistryError` on an empty or duplicate name (naming both sources)
    and :class:`UnknownNameError` (listing the known names) on lookup of an unknown one.
    """

    def __init__(self, kind: str, base: type | str | None = None):
        self.kind = kind
        self.base = base
        self._entries: dict[str, Entry] = {}

    def add(self, cls: type, source: str) -> None:
        if not isinstance(cls, type):
            raise RegistryError(f"{source}: registered {cls!r} as a {self.kind}, but it is not a class")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name.strip():
            raise RegistryError(f"{source}: {self.kind} class {cls!r} has an empty name")
        if self.base is not None and not _subclasses(cls, self.base):
            raise RegistryError(f"{source}: {self.kind} {name!r} is not a subclass of {_dotted(self.base)}")
        if name in self._entries:
            other = self._entries[name].source
            raise RegistryError(f"{self.kind} {name!r} is registered twice: by {other} and by {source}")
        self._entries[name] = Entry(name, cls, source)

    def names(self) -> list[str]:
        return list(self._entries)

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def get(self, name: str) -> type:
        try:
            return self._entries[name].cls
        except KeyError:
            known = ", ".join(self._entries) or "(none)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; available: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


@functools.lru_cache(maxsize=None)
def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide manager: hookspecs added, ``dynlab`` entry points loaded, hooks checked.

    A plugin whose module fails to import, or that implements a hook that does not
    exist, is left out with a one-line warning on stderr naming its distribution, so
    one broken package cannot stop every command (a register hook that raises leaves out
    that hook's classes the same way: :func:`_collect`).
    """
    return load_plugins(importlib.metadata.entry_points(group=hookspecs.PROJECT))


def load_plugins(entry_points) -> pluggy.PluginManager:
    """A manager with the hookspecs and the plugins of ``entry_points`` (``importlib.metadata.EntryPoint``s of
    the ``dynlab`` group), as :func:`get_plugin_manager` describes.

    Two entry points of one name are both loaded unless they name the same module (one distribution seen
    twice, e.g. an editable install beside its metadata): a third-party entry point named like a built-in
    one (``trace_formats``) is registered as ``NAME (DISTRIBUTION)``, never skipped without a word.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    names: dict = {}  # a distribution's entry points share its name: its METADATA is parsed once (start-up)
    loaded: dict = {}  # entry-point name -> the module it named
    for ep in entry_points:
        if pm.is_blocked(ep.name) or loaded.get(ep.name) == ep.value:
            continue
        dist = _dist_name(ep.dist, names)
        name = ep.name if ep.name not in loaded else f"{ep.name} ({dist})"
        if pm.get_plugin(name) is not None:  # the same name from the same distribution: its first wins
            warnings.warn(f"dynlab plugin {ep.name!r} ({ep.value}) from {dist} is left out: that distribution "
                          f"already gives an entry point {ep.name!r}", PluginWarning, stacklevel=2)
            continue
        loaded.setdefault(ep.name, ep.value)
        try:
            plugin = ep.load()
            pm.register(plugin, name=name)
        except (Exception, SystemExit) as exc:  # SystemExit: a plugin that exits while imported
            warnings.warn(f"dynlab plugin {ep.name!r} from {dist} is left out: {type(exc).__name__}: {exc}",
                          PluginWarning, stacklevel=2)
            continue
        _SOURCES[id(plugin)] = dist
        try:
            pm.check_pending()
        except pluggy.PluginValidationError as exc:
            pm.unregister(plugin)
            warnings.warn(f"dynlab plugin {ep.name!r} from {dist} is left out: {exc}", PluginWarning, stacklevel=2)
    return pm


def _dist_name(dist, names: dict) -> str:
    """The ``Name`` of an entry point's distribution (``?`` when unknown), memoised in ``names`` by its
    location: each ``metadata`` access parses the distribution's METADATA file again."""
    if dist is None:
        return "?"
    key = str(getattr(dist, "_path", id(dist)))
    if key not in names:
        names[key] = dist.metadata["Name"]
    return names[key]


class PluginWarning(UserWarning):
    """A plugin could not be loaded and was left out."""


_SOURCES: dict[int, str] = {}  # id(plugin module) -> the distribution that provides it


def _plugin_sources(pm: pluggy.PluginManager) -> dict[int, str]:
    """id(plugin) -> the name of the distribution that provides it."""
    return {id(p): _SOURCES[id(p)] for p in pm.get_plugins() if id(p) in _SOURCES}


#: (plugin source, hook name) of the register hooks that raised, each warned once per process (:func:`_collect`)
_HOOK_FAILED: set = set()


def _collect(hook_name: str, kind: str, base: type | None, pm: pluggy.PluginManager | None) -> Registry:
    """The registry of ``hook_name``'s implementations in ``pm``, each class credited to its plugin. A hook that
    raises leaves out every class it registered, with one :class:`PluginWarning` per plugin and hook (the registries
    are rebuilt on each call): one broken plugin cannot stop every command. Raises :class:`RegistryError` for a
    class the registry refuses (:meth:`Registry.add`)."""
    pm = pm or get_plugin_manager()
    registry = Registry(kind, base)
    sources = _plugin_sources(pm)
    hook = getattr(pm.hook, hook_name)
    # Call each implementation separately so every class is credited to its own plugin.
    for impl in reversed(hook.get_hookimpls()):
        source = sources.get(id(impl.plugin)) or impl.plugin_name
        registered: list = []
        try:
            impl.function(register=registered.append)
        except Exception as exc:
            if (source, hook_name) not in _HOOK_FAILED:
                _HOOK_FAILED.add((source, hook_name))
                warnings.warn(f"dynlab plugin {source} is left out of {_FUNCTIONS[kind]}: its {hook_name} hook failed: "
                              f"{type(exc).__name__}: {exc}", PluginWarning, stacklevel=3)
            continue
        for cls in registered:
            registry.add(cls, source)
    return registry


#: every plugin kind: (its name in ``dynlab plugins`` and in registry errors, its registry function's name, what
#: that function lists); each kind's hook is ``dynlab_register_<function name>`` (:mod:`dynlab.hookspecs`)
KINDS = (
    ("strategy", "strategies", "routing strategy (``--mode`` names)"),
    ("eviction policy", "eviction_policies", "cache eviction policy (``--policy`` names)"),
    ("trace format", "trace_formats", "trace reader (``--trace-format`` names)"),
    ("latency model", "latency_models", "step-latency model (``--latency-model`` names)"),
    ("scorer", "scorers", "scorer (the names of the ``weighted`` strategy's ``--opt scorers=``)"),
    ("workload", "workloads", "workload generator (the ``generator`` names of ``--workload`` specs)"),
    ("engine kind", "engine_kinds", "engine kind of the timed fleet (``--engine`` names)"),
    ("queue policy", "queue_policies", "queue policy of the timed engine (``--queue-policy`` names)"),
    ("admission policy", "admission_policies", "admission policy of the gateway (``--admission-policy`` names)"),
    ("controller", "controllers", "controller of elastic fleets (``--controller`` names)"),
)
_FUNCTIONS = {kind: fn for kind, fn, _ in KINDS}


def registry(kind: str, pm: pluggy.PluginManager | None = None) -> Registry:
    """Every class registered as ``kind`` (a :data:`KINDS` name) by the plugins of ``pm`` (the process's
    manager when ``None``), each checked to subclass the kind's base class. ``KeyError`` for an unknown kind."""
    return _collect(f"dynlab_register_{_FUNCTIONS[kind]}", kind, BASES[kind], pm)


#: each kind's base class, by its dotted name: a plugin's class has it in its MRO (it imported the base to subclass
#: it), so checking needs no import here, and this module, which the layers import, imports none of them
BASES = {
    "strategy": "dynlab.routing.strategy.Strategy",
    "eviction policy": "dynlab.kv.policies.EvictionPolicy",
    "trace format": "dynlab.traces.format.TraceFormat",
    "latency model": "dynlab.latency.base.LatencyModel",
    "scorer": "dynlab.routing.scorer.Scorer",
    "workload": "dynlab.traces.workload.Workload",
    "engine kind": "dynlab.engine.kinds.EngineKind",
    "queue policy": "dynlab.engine.queues.QueuePolicy",
    "admission policy": "dynlab.engine.gateway.AdmissionPolicy",
    "controller": "dynlab.engine.controller.Controller",
}


def _dotted(cls_or_name: type | str) -> str:
    return cls_or_name if isinstance(cls_or_name, str) else f"{cls_or_name.__module__}.{cls_or_name.__qualname__}"


def _subclasses(cls: type, base: type | str) -> bool:
    """Whether ``cls`` subclasses ``base`` (a class, or a class's dotted name, found in ``cls``'s MRO)."""
    if not isinstance(base, str):
        return issubclass(cls, base)
    return any(_dotted(c) == base for c in cls.__mro__)


def _registry_function(kind: str) -> Callable[..., Registry]:
    fn, what = next((fn, what) for k, fn, what in KINDS if k == kind)

    def collect(pm: pluggy.PluginManager | None = None) -> Registry:
        return registry(kind, pm)

    collect.__name__ = collect.__qualname__ = fn
    collect.__doc__ = f"Every registered {what}: :func:`registry` of {kind!r}."
    return collect


def kinds() -> dict[str, Callable[[], Registry]]:
    """Every plugin kind: its name in ``dynlab plugins`` -> the function that collects its registry."""
    return {kind: globals()[fn] for kind, fn, _ in KINDS}


def distribution_version(source: str) -> str | None:
    """The installed version of the distribution ``source`` (an :attr:`Entry.source`), ``None`` when
    ``source`` is not an installed distribution (a plugin registered at run time)."""
    try:
        return importlib.metadata.version(source)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


strategies = _registry_function("strategy")
eviction_policies = _registry_function("eviction policy")
trace_formats = _registry_function("trace format")
latency_models = _registry_function("latency model")
scorers = _registry_function("scorer")
workloads = _registry_function("workload")
engine_kinds = _registry_function("engine kind")
queue_policies = _registry_function("queue policy")
admission_policies = _registry_function("admission policy")
controllers = _registry_function("controller")
