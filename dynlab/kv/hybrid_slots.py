"""A decode step's slots over KV cache groups in O(1): :class:`HybridSlots`, a base of
:class:`~dynlab.kv.hybrid.HybridKvCacheManager`.

The general path (:meth:`HybridSlots.grow`, vLLM 0.33's ``HybridKVCacheCoordinator``: each group's
``remove_skipped_blocks`` at the computed tokens, then its ``allocate_new_blocks``) walks every group on
every call. Most decode steps change nothing: the request's last block has room for the new token in every
group and no window drops a block. After each general call the manager keeps, per request, its *room*
``(lo, hi, limit, stop)``:

- ``lo``: the computed tokens of that call;
- ``hi``: the least :meth:`~dynlab.kv.groups.SlidingWindowGroup.next_drop` over the extra groups at ``lo``
  (a group's ``skipped`` and ``next_drop`` are constant on ``[c, next_drop(c))``: its rule);
- ``limit``: the most tokens every group's table holds now (full group ``len(keys) * block``, each extra
  group's :meth:`~dynlab.kv.groups.SlidingWindowGroup.room` of its table's end);
- ``stop``: ``min(len(keys) * block, hi)``, what :meth:`HybridSlots.free_slots_of` subtracts ``computed`` from
  (the full group's keys change only on the general path while a room is kept).

A room is kept only when every group has dropped all its blocks out of the window (``skip == skipped(lo)``).
Then, for ``computed < hi``, no group drops a block (``skipped`` never decreases), so a call for ``tokens <=
limit`` tokens would free and take nothing and return ``True``: :meth:`allocate_slots` returns that without
walking the groups. For ``lo <= computed < hi``, :meth:`free_slots_of` answers ``stop - computed`` (below
``lo`` a group's next drop may come sooner: the general answer). These are exactly the general path's
answers (``tests/engine/test_hybrid_slots.py`` drives both side by side). Anything else (a computed count
at or past ``hi``, more tokens than ``limit``, a request whose tables were replaced: every replacement
forgets its room, :meth:`forget_room`) takes the general path, which sets the room again.
"""
from __future__ import annotations

__all__ = ["HybridSlots"]


class HybridSlots:
    """The slots part of :class:`~dynlab.kv.hybrid.HybridKvCacheManager` (module docstring). Reads the
    manager's ``block``, ``extra`` (the extra groups), ``tables`` (request -> ``[[skip, keys], ...]``) and
    ``pool``; ``fast_slots`` (default ``True``): ``False`` keeps no room, every call on the general path
    (the differential tests' reference)."""

    fast_slots = True

    def forget_room(self, req) -> None:
        """Drop ``req``'s room (its tables were replaced or freed)."""
        self._room.pop(req, None)

    def free_slots_of(self, sched: list) -> list:
        """Tokens each request of ``sched`` can still decode before the pool changes: its full group's free
        slots, or fewer when a window group frees a block sooner (its next drop minus ``computed``)."""
        B, extra, rooms = self.block, self.extra, self._room
        out = []
        for r, _ in sched:
            c = r.computed
            room = rooms.get(r)
            if room is not None and room[0] <= c < room[1]:
                out.append(room[3] - c)
            else:
                out.append(min([len(r.keys) * B - c] + [g.next_drop(c) - c for g in extra]))
        return out

    def allocate_slots(self, req, tokens: int) -> bool:
        """Free blocks out of the windows, then grow every table to ``tokens`` tokens; ``False`` (nothing
        more taken) when the free queue cannot. O(1) inside the request's room (module docstring)."""
        room = self._room.get(req)
        if room is not None and req.computed < room[1] and tokens <= room[2]:  # (below lo: skipped is monotone)
            return True
        return self.grow(req, tokens)

    def grow(self, req, tokens: int) -> bool:
        """The general path of :meth:`allocate_slots` (every group walked); sets ``req``'s room."""
        self._drop_skipped(req)
        tables = self.tables[req]
        need = [g.blocks_needed(tokens) - t[0] - len(t[1]) for g, t in zip(self.extra, tables)]
        full = self.blocks_needed(tokens) - len(req.keys)
        total = max(full, 0) + sum(n for n in need if n > 0)
        ok = True
        if total > 0:
            pool = self.pool
            if total > pool.num_free:
                ok = False
            else:
                if full > 0:
                    req.keys += pool.allocate(full)
                for n, t in zip(need, tables):
                    if n > 0:
                        t[1] += pool.allocate(n)
        if self.fast_slots:
            self._set_room(req, tables)
        return ok

    def _set_room(self, req, tables) -> None:
        """Keep ``req``'s room after a general call (module docstring), or none when a group still holds a
        block out of its window."""
        c = req.computed
        hi = limit = None
        for g, (skip, keys) in zip(self.extra, tables):
            if skip != g.skipped(c):
                self._room.pop(req, None)
                return
            d, r = g.next_drop(c), g.room(skip + len(keys))
            hi = d if hi is None or d < hi else hi
            limit = r if limit is None or r < limit else limit
        end = len(req.keys) * self.block
        limit = end if limit is None or end < limit else limit
        if hi is None:
            self._room[req] = (c, float("inf"), limit, end)
        else:
            self._room[req] = (c, hi, limit, end if end < hi else hi)

    def _drop_skipped(self, req) -> None:
        """Free each window group's blocks that left the window at ``req.computed`` tokens. Each is a computed
        full block, which vLLM has hashed: all go to the free-queue tail (reversed), a generated token's
        block as an unnamed block in a named block's place (:meth:`_release_table`)."""
        for g, table in zip(self.extra, self.tables[req]):
            s = g.skipped(req.computed)
            d = min(s - table[0], len(table[1]))
            if d > 0:
                self._release_table(table[0], table[1][:d], req.nreg, table[0] + d)
                del table[1][:d]
                table[0] += d
