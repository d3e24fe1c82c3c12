"""Hash kernels shared by the engine (NumPy over Arrow batches) and the client (plain Python).

Every function here is exact: golden tests pin its outputs, and the engine and ``rebalancer.client`` call the
same code so the two can never disagree. NumPy kernels work on whole arrays with wrapping unsigned arithmetic;
the scalar helpers are thin wrappers over the same kernels (or over ``mmh3`` for variable-length byte keys).

Contents:
- MurmurHash3 x86_32 of one 4-byte little-endian block with a per-element seed (rendezvous weights).
- MurmurHash3 x86_32 / x64_128 of arbitrary bytes (keys, node seeds, partition stamps) via ``mmh3``.
- Java ``String.hashCode`` (UTF-16 code units) and ``java.util.UUID.hashCode``.
- Thomas Wang's 64-bit mix as used by Apache Ignite's ``RendezvousAffinityFunction``.
- Spark SQL's ``xxhash64`` (XXH64, seed 42, chained over its arguments) of ints, longs and strings: what
  ``rebalancer.generate`` builds a cluster's sizes from, so the driver builds the rows Spark builds.
"""

from __future__ import annotations

import uuid

import mmh3
import numpy as np
import numpy.typing as npt

__all__ = [
    "java_string_hash",
    "java_uuid_hash",
    "murmur3_32",
    "murmur3_32_u32_block",
    "murmur3_x64_128_first_signed",
    "spark_xxhash64",
    "spark_xxhash64_ints",
    "to_signed32",
    "wang_mix64",
]

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_M5 = np.uint32(5)
_N = np.uint32(0xE6546B64)
_F1 = np.uint32(0x85EBCA6B)
_F2 = np.uint32(0xC2B2AE35)
_MASK32 = 0xFFFFFFFF


def _rotl32(x: npt.NDArray[np.uint32], r: int) -> npt.NDArray[np.uint32]:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def murmur3_32_u32_block(
    values: npt.ArrayLike, seeds: npt.ArrayLike
) -> npt.NDArray[np.uint32]:
    """MurmurHash3 x86_32 of each value as a 4-byte little-endian key, with a seed per element.

    Equal to ``mmh3.hash(int(v).to_bytes(4, "little"), seed, signed=False)``. ``values`` and ``seeds`` broadcast
    against each other (e.g. partitions as a column, node seeds as a row gives a partitions x nodes matrix).

    Args:
        values: unsigned 32-bit keys (anything NumPy can cast to ``uint32``).
        seeds: unsigned 32-bit seeds.

    Returns:
        The unsigned 32-bit hashes, broadcast shape of the inputs.
    """
    k = np.asarray(values).astype(np.uint32, copy=False)
    h = np.asarray(seeds).astype(np.uint32, copy=False)
    with np.errstate(over="ignore"):
        k = k * _C1
        k = _rotl32(k, 15)
        k = k * _C2
        h = h ^ k
        h = _rotl32(h, 13)
        h = h * _M5 + _N
        h = h ^ np.uint32(4)  # total length in bytes
        h = h ^ (h >> np.uint32(16))
        h = h * _F1
        h = h ^ (h >> np.uint32(13))
        h = h * _F2
        h = h ^ (h >> np.uint32(16))
    return h


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86_32 of ``data`` as an unsigned 32-bit int (``seed`` taken modulo 2^32)."""
    return int(mmh3.hash(data, seed & _MASK32, signed=False))


def murmur3_x64_128_first_signed(data: bytes, seed: int = 0) -> int:
    """First signed 64-bit half of MurmurHash3 x64_128 (``mmh3.hash64(data, seed)[0]``)."""
    return int(mmh3.hash64(data, seed & _MASK32, signed=True)[0])


def to_signed32(value: int) -> int:
    """Reinterpret the low 32 bits of ``value`` as a Java ``int``."""
    value &= _MASK32
    return value - (1 << 32) if value >= 1 << 31 else value


def java_string_hash(text: str) -> int:
    """Java ``String.hashCode()``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code units, as a signed int."""
    units = text.encode("utf-16-le")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] | (units[i + 1] << 8))) & _MASK32
    return to_signed32(h)


def java_uuid_hash(text: str) -> int:
    """Java ``UUID.hashCode()`` of a canonical UUID string.

    Java: ``hilo = msb ^ lsb; return (int) (hilo >> 32) ^ (int) hilo``.
    """
    value = uuid.UUID(text).int
    msb, lsb = value >> 64, value & ((1 << 64) - 1)
    hilo = msb ^ lsb
    return to_signed32((hilo >> 32) ^ hilo)


def wang_mix64(keys: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Thomas Wang's 64-bit integer mix, exactly as Ignite's ``RendezvousAffinityFunction.hash``.

    Java: ``key = (~key) + (key << 21); key ^= key >>> 24; key += (key << 3) + (key << 8); key ^= key >>> 14;
    key += (key << 2) + (key << 4); key ^= key >>> 28; key += key << 31;`` on a signed ``long`` with wrapping.
    Computed here on ``uint64`` (same bits; ``>>>`` is the logical shift), returned as signed ``int64``.

    Args:
        keys: signed 64-bit keys, e.g. ``(hash & 0xFFFFFFFF) | (partition << 32)``.
    """
    k = np.asarray(keys, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        k = (~k) + (k << np.uint64(21))
        k = k ^ (k >> np.uint64(24))
        k = k + (k << np.uint64(3)) + (k << np.uint64(8))
        k = k ^ (k >> np.uint64(14))
        k = k + (k << np.uint64(2)) + (k << np.uint64(4))
        k = k ^ (k >> np.uint64(28))
        k = k + (k << np.uint64(31))
    return k.view(np.int64)


# ---- Spark SQL's xxhash64 (org.apache.spark.sql.catalyst.expressions.XXH64) ----
_P1, _P2, _P3, _P4, _P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                           0x27D4EB2F165667C5)
_MASK64 = (1 << 64) - 1
SPARK_XXHASH64_SEED = 42


