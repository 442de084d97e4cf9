"""SGLang's radix cache (``python/sglang/srt/mem_cache/radix_cache.py``, sglang 0.5.23) over dynlab's block names.

A tree of KV content shared by requests: a request matches its longest cached prefix, locks the path it
uses (``inc_lock_ref`` / ``dec_lock_ref``: a locked node is never evicted), and its computed tokens are
inserted when a prefill chunk ends (``cache_unfinished_req``) and when it finishes (``cache_finished_req``,
through ``release_kv_cache``). Eviction (``RadixCache.evict``) frees the least recently used unlocked
leaves, one after another, a parent becoming a candidate when its last child goes.

What dynlab knows of a request's content is its engine block names (the chained hashes the routers key
on, one per ``block`` tokens), so a match, an insert and an eviction move whole blocks, and each block
holds ``block`` tokens of the token pool. The tree keeps one :class:`Node` per block, grouped into
*segments*, SGLang's nodes: a chain of blocks inserted together is one segment until a branch or a match
ending inside it splits it (``_split_node``). SGLang's LRU works on those: a match or insert refreshes the
whole of every segment it enters (``_match_prefix_helper`` touches a node before splitting it; the split-off
prefix is newer, a node made now), and eviction frees the least recently used leaf segment whole. The LRU
order is ``last_access_time``, here a counter ticked where SGLang reads the clock, so ties cannot happen.

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
    ``head`` (the first block of its segment); a head also keeps the segment's ``end`` (its last block) and
    ``last_access`` (the LRU counter when the segment was last matched or inserted)."""

    __slots__ = ("name", "parent", "children", "lock_ref", "last_access", "head", "end")

    def __init__(self, name, parent: Optional["Node"]):
        self.name, self.parent = name, parent
        self.children: dict = {}
        self.lock_ref = 0
        self.last_access = 0
        self.head = self.end = self


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
        # eviction candidates (last_access, head): leaf segments, checked when popped (SGLang keeps the set
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

    def cached_names(self) -> set:
        """Every block name the tree holds (a walk of it: for checks and tests, not the hot path)."""
        out, stack = set(), list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.add(node.name)
            stack.extend(node.children.values())
        return out

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # -- segments ------------------------------------------------------------------------
    @staticmethod
    def _members(head: Node) -> list:
        out, node = [head], head
        while node is not head.end:
            (node,) = node.children.values()
            out.append(node)
        return out

    def _split(self, node: Node, stamp: int) -> None:
        """End ``node``'s segment at ``node`` (SGLang's ``_split_node``): the blocks after it become a segment of
        their own keeping ``stamp``; the part up to ``node`` is newer (a node SGLang makes now)."""
        head = node.head
        if node is head.end:
            return
        (tail,) = node.children.values()
        tail.end, tail.last_access = head.end, stamp
        for member in self._members(tail):
            member.head = tail
        head.end, head.last_access = node, self._tick()
        self._candidate(tail)

    def _candidate(self, head: Node) -> None:
        if head is not self.root and not head.end.children and head.lock_ref == 0:
            heapq.heappush(self._heap, (head.last_access, id(head), head))

    # -- lookups ---------------------------------------------------------------------------
    def match_prefix(self, names: Sequence, limit: Optional[int] = None, touch: bool = True) -> tuple[int, Node]:
        """``(blocks matched, last node)``: the longest cached prefix of ``names`` (at most ``limit`` blocks).
        ``touch`` (SGLang's ``match_prefix``): refresh every segment entered and split the last one where the
        match ends; without it (what a router or a metric asks) nothing changes."""
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
            if touch and child.head is child:
                child.last_access = stamp
            node = child
            i += 1
        if touch and i:
            self._split(node, stamp)
            self._candidate(node.head)
        return i, node

    # -- changes ---------------------------------------------------------------------------
    def insert(self, names: Sequence) -> tuple[list, Node]:
        """Insert ``names`` (a prefix chain); returns ``(names newly stored, the chain's last node)``. The new
        blocks are one segment; a branch from inside a segment splits it."""
        node = self.root
        if self.disable:
            return [], node
        stamp = self._tick()
        i = 0
        while i < len(names) and (child := node.children.get(names[i])) is not None:
            if child.head is child:
                child.last_access = stamp
            node, i = child, i + 1
        if node is not self.root:  # the chain ends, or branches, inside a segment: split it there
            self._split(node, stamp)
        stored = list(names[i:])
        if stored:
            head, parent = None, node
            for name in stored:
                child = parent.children[name] = Node(name, parent)
                if head is None:
                    head = child
                child.head = head
                parent = child
            head.end, head.last_access = parent, self._tick()
            self.nodes += len(stored)
            node = parent
            self._candidate(head)
        elif node is not self.root:
            self._candidate(node.head)
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
                if node.head is node:
                    self._candidate(node)
            node = node.parent

    def evict(self, tokens: int) -> list:
        """Free at least ``tokens`` tokens (fewer when not enough is evictable): the least recently used
        unlocked leaf segments, whole (SGLang's ``evict`` with its LRU strategy); returns the names removed,
        each segment's deepest block first."""
        if self.disable or tokens <= 0:
            return []
        heap, removed, freed = self._heap, [], 0
        while freed < tokens and heap:
            stamp, _, head = heapq.heappop(heap)
            if head.parent is None or head.head is not head or head.end.children or head.lock_ref \
                    or head.last_access != stamp:
                continue  # gone, split, not a leaf, locked, or touched since (a newer entry stands for it)
            members = self._members(head)
            parent = head.parent
            del parent.children[head.name]
            for member in members:
                member.parent = None
            self.nodes -= len(members)
            removed += [m.name for m in reversed(members)]
            freed += self.block * len(members)
            if parent is not self.root:
                self._candidate(parent.head)
        if len(heap) > 4 * self.nodes + 64:  # drop stale entries now and then
            self._heap = [e for e in heap if e[2].parent is not None and e[2].head is e[2]]
            heapq.heapify(self._heap)
        return removed

    def check(self) -> None:
        """Assert the counters and segments match the tree (tests)."""
        count = locked = 0
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            count += 1
            locked += node.lock_ref > 0
            assert node.lock_ref >= sum(c.lock_ref for c in node.children.values()) >= 0
            head = node.head
            assert head.head is head and node in self._members(head)
            assert node is head.end or len(node.children) == 1
            stack.extend(node.children.values())
        assert (count, locked) == (self.nodes, self.locked_nodes), (count, locked, self.nodes, self.locked_nodes)
