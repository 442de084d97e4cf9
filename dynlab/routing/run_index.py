"""``RunIndex``: :class:`~dynlab.routing.index.KvIndex` that works per run when KV events carry runs.

dynlab's engine names its blocks ``trace id * 1024 + offset`` (:mod:`dynlab.engine.names`), so the
~32 engine blocks of a trace block are one **group** ``name >> 10`` and travel together: stored by one
step, evicted by one release. When its pool works on runs (:mod:`dynlab.kv.run_pool`), the engine
says so in its events (``BlockStored.runs`` / ``BlockRemoved.runs``: ``(group, offset mask)`` pairs)
and in the request the router routes (``Request.runs``: ``(first name, count)``). A :class:`RunIndex`
then keeps, per group, one offset bitmask per worker, and an event or a ``find_matches`` costs a few
int operations per run instead of a dict operation per name.

Modes. A :class:`RunIndex` starts as a plain :class:`KvIndex` (**name mode**: names in a dict, every
method KvIndex's) and switches to **run mode** at the first GPU event that carries runs, moving what
it holds (ints only; a non-int name held keeps it in name mode). In run mode, events and queries
without runs are applied name by name on the groups (exact, slower); a stored non-int name, or the
set-semantics calls :meth:`apply_stored` / :meth:`apply_removed`, move it back to name mode. Either
way every answer (``find_matches``, holdings, copies, refusals and counters) is KvIndex's for the
same events: runs are a promise of the producer that they name exactly the event's ``hashes``.

Run mode's representation, ``_groups``: group -> ``{worker: offset mask, -1: K-full}``. Bit ``o`` of
a worker's mask: it holds name ``(group << 10) + o``. ``K-full`` (present only when non-zero): the
workers whose mask holds all of offsets ``0..K-1``; ``find_matches`` passes them through a run
``(offset 0, count <= K)`` without reading their masks, so a query costs O(runs + workers that leave
the match), not O(names). ``K`` is a hint (exact for any K): 32, the engine blocks per trace block
of dynlab's defaults (512-token Mooncake blocks, 16-token engine blocks). Copies are counted per
name in ``_copies``, as KvIndex does, and ``_copied``: ``(worker, group)`` -> the offsets with a copy
(a removal checks its names one by one only where it meets one: KV events lost make copies).
Lower tiers (medium not GPU) stay KvIndex's, by name.
"""
from __future__ import annotations

from typing import Hashable, Iterable, Optional, Sequence

from dynlab.groups import GROUP_LOW, GROUP_SHIFT
from dynlab.groups import set_bits as _offsets
from dynlab.routing.events import MEDIUM_GPU, BlockRemoved, BlockStored
from dynlab.routing.index import KvIndex, _workers

__all__ = ["RunIndex"]

_SHIFT, _LOW = GROUP_SHIFT, GROUP_LOW  # a group holds the names (group << 10) + 0 .. 1023