def _rotl64(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK64


def _fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * _P2) & _MASK64
    h ^= h >> 29
    h = (h * _P3) & _MASK64
    return h ^ (h >> 32)


def _xxh64_bytes(data: bytes, seed: int) -> int:
    """XXH64 of ``data`` (unsigned seed and result), as Spark's ``hashUnsafeBytes``."""
    n, h, i = len(data), 0, 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _MASK64, (seed + _P2) & _MASK64, seed, (seed - _P1) & _MASK64]
        while i <= n - 32:
            for j in range(4):
                lane = int.from_bytes(data[i:i + 8], "little")
                v[j] = (_rotl64((v[j] + lane * _P2) & _MASK64, 31) * _P1) & _MASK64
                i += 8
        h = (_rotl64(v[0], 1) + _rotl64(v[1], 7) + _rotl64(v[2], 12) + _rotl64(v[3], 18)) & _MASK64
        for lane in v:
            h = ((h ^ (_rotl64((lane * _P2) & _MASK64, 31) * _P1 & _MASK64)) * _P1 + _P4) & _MASK64
    else:
        h = (seed + _P5) & _MASK64
    h = (h + n) & _MASK64
    while i <= n - 8:
        k = (_rotl64((int.from_bytes(data[i:i + 8], "little") * _P2) & _MASK64, 31) * _P1) & _MASK64
        h = (_rotl64(h ^ k, 27) * _P1 + _P4) & _MASK64
        i += 8
    if i <= n - 4:
        h = (_rotl64(h ^ ((int.from_bytes(data[i:i + 4], "little") * _P1) & _MASK64), 23) * _P2 + _P3) & _MASK64
        i += 4
    while i < n:
        h = (_rotl64(h ^ ((data[i] * _P5) & _MASK64), 11) * _P1) & _MASK64
        i += 1
    return _fmix64(h)


def spark_xxhash64(values: list[int | str], seed: int = SPARK_XXHASH64_SEED) -> int:
    """``xxhash64(v1, v2, ...)`` of Spark SQL literals (signed, as Spark returns it): each value hashed with the
    previous hash as its seed. A Python int is an ``int`` literal when it fits in 32 bits, else a ``bigint`` (as
    ``F.lit`` types it); a str is hashed as its UTF-8 bytes."""
    h = seed & _MASK64
    for value in values:
        if isinstance(value, str):
            h = _xxh64_bytes(value.encode(), h)
        elif -(1 << 31) <= value < (1 << 31):
            h = _fmix64((_rotl64(((h + _P5 + 4) & _MASK64) ^ (((value & 0xFFFFFFFF) * _P1) & _MASK64), 23) * _P2
                         + _P3) & _MASK64)
        else:
            h = _xxh64_bytes((value & _MASK64).to_bytes(8, "little"), h)
    return h - (1 << 64) if h >> 63 else h


def spark_xxhash64_ints(values: npt.ArrayLike, seeds: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Spark's xxhash64 step of an ``int`` column: each 32-bit value hashed with its row's seed (the hash of the
    arguments before it, signed as :func:`spark_xxhash64` returns it)."""
    v = np.asarray(values, dtype=np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    h = np.asarray(seeds, dtype=np.int64).astype(np.uint64)
    h = (h + np.uint64(_P5) + np.uint64(4)) ^ (v * np.uint64(_P1))
    h = ((h << np.uint64(23)) | (h >> np.uint64(41))) * np.uint64(_P2) + np.uint64(_P3)
    h ^= h >> np.uint64(33)
    h *= np.uint64(_P2)
    h ^= h >> np.uint64(29)
    h *= np.uint64(_P3)
    h ^= h >> np.uint64(32)
    return h.view(np.int64)
