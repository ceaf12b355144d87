"""Prefix-cache locality hint: which replica last served a prompt with this beginning.

Engines keep recently used prefixes in their KV cache (vLLM's prefix caching). The router remembers
(bounded, least recently used first out) which replica served each prompt start, and placement counts
those tokens as already computed on that replica, making it cheaper there. Pods that report their own
cache contents could replace this estimate.
"""

from __future__ import annotations

from collections import OrderedDict

from jitserve.router.inbound import CHARS_PER_TOKEN, PREFIX_CHARS


class PrefixIndex:
    def __init__(self, max_entries: int = 50_000) -> None:
        self.max_entries = max_entries
        self._where: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._where)

    def cached_tokens(
        self, prefix_key: str | None, replica_names: list[str], input_len: int
    ) -> list[int] | None:
        if prefix_key is None:
            return None
        name = self._where.get(prefix_key)
        if name is None or name not in replica_names:
            return None
        hit = min(input_len, int(PREFIX_CHARS / CHARS_PER_TOKEN))
        return [hit if n == name else 0 for n in replica_names]

    def served(self, prefix_key: str | None, replica_name: str) -> None:
        if prefix_key is None or self.max_entries <= 0:
            return
        self._where[prefix_key] = replica_name
        self._where.move_to_end(prefix_key)
        while len(self._where) > self.max_entries:
            self._where.popitem(last=False)