class RunIndex(KvIndex):
    """KvIndex keyed by runs when the events carry them (module docstring); the same answers.

    ``block_size``: as :class:`KvIndex`; ``k``: the K-full hint (module docstring, >= 1).
    Raises what :class:`KvIndex` raises.
    """

    __slots__ = ("_groups", "_km", "_copied")

    def __init__(self, block_size: Optional[int] = None, k: int = 32) -> None:
        super().__init__(block_size)
        self._groups: Optional[dict] = None  # None: name mode
        self._copied: dict = {}  # run mode: (worker, group) -> offset mask of the names with copies
        self._km = (1 << k) - 1

    # -- modes --------------------------------------------------------------------------------
    def _to_runs(self) -> bool:
        """Switch to run mode, moving the held names (False, no switch, when one is not an int)."""
        if not all(isinstance(h, int) for h in self._holders) or not all(isinstance(h, int) for _, h in self._copies):
            return False
        self._groups, copied = {}, self._copied
        for w, h in self._copies:
            copied[(w, h >> _SHIFT)] = copied.get((w, h >> _SHIFT), 0) | 1 << (h & _LOW)
        for h, mask in self._holders.items():
            for w in _workers(mask):
                self._store(w, ((h >> _SHIFT, 1 << (h & _LOW)),), False)
        self._holders = {}
        return True

    def _to_names(self) -> None:
        """Switch back to name mode, moving the held names."""
        holders = {}
        for g, offs in self._groups.items():
            for w, m in offs.items():
                if w >= 0:
                    for o in _offsets(m):
                        h = (g << _SHIFT) + o
                        holders[h] = holders.get(h, 0) | 1 << w
        self._groups, self._holders, self._copied = None, holders, {}

    # -- events -------------------------------------------------------------------------------
    def apply_event(self, event) -> bool:
        """:meth:`KvIndex.apply_event`, per run when the event carries runs (run mode)."""
        if self._groups is None and (getattr(event, "runs", None) is None or event.medium != MEDIUM_GPU
                                     or not self._to_runs()):
            return KvIndex.apply_event(self, event)
        kind = event.__class__
        if kind is BlockRemoved and event.medium == MEDIUM_GPU:
            w, runs = event.worker, event.runs
            if type(w) is not int or w < 0:
                self._bit(w)  # raises ValueError
            if runs is None:
                if not all(isinstance(h, int) for h in event.hashes):
                    self._to_names()  # (a copy of a name that is not an int may be left to drop)
                    return KvIndex.apply_event(self, event)
                runs = [(h >> _SHIFT, 1 << (h & _LOW)) for h in event.hashes]
            self._remove(w, runs)
            return True
        if kind is BlockStored and event.medium == MEDIUM_GPU:
            return self._apply_stored_runs(event)
        return KvIndex.apply_event(self, event)  # lower tiers, AllBlocksCleared (clear), not an event

    def _apply_stored_runs(self, event: BlockStored) -> bool:
        """A GPU ``BlockStored`` in run mode: KvIndex's checks and counters, then the runs."""
        if not self._sized(event):
            return False
        bit = self._bit(event.worker)
        parent = event.parent_block_hash
        if parent is not None and not (isinstance(parent, int) and self._mask(event.worker, parent) & bit):
            self.refused_parent += 1
            return False
        runs = event.runs
        if runs is None:
            if not all(isinstance(h, int) for h in event.hashes):
                self._to_names()
                return KvIndex._store_names(self, event.worker, event.hashes, parent)  # (the parent check again: the same holdings)
            runs = [(h >> _SHIFT, 1 << (h & _LOW)) for h in event.hashes]
        self._store(event.worker, runs, True)
        return True

    def _mask(self, worker: int, name: int) -> int:
        """``1 << worker`` when ``worker`` holds ``name`` (run mode), else 0."""
        offs = self._groups.get(name >> _SHIFT)
        return 0 if offs is None else (offs.get(worker, 0) >> (name & _LOW) & 1) << worker

    def _store(self, w: int, runs: Iterable[tuple], copies: bool) -> None:
        """Worker ``w`` stores the ``(group, mask)`` pairs in order; names it holds already add a
        copy each when ``copies`` (KvIndex.apply_event's rule), else nothing (set semantics)."""
        groups, km, bit = self._groups, self._km, 1 << w
        get = groups.get
        for g, bits in runs:
            offs = get(g)
            if offs is None:
                groups[g] = {w: bits, -1: bit} if bits & km == km else {w: bits}
                continue
            m = offs.get(w, 0)
            if m & bits and copies:
                self._add_copies(w, g, m & bits)
            nm = m | bits
            offs[w] = nm
            if nm & km == km and m & km != km:
                offs[-1] = offs.get(-1, 0) | bit

    def _add_copies(self, w: int, g: int, dup: int) -> None:
        """One copy more of each name ``dup`` (offset mask) of group ``g`` at worker ``w``."""
        self._copied[(w, g)] = self._copied.get((w, g), 0) | dup
        copies = self._copies
        for o in _offsets(dup):
            key = (w, (g << _SHIFT) + o)
            copies[key] = copies.get(key, 0) + 1

    def _remove(self, w: int, runs: Iterable[tuple]) -> None:
        """Worker ``w`` drops the ``(group, mask)`` pairs in order: a name with copies loses a copy
        instead (KvIndex's rule); names it does not hold are ignored."""
        groups, km, bit, copied = self._groups, self._km, 1 << w, self._copied
        for g, bits in runs:
            if copied:
                bits = self._drop_copies(w, g, bits)
            offs = groups.get(g)
            if offs is None:
                continue
            m = offs.get(w, 0)
            nm = m & ~bits
            if nm == m:
                continue
            if m & km == km and nm & km != km:
                x = offs[-1] & ~bit
                if x:
                    offs[-1] = x
                else:
                    del offs[-1]
            if nm:
                offs[w] = nm
            else:
                del offs[w]
                if not offs:
                    del groups[g]

    def _drop_copies(self, w: int, g: int, bits: int) -> int:
        """``bits`` less the names of group ``g`` that had a copy at worker ``w`` (one copy less each)."""
        cm = self._copied.get((w, g), 0)
        if not cm & bits:
            return bits
        copies = self._copies
        for o in _offsets(cm & bits):
            key = (w, (g << _SHIFT) + o)
            n = copies[key]
            bits ^= 1 << o
            if n > 1:
                copies[key] = n - 1
            else:
                del copies[key]
                cm ^= 1 << o
        if cm:
            self._copied[(w, g)] = cm
        else:
            del self._copied[(w, g)]
        return bits

    def apply_stored(self, worker: int, hashes: Iterable[Hashable]) -> None:
        """:meth:`KvIndex.apply_stored` (set semantics; in run mode, back to name mode first)."""
        if self._groups is not None:
            self._to_names()
        KvIndex.apply_stored(self, worker, hashes)

    def apply_removed(self, worker: int, hashes: Iterable[Hashable]) -> None:
        """:meth:`KvIndex.apply_removed` (in run mode, back to name mode first)."""
        if self._groups is not None:
            self._to_names()
        KvIndex.apply_removed(self, worker, hashes)

    def clear(self, worker: int) -> None:
        """:meth:`KvIndex.clear`."""
        if self._groups is None:
            return KvIndex.clear(self, worker)
        KvIndex.clear(self, worker)  # checks the worker; lower tiers and copies (_holders is empty)
        self._copied = {k: m for k, m in self._copied.items() if k[0] != worker}
        self._remove(worker, [(g, offs[worker]) for g, offs in self._groups.items() if worker in offs])

    # -- reading ------------------------------------------------------------------------------
    def holders(self, block: Hashable) -> frozenset:
        """:meth:`KvIndex.holders`."""
        if self._groups is None or not isinstance(block, int):
            return KvIndex.holders(self, block)
        offs = self._groups.get(block >> _SHIFT) or {}
        o = block & _LOW
        return frozenset(w for w, m in offs.items() if w >= 0 and m >> o & 1)

    def blocks(self, worker: int) -> frozenset:
        """:meth:`KvIndex.blocks`."""
        if self._groups is None:
            return KvIndex.blocks(self, worker)
        self._bit(worker)
        return frozenset((g << _SHIFT) + o for g, offs in self._groups.items() for o in _offsets(offs.get(worker, 0)))

    def __len__(self) -> int:
        """:meth:`KvIndex.__len__`."""
        if self._groups is None:
            return len(self._holders)
        n = 0
        for offs in self._groups.values():
            u = 0
            for w, m in offs.items():
                if w >= 0:
                    u |= m
            n += u.bit_count()
        return n

    def find_matches(self, hashes: Sequence[Hashable], runs: Optional[Sequence[tuple]] = None) -> dict:
        """:meth:`KvIndex.find_matches`; ``runs``: the same names as ``(first name, count)`` runs in
        prompt order (names ``first .. first + count - 1``; ``Request.runs``), used in run mode."""
        if self._groups is None:
            return KvIndex.find_matches(self, hashes)
        if runs is None:
            runs = []
            for h in hashes:
                if not isinstance(h, int):
                    break  # no one holds it in run mode: the match ends here
                runs.append((h, 1))
        return self._find_runs(runs)

    def _find_runs(self, runs: Iterable[tuple]) -> dict:
        """Worker -> leading names held, walking ``(first, count)`` runs (see :meth:`find_matches`)."""
        get, km = self._groups.get, self._km
        scores: dict = {}
        depth = 0
        active = -1  # the workers still matching (-1: before the first run)
        for f, c in runs:
            offs = get(f >> _SHIFT)
            if offs is None:
                break
            o = f & _LOW
            need = ((1 << c) - 1) << o
            if o == 0 and need & km == need:
                sure = offs.get(-1, 0)  # they hold the whole run
                if active == -1:
                    full, rest = sure, [w for w in offs if w >= 0 and not sure >> w & 1]
                else:
                    full, rest = active & sure, _workers(active & ~sure)
            else:
                full, rest = 0, ([w for w in offs if w >= 0] if active == -1 else _workers(active))
            for w in rest:
                m = offs.get(w, 0)
                if m & need == need:
                    full |= 1 << w
                else:
                    m >>= o
                    lead = (m ^ (m + 1)).bit_length() - 1  # names of the run it holds, from the first
                    if depth + lead:
                        scores[w] = depth + lead
            depth += c
            active = full
            if not active:
                return scores
        if active > 0:
            for w in _workers(active):
                scores[w] = depth
        return scores
