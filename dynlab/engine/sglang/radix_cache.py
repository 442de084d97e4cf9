"""SGLang's radix cache (``python/sglang/srt/mem_cache/radix_cache.py``, sglang 0.5.23) over dynlab's block names.

A tree of KV content shared by requests: a request matches its longest cached prefix, locks the path it
uses (``inc_lock_ref`` / ``dec_lock_ref``: a locked node is never evicted), and its computed tokens are
inserted when a prefill chunk ends (``cache_unfinished_req``) and when it finishes (``cache_finished_req``,
through ``release_kv_cache``). Eviction (``RadixCache.evict``) frees the least recently used unlocked
leaves, one after another, a parent becoming a candidate when its last child goes.

What dynlab knows of a request's content is its engine block names (the chained hashes the routers key
on, one per ``block`` tokens), so here a node is one block: a match, an insert and an eviction move whole
blocks, and each node holds ``block`` tokens of the token pool. SGLang compresses chains of tokens into
one node and evicts a whole node; with one node per block eviction is finer (never more than asked, to
the block). The LRU order is SGLang's ``last_access_time``, taken from a counter instead of the clock
(every match and insert touches its path, in order), so ties cannot happen.

The cache reports what it gains and loses as names: :meth:`insert` returns the names it stored (publish
them as ``BlockStored``), :meth:`evict` those it removed (``BlockRemoved``): the same names vLLM workers
publish, so every router reads SGLang workers as it reads vLLM ones.
"""
from __future__ import annotations

import heapq
from typing import Optional, Sequence

__all__ = ["Node", "RadixCache"]


class Node:
    """One cached block: its ``name``, ``parent``, ``children`` (name -> node), ``lock_ref`` (requests using it),
    ``last_access`` (the LRU counter when last matched or inserted)."""

    __slots__ = ("name", "parent", "children", "lock_ref", "last_access")

    def __init__(self, name, parent: Optional["Node"]):
        self.name, self.parent = name, parent
        self.children: dict = {}
        self.lock_ref = 0
        self.last_access = 0


class RadixCache:
    """The radix tree of one worker; ``block``: tokens per node. ``disable``: ``--disable-radix-cache``
    (SGLang's ``ChunkCache``: nothing is matched, inserted or evicted).

    Sizes in tokens: :attr:`total_size` (every node), :attr:`evictable_size` (nodes no request locks),
    :attr:`protected_size` (locked ones).
    """

    def __init__(self, block: int, disable: bool = False):
        self.block = block
        self.disable = disable
        self.root = Node(None, None)
        self.root.lock_ref = 1  # SGLang's root is always locked
        self.nodes = 0  # nodes besides the root
        self.locked_nodes = 0  # nodes with lock_ref > 0 (the root excluded)
        self._clock = 0
        # eviction candidates (last_access, node): unlocked leaves, checked when popped (SGLang keeps the set
        # evictable_leaves; a lazy heap gives the same LRU order without a walk of the tree per eviction)
        self._heap: list = []

    # -- sizes (tokens) -----------------------------------------------------------------
    @property
    def total_size(self) -> int:
        return self.nodes * self.block

    @property
    def evictable_size(self) -> int:
        return (self.nodes - self.locked_nodes) * self.block

    @property
    def protected_size(self) -> int:
        return self.locked_nodes * self.block

    # -- lookups ---------------------------------------------------------------------------
    def match_prefix(self, names: Sequence, limit: Optional[int] = None, touch: bool = True) -> tuple[int, Node]:
        """``(blocks matched, last node)``: the longest cached prefix of ``names`` (at most ``limit`` blocks);
        ``touch`` refreshes the path's LRU time, as SGLang's ``_match_prefix_helper`` does."""
        node = self.root
        if self.disable:
            return 0, node
        n = len(names) if limit is None else min(limit, len(names))
        stamp = self._tick() if touch else 0
        i = 0
        while i < n:
            child = node.children.get(names[i])
            if child is None:
                break
            node = child
            if touch:
                node.last_access = stamp
            i += 1
        if touch and i:
            self._candidate(node)
        return i, node

    def _candidate(self, node: Node) -> None:
        if not node.children and node.lock_ref == 0 and node is not self.root:
            heapq.heappush(self._heap, (node.last_access, id(node), node))

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # -- changes ---------------------------------------------------------------------------
    def insert(self, names: Sequence) -> tuple[list, Node]:
        """Insert ``names`` (a prefix chain); returns ``(names newly stored, the chain's last node)``."""
        node = self.root
        if self.disable:
            return [], node
        stamp = self._tick()
        stored = []
        for name in names:
            child = node.children.get(name)
            if child is None:
                child = node.children[name] = Node(name, node)
                self.nodes += 1
                stored.append(name)
            child.last_access = stamp
            node = child
        self._candidate(node)
        return stored, node

    def lock(self, node: Node) -> None:
        """``inc_lock_ref``: ``node`` and its ancestors are in use (never evicted)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.locked_nodes += 1
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        """``dec_lock_ref``: one user of ``node`` and its ancestors less."""
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.locked_nodes -= 1
                self._candidate(node)
            node = node.parent

    def evict(self, tokens: int) -> list:
        """Free at least ``tokens`` tokens (fewer when not enough is evictable) from the least recently used
        unlocked leaves (SGLang's ``evict`` with its LRU strategy); returns the names removed, in order."""
        if self.disable or tokens <= 0:
            return []
        heap, removed, freed = self._heap, [], 0
        while freed < tokens and heap:
            stamp, _, node = heapq.heappop(heap)
            if node.parent is None or node.children or node.lock_ref or node.last_access != stamp:
                continue  # gone, no longer a leaf, locked, or touched since (a newer entry stands for it)
            parent = node.parent
            del parent.children[node.name]
            node.parent = None
            self.nodes -= 1
            removed.append(node.name)
            freed += self.block
            if parent is not self.root:
                self._candidate(parent)
        if len(heap) > 4 * self.nodes + 64:  # drop stale entries now and then
            self._heap = [e for e in heap if e[2].parent is not None and e[2].last_access == e[0]]
            heapq.heapify(self._heap)
        return removed

    def check(self) -> None:
        """Assert the counters match the tree (tests)."""
        count = locked = 0
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            count += 1
            locked += node.lock_ref > 0
            assert node.lock_ref >= 0
            assert node.lock_ref >= sum(c.lock_ref for c in node.children.values())
            stack.extend(node.children.values())
        assert (count, locked) == (self.nodes, self.locked_nodes), (count, locked, self.nodes, self.locked_nodes)
