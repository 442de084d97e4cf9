"""Duplicate copies of a block: several cached blocks under one name, as vLLM 0.33.0 keeps them (issue 24 item 3).

vLLM's ``BlockPool.cached_block_hash_to_block`` (``vllm/v1/core/block_pool.py``, ``BlockHashToBlockMap``) maps
a block hash to every cached block holding that content: two requests that compute the same full block
(identical prompts admitted together, the second recomputing its last full block) both cache it, and
``cache_full_blocks`` does not de-duplicate (block tables stay append-only). The rules followed here:

- **Registering** a block whose name is already cached (any copy) caches it as one more copy, and publishes a
  ``BlockStored`` of the name again (vLLM's ``cache_full_blocks`` emits one per newly cached block).
- **A hit** takes the oldest cached copy (``get_one_block``: the first block of the hash's dict, insertion
  order), whether it is in use or free; the other copies are untouched.
- **Evicting** one copy (``_maybe_evict_cached_block``) publishes a ``BlockRemoved`` of the name and keeps the
  name findable while another copy is cached. The router's index counts copies
  (:class:`~dynlab.routing.index.KvIndex`), as Dynamo's does, so it forgets the block with its last copy.

Representation. A pool keys its blocks by name (one block per key), so a second copy gets an **alias**: a
fresh key from :data:`ALIAS_NAMES` up (above every trace-derived and KV-cache-group name, below the generated
tokens' :data:`~dynlab.kv.output_blocks.OUTPUT_NAMES`), an ordinary named block to the pool (its own place in
the free queue, its own reference count). :class:`Copies` (one per pool) records which keys hold a name:

- ``of``: name -> its copies' keys in registration order (the name itself among them when it holds a copy),
  only for names that have had a second copy; dead keys (evicted) are dropped when met (lazily);
- ``name``: alias -> the name it copies (an alias is never reused).

A pool's stored names are names (what ``BlockStored`` carries); its removed names may hold aliases until
:meth:`Copies.translate` (the KV cache manager calls it once per step's events) turns them into names.
Nothing changes, and nothing is paid but an empty-dict test, while no name has a second copy.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from dynlab.groups import GROUP_LOW, GROUP_SHIFT, set_bits

__all__ = ["ALIAS_NAMES", "Copies", "key_runs"]

#: the first alias key: above trace-derived names (< 2**74) and every KV cache group's (name + i * 2**64),
#: below the generated tokens' names (2**80), so aliases are published (once translated) and never met
ALIAS_NAMES = 1 << 77
_ALIAS_GROUP = ALIAS_NAMES >> GROUP_SHIFT
_ALIAS_END = (1 << 80) >> GROUP_SHIFT  # OUTPUT_NAMES' group (dynlab.kv.output_blocks, not imported: no circle)


class Copies:
    """Which keys hold each name that has had a second cached copy (module docstring)."""

    __slots__ = ("of", "name", "next")

    def __init__(self):
        self.of: dict = {}  # name -> keys of its copies, registration order (may hold dead keys)
        self.name: dict = {}  # alias -> name
        self.next = ALIAS_NAMES

    def first(self, name: int, contains: Callable[[int], bool]) -> Optional[int]:
        """The key of ``name``'s oldest cached copy (what a hit takes), ``None`` when none is cached;
        ``contains(key)``: whether the pool caches ``key``. Drops dead keys from :attr:`of`."""
        keys = self.of.get(name)
        if keys is None:
            return name if contains(name) else None
        if not contains(keys[0]):
            keys[:] = [k for k in keys if contains(k)]
            if len(keys) <= 1:  # one copy left (or none): no alias to follow any more, unless it is one
                if not keys or keys[0] == name:
                    del self.of[name]
                    return keys[0] if keys else None
        return keys[0]

    def extend_hit(self, names: Sequence[int], h: int, max_blocks: int, contains: Callable[[int], bool]) -> int:
        """A prefix hit of ``h`` leading ``names`` (in blocks) continued over the names cached only under an
        alias, up to ``max_blocks`` (and ``len(names)``); ``contains(key)``: whether the pool caches ``key``."""
        n = min(max_blocks, len(names))
        first = self.first
        while h < n and (contains(names[h]) or first(names[h], contains) is not None):
            h += 1
        return h

    def key_for(self, name: int, contains: Callable[[int], bool]) -> int:
        """The key a block newly registered as ``name`` gets: ``name`` when no copy of it is cached, else
        :meth:`add`'s (one more copy); ``contains`` as :meth:`first`."""
        return name if self.first(name, contains) is None else self.add(name, contains)

    def add(self, name: int, contains: Callable[[int], bool]) -> int:
        """The key for one more copy of ``name`` (some copy is cached): ``name`` itself when it holds no
        copy now, else a new alias; recorded after the copies cached before it."""
        keys = self.of.get(name)
        if keys is None:
            keys = self.of[name] = [name]  # only the name's own block held it
        if contains(name):
            key = self.next
            self.next += 1
            self.name[key] = name
        else:
            key = name
        keys.append(key)
        return key

    def pick(self, keys: List[int], contains: Callable[[int], bool]) -> bool:
        """Replace, in place, each name of ``keys`` (cached hits) that has copies with the key of its oldest
        cached copy; whether any key changed."""
        of = self.of
        if not of or of.keys().isdisjoint(keys):
            return False
        changed = False
        for i, name in enumerate(keys):
            if name in of:
                key = self.first(name, contains)
                if key != name:
                    keys[i] = key
                    changed = True
        return changed

    def translate(self, names: list, runs: Optional[list] = None,
                  contains: Optional[Callable[[int], bool]] = None) -> list:
        """``names`` (a pool's removed keys, changed in place) with each alias replaced by its name (and
        forgotten: an evicted alias is never met again); ``runs`` (their ``(group, mask)`` pairs, or
        ``None``) likewise, an alias's pair becoming its name's. With ``contains`` (the pool's), a name
        whose aliases are all gone leaves :attr:`of` (so that it stays small). Returns ``names``."""
        alias = self.name
        if not alias or not names:
            return names
        if contains is not None:
            for n in names:
                if n in alias:
                    self._forget(alias[n], contains)
        if runs is not None:
            out = []
            for g, mask in runs:
                if _ALIAS_GROUP <= g < _ALIAS_END:
                    for o in reversed(set_bits(mask)):  # highest first: a run pool's eviction order in a group
                        n = alias[(g << GROUP_SHIFT) + o]
                        out.append((n >> GROUP_SHIFT, 1 << (n & GROUP_LOW)))
                else:
                    out.append((g, mask))
            runs[:] = out
        pop = alias.pop
        names[:] = [pop(n) if n in alias else n for n in names]
        return names

    def _forget(self, name: int, contains: Callable[[int], bool]) -> None:
        """Drop ``name``'s dead keys; its entry too when no alias of it is cached."""
        keys = self.of.get(name)
        if keys is not None:
            keys[:] = [k for k in keys if contains(k)]
            if not keys or keys == [name]:
                del self.of[name]

    def check(self, cached: Callable[[int], bool]) -> None:
        """Assert (tests) that every cached alias is recorded under its name."""
        for key, name in self.name.items():
            if cached(key):
                assert key in self.of.get(name, ()), f"alias {key} of {name} not among its copies"


def key_runs(keys: Sequence[int]) -> list:
    """``keys`` as ``(first, count)`` runs of consecutive ascending keys within a group of 1024 (the
    :class:`~dynlab.kv.run_pool.Runs` of a holder's keys when some are aliases)."""
    runs: list = []
    for key in keys:
        if runs:
            first, c = runs[-1]
            if key == first + c and key >> GROUP_SHIFT == first >> GROUP_SHIFT:
                runs[-1] = (first, c + 1)
                continue
        runs.append((key, 1))
    return runs
