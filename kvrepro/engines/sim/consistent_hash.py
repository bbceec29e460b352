"""vllm-router's `consistent_hash` policy: which instance a session's turns go to.

The twin's session-affinity router follows the real one, so that each instance gets the
sessions, hence the load, it gets live. What vllm-router does (`src/policies/
consistent_hash.rs` and `hash_key.rs` of vllm-project/router, the `vllm-router==0.1.17`
wheel the live fleet runs; checked against every session of the live session-affinity
runs, tests/engines/sim/test_consistent_hash.py):

* the key of a request is `header:<name>:<value>` for the first session header it carries,
  the name lower-cased (`x-session-id` first: the live client sends `SESSION_HEADER`);
* a key's position on the ring is mcrouter's `furc_hash` of the key's bytes modulo
  2^23 - 1 (bits drawn from MurmurHash64A and its rehash, seed 4193360111), spread over
  64 bits by MurmurHash64A of that number's four little-endian bytes;
* every worker URL has 160 virtual nodes, `<url>:<i>` placed the same way (a later node on
  an equal position replaces the earlier, as a BTreeMap insert does); a key goes to the
  first node at or after its position, the first node of the ring past its end.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from kvrepro.fleet_spec import SESSION_HEADER

VIRTUAL_NODES = 160
"""Virtual nodes per worker on vllm-router's ring (`VIRTUAL_NODES_PER_WORKER`)."""
SEED = 4193360111
"""mcrouter's hash seed, used by the bit source and the final spread."""
FURC_MODULUS = (1 << 23) - 1
"""The furc hash's modulus vllm-router asks for (its largest)."""
_MASK = (1 << 64) - 1
_MULT = 0xC6A4A7935BD1E995
_SHIFT = 47
_FURC_SHIFT = 23
_FURC_TRIES = 32


def _mix(k: int) -> int:
    k = (k * _MULT) & _MASK
    k ^= k >> _SHIFT
    return (k * _MULT) & _MASK


def _finish(h: int) -> int:
    h ^= h >> _SHIFT
    h = (h * _MULT) & _MASK
    return h ^ (h >> _SHIFT)


def murmur64a(data: bytes, seed: int) -> int:
    """MurmurHash64A of `data` (little-endian words; the tail's bytes as one word)."""
    h = (seed ^ (len(data) * _MULT)) & _MASK
    whole = len(data) - len(data) % 8
    for i in range(0, whole, 8):
        h = ((h ^ _mix(int.from_bytes(data[i:i + 8], "little"))) * _MULT) & _MASK
    if whole < len(data):
        h = ((h ^ int.from_bytes(data[whole:], "little")) * _MULT) & _MASK
    return _finish(h)


def _rehash(k: int) -> int:
    """MurmurHash64A of one 64-bit word, `SEED`: the furc hash's next 64 bits."""
    h = (SEED ^ (8 * _MULT)) & _MASK
    return _finish(((h ^ _mix(k)) * _MULT) & _MASK)


class _Bits:
    """The furc hash's bit stream of one key: bit i of the i // 64-th hash of the chain
    murmur64a(key), rehash(previous), ..."""

    def __init__(self, key: bytes):
        self.words = [murmur64a(key, SEED)]

    def __call__(self, index: int) -> int:
        while len(self.words) <= index >> 6:
            self.words.append(_rehash(self.words[-1]))
        return (self.words[index >> 6] >> (index & 63)) & 1


def furc_hash(key: bytes, modulus: int) -> int:
    """mcrouter's furc hash of `key` into [0, modulus): a consistent hash whose value moves
    for few keys when the modulus changes."""
    if modulus <= 1:
        return 0
    bit = _Bits(key)
    depth = (modulus - 1).bit_length()
    index = depth
    for _ in range(_FURC_TRIES):
        while not bit(index):
            if depth == 0:
                return 0
            depth -= 1
            index = depth
        index += _FURC_SHIFT
        value = 1
        for _ in range(max(depth - 1, 0)):
            value = (value << 1) | bit(index)
            index += _FURC_SHIFT
        if value < modulus:
            return value
    return 0


def ring_position(key: str) -> int:
    """Where vllm-router places `key` on its ring (its `fbi_hash`)."""
    return murmur64a(furc_hash(key.encode(), FURC_MODULUS).to_bytes(4, "little"), SEED)


def session_key(session_id: int) -> str:
    """The key vllm-router hashes for a turn whose `SESSION_HEADER` is the session id."""
    return f"header:{SESSION_HEADER.lower()}:{int(session_id)}"


class HashRing:
    """vllm-router's ring of `worker_urls`: `instance(key)` is the index of the worker the
    key goes to."""

    def __init__(self, worker_urls: Sequence[str], virtual_nodes: int = VIRTUAL_NODES):
        if not worker_urls:
            raise ValueError("parameter 'worker_urls' is empty: a ring needs a worker")
        nodes: dict[int, int] = {}
        for instance, url in enumerate(worker_urls):
            for i in range(virtual_nodes):
                nodes[ring_position(f"{url}:{i}")] = instance
        self.positions = sorted(nodes)
        self.instances = [nodes[p] for p in self.positions]

    def instance(self, key: str) -> int:
        at = bisect.bisect_left(self.positions, ring_position(key))
        return self.instances[at % len(self.positions)]


__all__ = ["FURC_MODULUS", "HashRing", "SEED", "VIRTUAL_NODES", "furc_hash", "murmur64a",
           "ring_position", "session_key"]
