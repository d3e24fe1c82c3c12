"""Key -> partition (SPEC 4, exact): golden vectors per partitioner, and scalar == NumPy kernel == Spark column.

Expected values are computed here independently of the code under test: ``mmh3`` + ``struct`` for the byte
layouts, and direct transcriptions of the Java sources (``String/Integer/Long/UUID.hashCode``, Ignite's
``calculatePartition``, Hazelcast's ``hashToIndex``). Pinned literals must be reproduced byte-for-byte by any
refactor.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

import mmh3
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.affinity import partitioners as P
from rebalancer.affinity.partitioners import key_hash, partition_of, partitions_of

PARTITIONERS = ("murmur3", "ignite", "hazelcast")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
HZ_SEED = 0x01000193


# ---------------------------------------------------------------------------------------------------------------
# Independent reference implementations (transcribed from the Java sources, not from rebalancer)
# ---------------------------------------------------------------------------------------------------------------


def signed32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - 2**32 if x >= 2**31 else x


def java_string_hash(s: str) -> int:
    """java.lang.String.hashCode: h = 31*h + c over the UTF-16 chars (big-endian pairs of bytes here)."""
    raw = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(raw), 2):
        h = (31 * h + int.from_bytes(raw[i : i + 2], "big")) & 0xFFFFFFFF
    return signed32(h)


def java_long_hash(v: int) -> int:
    """java.lang.Long.hashCode: (int)(value ^ (value >>> 32))."""
    u = v & 0xFFFFFFFFFFFFFFFF
    return signed32(u ^ (u >> 32))


def java_uuid_hash(u: uuid.UUID) -> int:
    """java.util.UUID.hashCode: hilo = msb ^ lsb; (int)(hilo >> 32) ^ (int) hilo."""
    msb, lsb = u.int >> 64, u.int & (2**64 - 1)
    hilo = msb ^ lsb
    return signed32((hilo >> 32) ^ hilo)


def java_rem(a: int, b: int) -> int:
    """Java's % (truncated division: the result takes the dividend's sign)."""
    q = abs(a) // abs(b)
    return a - b * (q if (a >= 0) == (b >= 0) else -q)


def ignite_rule(h: int, parts: int) -> int:
    """apache/ignite modules/commons/.../RendezvousAffinityFunctionHelper.calculatePartition (+ calculateMask)."""
    mask = parts - 1 if parts & (parts - 1) == 0 else -1
    if mask >= 0:
        hu = h & 0xFFFFFFFF
        return signed32(hu ^ (hu >> 16)) & mask
    r = java_rem(h, parts)
    a = abs(r) if r != INT32_MIN else INT32_MIN  # Math.abs overflows on MIN_VALUE ...
    return a if a >= 0 else 0  # ... and safeAbs maps that to 0


def hash_to_index(h: int, length: int) -> int:
    """hazelcast/hazelcast HashUtil.hashToIndex."""
    return 0 if h == INT32_MIN else abs(h) % length


def ref_murmur3(key: Any, parts: int) -> int:
    data = key.encode("utf-8") if isinstance(key, str) else struct.pack("<q", key) if isinstance(key, int) else key
    return mmh3.hash(data, 0, signed=False) % parts


def ref_java_hash(key: Any, int_type: str = "auto") -> int:
    if isinstance(key, str):
        return java_string_hash(key)
    if isinstance(key, uuid.UUID):
        return java_uuid_hash(key)
    is_int = int_type == "int" or (int_type == "auto" and INT32_MIN <= key <= INT32_MAX)
    return key if is_int else java_long_hash(key)


def ref_ignite(key: Any, parts: int, int_type: str = "auto") -> int:
    return ignite_rule(ref_java_hash(key, int_type), parts)


def ref_hazelcast_payload(key: Any, int_type: str = "auto") -> bytes:
    """Serialized payload after HeapData's 8-byte header, default BIG_ENDIAN byte order.

    String: hazelcast-python-client tests/unit/serialization/string_test.py builds HeapData as 4-byte partition
    hash, 4-byte type id, 4-byte big-endian UTF-8 length, UTF-8 bytes. Integer/Long: writeInt/writeLong.
    """
    if isinstance(key, str):
        data = key.encode("utf-8")
        return len(data).to_bytes(4, "big") + data
    if isinstance(key, bytes):
        return len(key).to_bytes(4, "big") + key
    if isinstance(key, uuid.UUID):
        return key.int.to_bytes(16, "big")
    is_int = int_type == "int" or (int_type == "auto" and INT32_MIN <= key <= INT32_MAX)
    return key.to_bytes(4, "big", signed=True) if is_int else key.to_bytes(8, "big", signed=True)


def ref_hazelcast(key: Any, parts: int, int_type: str = "auto") -> int:
    return hash_to_index(mmh3.hash(ref_hazelcast_payload(key, int_type), HZ_SEED, signed=True), parts)


REFERENCE = {"murmur3": ref_murmur3, "ignite": ref_ignite, "hazelcast": ref_hazelcast}

EDGE_STRINGS = ["", "a", "ab", "abc", "abcd", "abcde", "hello", "user-42", "é", "€uro", "😀", "a😀b", "\U0010ffff"]
EDGE_STRINGS.append("日本語テキスト")
EDGE_INTS = [0, 1, -1, 42, INT32_MAX, INT32_MIN, INT32_MAX + 1, INT32_MIN - 1, INT64_MAX, INT64_MIN, 2**32, -(2**32)]
PART_COUNTS = [1, 2, 7, 271, 1024, 65536, 65535, 2**31 - 1]


# ---------------------------------------------------------------------------------------------------------------
# Golden vectors
# ---------------------------------------------------------------------------------------------------------------


def test_murmur3_pinned_values() -> None:
    # mmh3(utf8, 0) / mmh3(<q, 0) unsigned, reduced by %; "node0" hashes to SPEC's golden node_seed 2405097624.
    assert key_hash("node0") == 2405097624
    assert key_hash("user-42") == 3111312080
    assert partition_of("user-42", 1024) == 720
    assert partition_of("", 1024) == 0
    assert partition_of("😀", 271) == 159
    assert key_hash(0) == 1669671676
    assert partition_of(-1, 1024) == 232
    assert partition_of(INT64_MIN, 271) == 229
    assert partition_of(b"hello", 1024) == partition_of("hello", 1024) == 583


@pytest.mark.parametrize("parts", PART_COUNTS)
def test_murmur3_matches_mmh3_struct(parts: int) -> None:
    for key in [*EDGE_STRINGS, *EDGE_INTS, b"", b"\x00\xff", bytes(range(256))]:
        assert partition_of(key, parts) == ref_murmur3(key, parts), key


def test_java_hashcodes_published_values() -> None:
    # Well-known Java values: "hello".hashCode() == 99162322, "Aa" and "BB" collide at 2112, "" is 0.
    assert key_hash("hello", "ignite") == 99162322
    assert key_hash("Aa", "ignite") == key_hash("BB", "ignite") == 2112
    assert key_hash("", "ignite") == 0
    # U+1F600 is the surrogate pair D83D DE00 in Java's char[]: 0xD83D * 31 + 0xDE00.
    assert key_hash("😀", "ignite") == 0xD83D * 31 + 0xDE00 == 1772899
    # Integer.hashCode is the value; Long.hashCode folds the halves: -1L -> 0, 1L << 32 -> 1.
    assert key_hash(-1, "ignite") == -1
    assert key_hash(-1, "ignite", int_type="long") == 0
    assert key_hash(2**32, "ignite") == 1
    assert key_hash(uuid.UUID(int=(1 << 64) | 2), "ignite") == 3  # msb 1 ^ lsb 2


@pytest.mark.parametrize("parts", PART_COUNTS)
def test_ignite_matches_java_transcription(parts: int) -> None:
    uuids = [uuid.UUID(int=0), uuid.UUID("123e4567-e89b-12d3-a456-426614174000"), uuid.UUID(int=2**128 - 1)]
    for key in [*EDGE_STRINGS, *EDGE_INTS, *uuids]:
        assert partition_of(key, parts, "ignite") == ref_ignite(key, parts), key
    for key in EDGE_INTS:
        assert partition_of(key, parts, "ignite", int_type="long") == ref_ignite(key, parts, "long"), key


def test_ignite_mask_rule_is_not_abs_mod() -> None:
    # A negative hashCode separates the power-of-two mask rule from safeAbs(h % parts): Integer -5 with 8
    # partitions is (-5 ^ (-5 >>> 16)) & 7 == 4 under the mask, but |-5 % 8| == 5.
    assert partition_of(-5, 8, "ignite") == 4
    assert partition_of(-5, 7, "ignite") == 5
    # Integer.MIN_VALUE: MIN % 271 is -(2^31 mod 271); the mask rule sees 0x80008000.
    assert partition_of(INT32_MIN, 271, "ignite") == 2**31 % 271
    assert partition_of(INT32_MIN, 65536, "ignite") == 0x8000


def test_hazelcast_published_murmur_vectors() -> None:
    # hazelcast/hazelcast-python-client tests/unit/murmur_hash_test.py ("Expected values are from the Java
    # implementation"): MurmurHash3_x86_32(payload, seed 0x01000193) and hashToIndex(h, 271) of raw payloads
    # (HeapData minus its 8-byte header).
    vectors = [
        (b"key-1", 1228513025, 107),
        (b"key-2", 1503416236, 105),
        (b"key-3", 1876349747, 218),
        (b"key-4", -914632498, 181),
        (b"key-5", -803210507, 111),
        (b"key-6", -847942313, 115),
        (b"key-7", 1196747334, 223),
        (b"key-8", -1444149994, 208),
        (b"key-9", 1182720020, 140),
        (b"", -1585187909, 238),
        (b"a", -1686100800, 46),
        (b"ab", 312914265, 50),
        (b"abc", -2068121803, 208),
        (b"abcd", -973615161, 236),
    ]
    payloads = pa.array([v[0] for v in vectors], pa.binary())
    data, starts, lengths = P._varlen_parts(payloads)
    hashes = P._murmur3_varlen(data, starts, lengths, HZ_SEED)  # the kernel, on the raw payloads
    assert hashes.view(np.int32).tolist() == [v[1] for v in vectors]
    assert P._reduce(hashes, 271, "hazelcast").tolist() == [v[2] for v in vectors]
    assert [P._reduce_scalar(v[1], 271, "hazelcast") for v in vectors] == [v[2] for v in vectors]
    # Through the public API: the Integer 0x61626364 serializes to exactly the payload b"abcd".
    assert key_hash(0x61626364, "hazelcast") == -973615161
    assert partition_of(0x61626364, 271, "hazelcast") == 236


@pytest.mark.parametrize("parts", PART_COUNTS)
def test_hazelcast_matches_serialized_payload(parts: int) -> None:
    keys = [*EDGE_STRINGS, *EDGE_INTS, b"", b"\x00\xff", uuid.UUID("123e4567-e89b-12d3-a456-426614174000")]
    for key in keys:
        assert partition_of(key, parts, "hazelcast") == ref_hazelcast(key, parts), key
    for key in EDGE_INTS:
        assert partition_of(key, parts, "hazelcast", int_type="long") == ref_hazelcast(key, parts, "long"), key


def test_hazelcast_min_value_hash_maps_to_zero() -> None:
    assert P._reduce_scalar(INT32_MIN, 271, "hazelcast") == 0
    assert P._reduce(np.array([2**31], dtype=np.uint32), 271, "hazelcast").tolist() == [0]
    # Ignite's safeAbs(h % p) of the same hash is not 0: the two rules differ exactly there.
    assert P._reduce_scalar(INT32_MIN, 271, "ignite") == 2**31 % 271


# ---------------------------------------------------------------------------------------------------------------
# Decisions and errors
# ---------------------------------------------------------------------------------------------------------------


def test_int_type_auto_is_integer_when_it_fits_else_long() -> None:
    for part in ("ignite", "hazelcast"):
        assert key_hash(7, part) == key_hash(7, part, int_type="int")
        assert key_hash(2**40, part) == key_hash(2**40, part, int_type="long")
    # murmur3 always hashes 8 bytes, so int_type does not change it.
    assert key_hash(7, "murmur3", int_type="int") == key_hash(7, "murmur3", int_type="long")
    with pytest.raises(ValueError, match="Java int"):
        partition_of(2**31, 8, "ignite", int_type="int")
    with pytest.raises(ValueError, match="Java int"):
        partitions_of(np.array([1, 2**31]), 8, "hazelcast", int_type="int")


@pytest.mark.parametrize(
    ("key", "partitioner", "error"),
    [
        (True, "murmur3", TypeError),
        (None, "murmur3", TypeError),
        (1.5, "ignite", TypeError),
        (b"x", "ignite", TypeError),
        (uuid.UUID(int=1), "murmur3", TypeError),
        (2**63, "murmur3", ValueError),
        (-(2**63) - 1, "hazelcast", ValueError),
        ("\ud800", "murmur3", ValueError),
        ("\ud800", "ignite", ValueError),
        ("k", "bogus", ValueError),
    ],
)
def test_scalar_rejects(key: Any, partitioner: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        partition_of(key, 8, partitioner)


@pytest.mark.parametrize(
    ("parts", "error"), [(0, ValueError), (-1, ValueError), (2**31, ValueError), (True, TypeError)]
)
def test_partitions_must_be_a_positive_java_int(parts: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        partition_of("k", parts)
    with pytest.raises(error):
        partitions_of(np.array([1]), parts)


def test_kernel_rejects_nulls_floats_and_binary_for_ignite() -> None:
    with pytest.raises(ValueError, match="null"):
        partitions_of(pa.array(["a", None]), 8)
    with pytest.raises(TypeError):
        partitions_of(np.array([1.0, 2.0]), 8)
    with pytest.raises(TypeError):
        partitions_of(pa.array([b"a"], pa.binary()), 8, "ignite")
    with pytest.raises(ValueError):
        partitions_of(np.array([2**63], dtype=np.uint64), 8)


# ---------------------------------------------------------------------------------------------------------------
# scalar == NumPy/Arrow kernel
# ---------------------------------------------------------------------------------------------------------------

texts = st.text(max_size=40)  # any code point but lone surrogates, incl. non-BMP and the empty string
int64s = st.one_of(st.integers(INT64_MIN, INT64_MAX), st.sampled_from(EDGE_INTS), st.integers(-(2**33), 2**33))
part_counts = st.one_of(st.sampled_from(PART_COUNTS), st.integers(1, 2**31 - 1))
int_types = st.sampled_from(["auto", "int", "long"])


@given(keys=st.lists(texts, max_size=60), parts=part_counts, partitioner=st.sampled_from(PARTITIONERS))
def test_string_kernel_equals_scalar(keys: list[str], parts: int, partitioner: str) -> None:
    got = partitions_of(pa.array(keys, pa.string()), parts, partitioner)
    assert got.dtype == np.int32
    expected = [partition_of(k, parts, partitioner) for k in keys]
    assert got.tolist() == expected
    assert all(0 <= p < parts for p in expected)
    assert expected == [REFERENCE[partitioner](k, parts) for k in keys]
    # large_string, NumPy str arrays and sliced arrays (non-zero Arrow offset) take the same path.
    assert partitions_of(pa.array(keys, pa.large_string()), parts, partitioner).tolist() == expected
    if keys:
        assert partitions_of(np.array(keys, dtype=object), parts, partitioner).tolist() == expected
        sliced = pa.array(["pad", *keys], pa.string()).slice(1)
        assert partitions_of(sliced, parts, partitioner).tolist() == expected


@given(keys=st.lists(int64s, max_size=60), parts=part_counts, partitioner=st.sampled_from(PARTITIONERS))
def test_int64_kernel_equals_scalar(keys: list[int], parts: int, partitioner: str) -> None:
    arr = np.array(keys, dtype=np.int64)
    got = partitions_of(arr, parts, partitioner)
    expected = [partition_of(k, parts, partitioner) for k in keys]
    assert got.tolist() == expected
    assert all(0 <= p < parts for p in expected)
    assert expected == [REFERENCE[partitioner](k, parts) for k in keys]
    assert partitions_of(pa.array(arr), parts, partitioner).tolist() == expected
    if partitioner != "murmur3":
        assert partitions_of(arr, parts, partitioner, int_type="long").tolist() == [
            partition_of(k, parts, partitioner, int_type="long") for k in keys
        ]


@given(keys=st.lists(st.integers(INT32_MIN, INT32_MAX), max_size=40), parts=part_counts, int_type=int_types)
def test_int32_kernel_equals_scalar(keys: list[int], parts: int, int_type: str) -> None:
    for partitioner in PARTITIONERS:
        expected = [partition_of(k, parts, partitioner, int_type=int_type) for k in keys]
        for arr in (np.array(keys, dtype=np.int32), pa.array(keys, pa.int32())):
            assert partitions_of(arr, parts, partitioner, int_type=int_type).tolist() == expected


@given(keys=st.lists(st.binary(max_size=40), max_size=40), parts=part_counts)
def test_binary_kernel_equals_scalar(keys: list[bytes], parts: int) -> None:
    for partitioner in ("murmur3", "hazelcast"):
        got = partitions_of(pa.array(keys, pa.binary()), parts, partitioner)
        assert got.tolist() == [REFERENCE[partitioner](k, parts) for k in keys]


def test_long_keys_take_the_per_key_path_and_agree() -> None:
    # Keys above 64 blocks (256 bytes) are hashed by mmh3 one by one; mix them with short keys and odd tails.
    keys = ["x" * n for n in (0, 1, 255, 256, 257, 258, 259, 1000)] + ["é😀" * 200, "short", "日本" * 300]
    for partitioner in PARTITIONERS:
        got = partitions_of(pa.array(keys), 65535, partitioner)
        assert got.tolist() == [REFERENCE[partitioner](k, 65535) for k in keys], partitioner


def test_chunked_dictionary_and_large_arrays_agree() -> None:
    chunked = pa.chunked_array([pa.array(["a", "bb"]), pa.array(["ccc", "😀"])])
    dictionary = pa.array(["a", "bb", "a", "😀"]).dictionary_encode()
    for partitioner in PARTITIONERS:
        assert partitions_of(chunked, 271, partitioner).tolist() == [
            partition_of(k, 271, partitioner) for k in ["a", "bb", "ccc", "😀"]
        ]
        assert partitions_of(dictionary, 271, partitioner).tolist() == [
            partition_of(k, 271, partitioner) for k in ["a", "bb", "a", "😀"]
        ]
    # A few thousand random keys in one call: the column-wise loop with many block counts at once.
    rng = np.random.default_rng(7)
    alphabet = list("abcxyz0189é€😀日")
    keys = ["".join(rng.choice(alphabet, size=int(n))) for n in rng.integers(0, 70, size=3000)]
    for partitioner in PARTITIONERS:
        assert partitions_of(pa.array(keys), 1000, partitioner).tolist() == [
            REFERENCE[partitioner](k, 1000) for k in keys
        ]


# ---------------------------------------------------------------------------------------------------------------
# Spark column == scalar
# ---------------------------------------------------------------------------------------------------------------

ROW_SCHEMA = "s string, l bigint, i int, b binary"


def _spark_check(spark: Any, rows: list[tuple[Any, ...]], parts: int) -> None:
    from pyspark.sql import functions as F

    from rebalancer.affinity.partitioners import partition_id_column, with_partition_column

    df = spark.createDataFrame(rows, ROW_SCHEMA).withColumn("row", F.monotonically_increasing_id())
    cols = [partition_id_column("s", parts, p).alias(f"s_{p}") for p in PARTITIONERS]
    cols += [partition_id_column(F.col("l"), parts, p).alias(f"l_{p}") for p in PARTITIONERS]
    cols += [partition_id_column("i", parts, p).alias(f"i_{p}") for p in PARTITIONERS]
    cols += [partition_id_column("l", parts, p, int_type="long").alias(f"L_{p}") for p in ("ignite", "hazelcast")]
    cols += [partition_id_column("b", parts, p).alias(f"b_{p}") for p in ("murmur3", "hazelcast")]
    out_df = with_partition_column(df.select("*", *cols), "s", parts, "hazelcast", out_col="stage")
    result = sorted(out_df.collect(), key=lambda r: r["row"])
    assert out_df.schema["stage"].dataType.simpleString() == "int"

    def expect(key: Any, partitioner: str, int_type: str = "auto") -> int | None:
        return None if key is None else partition_of(key, parts, partitioner, int_type=int_type)

    for row, (s, lng, i, b) in zip(result, rows, strict=True):
        for p in PARTITIONERS:
            assert row[f"s_{p}"] == expect(s, p), (p, s)
            assert row[f"l_{p}"] == expect(lng, p), (p, lng)
            assert row[f"i_{p}"] == expect(i, p), (p, i)
        for p in ("ignite", "hazelcast"):
            assert row[f"L_{p}"] == expect(lng, p, "long"), (p, lng)
        for p in ("murmur3", "hazelcast"):
            assert row[f"b_{p}"] == expect(b, p), (p, b)
        assert row["stage"] == expect(s, "hazelcast")


def test_spark_column_equals_scalar_on_edge_cases(spark: Any) -> None:
    rows: list[tuple[Any, ...]] = [
        (s, lng, i, s.encode("utf-8"))
        for s, lng, i in zip(EDGE_STRINGS, EDGE_INTS + [7, -7], [0, 1, -1, INT32_MAX, INT32_MIN] * 3, strict=False)
    ]
    rows.append((None, None, None, None))
    rows.append(("x" * 300, INT64_MIN, INT32_MIN, b"\x00" * 300))
    _spark_check(spark, rows, 271)


rows_strategy = st.lists(
    st.tuples(
        st.none() | texts,
        st.none() | int64s,
        st.none() | st.integers(INT32_MIN, INT32_MAX),
        st.none() | st.binary(max_size=20),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=4)
@given(rows=rows_strategy, parts=st.sampled_from([1, 271, 1024, 1000]))
def test_spark_column_equals_scalar_property(spark: Any, rows: list[tuple[Any, ...]], parts: int) -> None:
    _spark_check(spark, rows, parts)


def test_with_partition_column_validates_up_front(spark: Any) -> None:
    from rebalancer.affinity.partitioners import with_partition_column

    df = spark.createDataFrame([("a", 1.0, b"x")], "k string, d double, b binary")
    with pytest.raises(ValueError, match="not in DataFrame"):
        with_partition_column(df, "missing", 8)
    with pytest.raises(TypeError, match="double"):
        with_partition_column(df, "d", 8)
    with pytest.raises(TypeError, match="ignite"):
        with_partition_column(df, "b", 8, "ignite")
    with pytest.raises(ValueError, match="partitioner"):
        with_partition_column(df, "k", 8, "bogus")
    assert with_partition_column(df, "k", 8).columns == ["k", "d", "b", "partition_id"]
