"""The compiled header reader of kernels/safetensors_native.c against header.py's parser: the
same Header, or the same finding, for the same bytes, on every fixture and on generated and
mutated headers; and the plain headers every writer writes are the ones it takes."""
import json
import random
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptqfmt.errors import FindingError
from gptqfmt.safetensors_io import compiled
from gptqfmt.safetensors_io import header as H
from tests.support import loops

ROOT = Path(__file__).resolve().parents[2]
BUILT = compiled.available()
needs_build = pytest.mark.skipif(not BUILT,
                                 reason="gptqfmt.safetensors_io._native was not built")


def parsed(raw: bytes, size: int, compiled: bool):
    """parse_header's answer, compiled reader on or off: the Header as plain data (tensors in
    their order), or the finding it raised."""
    with loops(compiled=compiled):
        try:
            h = H.parse_header(raw, size, "x.safetensors")
        except FindingError as e:
            return ("finding", e.finding.code, e.finding.tensor, e.finding.message)
    return (list(h.tensors.items()), h.metadata, h.header_len, h.data_len)


def scanned(raw: bytes):
    return compiled.scan(raw, H._BITS, H.TensorInfo)


def same(raw: bytes, size: int) -> None:
    assert parsed(raw, size, True) == parsed(raw, size, False)


def fixture_headers():
    for p in sorted((ROOT / "fixtures").rglob("*.safetensors")):
        if p.is_symlink() or not p.is_file():
            continue
        blob = p.read_bytes()
        if len(blob) < 8:
            continue
        (n,) = struct.unpack("<Q", blob[:8])
        if n <= len(blob) - 8:
            yield p, blob[8:8 + n], len(blob)


@needs_build
def test_every_fixture_reads_the_same_and_the_plain_ones_are_taken():
    taken = 0
    for p, raw, size in fixture_headers():
        same(raw, size)
        got = scanned(raw)
        taken += got is not None
        if got is not None:
            slow = parsed(raw, size, False)
            if slow[0] != "finding":   # else a rule of the file's size fails after the read
                assert list(got[0].items()) == slow[0], p
            # the entries are the parser's own type, their dtypes and shapes shared per kind
            assert all(type(t) is H.TensorInfo for t in got[0].values())
    assert taken > 100   # the fixtures' writers write plain headers


def entry(dtype="F16", shape=(2, 3), begin=0):
    bits = H.DTYPES[dtype].bits if dtype in H.DTYPES else 16
    n = 1
    for d in shape:
        n *= d
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, begin + n * bits // 8]}


def tiled(names_shapes, dtype="F16"):
    """A header of tensors laid end to end, and its data length."""
    out, at = {}, 0
    for name, shape in names_shapes:
        out[name] = entry(dtype, shape, at)
        at = out[name]["data_offsets"][1]
    return out, at


@needs_build
def test_a_plain_header_is_taken_in_data_order_with_kinds_shared():
    doc, end = tiled([(f"model.layers.{i}.w", (4, 8)) for i in range(300)])
    doc = dict(reversed(list(doc.items())))   # written out of data order
    doc["__metadata__"] = {"format": "pt", "quantizer": "x:1"}
    raw = json.dumps(doc, indent=1).encode() + b"   "
    tensors, metadata, data_len = scanned(raw)
    assert list(tensors) == [f"model.layers.{i}.w" for i in range(300)]
    assert metadata == {"format": "pt", "quantizer": "x:1"} and data_len == end
    shapes = {id(t.shape) for t in tensors.values()}
    assert len(shapes) == 1 and tensors["model.layers.7.w"].shape == (4, 8)
    same(raw, 8 + len(raw) + end)


@needs_build
def test_empty_tensors_at_one_offset_keep_the_header_order():
    doc = {"b": entry("F16", (0,), 0), "a": entry("F16", (0, 4), 0), "c": entry("I32", (1,), 0)}
    raw = json.dumps(doc).encode()
    assert list(scanned(raw)[0]) == ["b", "a", "c"]
    same(raw, 8 + len(raw) + 4)


# each the plain header with one thing the compiled reader leaves to the Python parser
LEFT = {
    "escape in a name": b'{"a\\u0041":%s}',
    "non-ASCII name": '{"\u00e9":%s}'.encode(),
    "an extra key": b'{"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2],"x":1}}',
    "a key twice in an entry": b'{"a":{"dtype":"F16","dtype":"F16","shape":[1],'
                               b'"data_offsets":[0,2]}}',
    "a name twice": b'{"a":%s,"a":%s}',
    "unknown dtype": b'{"a":{"dtype":"F17","shape":[1],"data_offsets":[0,2]}}',
    "float dimension": b'{"a":{"dtype":"F16","shape":[1.0],"data_offsets":[0,2]}}',
    "exponent offset": b'{"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2e0]}}',
    "negative dimension": b'{"a":{"dtype":"F16","shape":[-1],"data_offsets":[0,2]}}',
    "minus zero": b'{"a":{"dtype":"F16","shape":[1],"data_offsets":[-0,2]}}',
    "leading zero": b'{"a":{"dtype":"F16","shape":[01],"data_offsets":[0,2]}}',
    "19 digits": b'{"a":{"dtype":"F16","shape":[1000000000000000000],'
                 b'"data_offsets":[0,2]}}',
    "boolean dimension": b'{"a":{"dtype":"F16","shape":[true],"data_offsets":[0,2]}}',
    "wrong span": b'{"a":{"dtype":"F16","shape":[1],"data_offsets":[0,4]}}',
    "end before begin": b'{"a":{"dtype":"F16","shape":[0],"data_offsets":[2,0]}}',
    "a hole": b'{"a":{"dtype":"F16","shape":[1],"data_offsets":[2,4]}}',
    "an overlap": b'{"a":%s,"b":%s}',
    "half a byte": b'{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}',
    "metadata not strings": b'{"__metadata__":{"a":1},"a":%s}',
    "metadata null": b'{"__metadata__":null,"a":%s}',
    "metadata twice": b'{"__metadata__":{},"__metadata__":{},"a":%s}',
    "metadata key twice": b'{"__metadata__":{"k":"1","k":"2"},"a":%s}',
    "trailing text": b'{"a":%s}x',
    "two objects": b'{"a":%s}{}',
    "an array": b'[%s]',
    "a trailing comma": b'{"a":%s,}',
    "a BOM": b'\xef\xbb\xbf{"a":%s}',
    "17 dimensions": b'{"a":{"dtype":"F16","shape":[' + b",".join([b"1"] * 17) +
                     b'],"data_offsets":[0,2]}}',
    "truncated": b'{"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]',
}
T2 = json.dumps(entry("F16", (1,), 0)).encode()


@needs_build
@pytest.mark.parametrize("case", sorted(LEFT))
def test_what_the_compiled_reader_leaves_to_the_python_parser(case):
    raw = LEFT[case].replace(b"%s", T2)
    assert scanned(raw) is None
    same(raw, 8 + len(raw) + 2)


@needs_build
def test_more_kinds_of_tensor_than_the_reader_caches_are_left_too():
    doc, end = tiled([(f"t{i}", (i + 1,)) for i in range(33)])
    raw = json.dumps(doc).encode()
    assert scanned(raw) is None
    same(raw, 8 + len(raw) + end)
    doc, end = tiled([(f"t{i}", (i + 1,)) for i in range(32)])
    raw = json.dumps(doc).encode()
    assert scanned(raw) is not None
    same(raw, 8 + len(raw) + end)


@needs_build
def test_a_tuple_type_of_its_own_fields_is_refused():
    class Wider(tuple):   # a __dict__ of its own
        pass
    with pytest.raises(TypeError):
        compiled.scan(b"{}", H._BITS, Wider)
    with pytest.raises(TypeError):
        compiled.scan(b"{}", H._BITS, int)


@needs_build
def test_the_file_size_rules_still_hold_after_the_compiled_read():
    doc, end = tiled([("a", (2,)), ("b", (3,))])
    raw = json.dumps(doc).encode()
    for size in (8 + len(raw) + end - 1, 8 + len(raw) + end + 1, 8 + len(raw) + end):
        same(raw, size)
    assert parsed(raw, 8 + len(raw) + end - 1, True)[1:3] == ("GQ114", "b")
    assert parsed(raw, 8 + len(raw) + end + 1, True)[1] == "GQ115"


NAMES = st.text(alphabet=st.sampled_from('ab.0_"\\\u00e9\x01 /'), min_size=0, max_size=6)
DIMS = st.one_of(st.integers(0, 5), st.sampled_from([2**63, 10**18, -1, 1.5, True]))


@needs_build
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(NAMES, st.sampled_from(["F16", "I32", "F4", "BF16", "F6_E2M3",
                                                  "BOOL", "X"]),
                          st.lists(DIMS, max_size=3), st.integers(-1, 2)), max_size=6),
       st.one_of(st.none(), st.dictionaries(NAMES, st.one_of(NAMES, st.integers(0, 3)),
                                            max_size=2)),
       st.integers(0, 3), st.randoms(use_true_random=False))
def test_generated_headers_read_the_same(entries, metadata, ws, rnd):
    parts, at = [], 0
    for name, dtype, shape, shift in entries:
        bits = H.DTYPES[dtype].bits if dtype in H.DTYPES else 8
        n = 1
        for d in shape:
            n *= d if isinstance(d, int) else 1
        size = n * bits // 8
        begin = max(0, at + (shift if shift != 2 else 0))
        parts.append((name, {"dtype": dtype, "shape": shape,
                             "data_offsets": [begin, begin + size]}))
        at = begin + size
    if metadata is not None:
        parts.insert(rnd.randrange(len(parts) + 1), ("__metadata__", metadata))
    sep = " " * ws
    raw = ("{" + ("," + sep).join(json.dumps(k) + ":" + sep + json.dumps(v) for k, v in parts)
           + "}" + "\n" * ws).encode()
    same(raw, 8 + len(raw) + at)


@needs_build
def test_mutated_fixture_headers_read_the_same():
    rnd = random.Random(7)
    headers = [(raw, size) for _, raw, size in fixture_headers() if len(raw) > 40]
    taken = 0
    for _ in range(1500):
        raw, size = rnd.choice(headers)
        b = bytearray(raw)
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(len(b))
            b[at] = rnd.choice(b'{}[],:"\\0129-. aeF') if rnd.random() < 0.8 else rnd.randrange(256)
        same(bytes(b), size)
        taken += scanned(bytes(b)) is not None
    assert taken > 100   # the compiled reader's answers compared, not only the parser's


PLAIN_NAMES = st.text(alphabet=st.sampled_from("ab.0_ /-:"), min_size=0, max_size=8)


@needs_build
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(PLAIN_NAMES, st.tuples(st.sampled_from(["F16", "I32", "BF16", "BOOL",
                                                               "U8", "F64"]),
                                              st.lists(st.integers(0, 6), max_size=4)),
                       max_size=8),
       st.dictionaries(PLAIN_NAMES, PLAIN_NAMES, max_size=2), st.booleans(),
       st.randoms(use_true_random=False))
def test_generated_plain_headers_are_taken_and_read_the_same(entries, metadata, meta, rnd):
    """Any header of the plain kind, in any order, is the compiled reader's, with the Python
    parser's answer."""
    items = list(entries.items())
    rnd.shuffle(items)   # written out of data order too
    doc, at = {}, 0
    for name, (dtype, shape) in items:
        doc[name] = entry(dtype, tuple(shape), at)
        at = doc[name]["data_offsets"][1]
    if meta and "__metadata__" not in doc:
        doc["__metadata__"] = metadata
    raw = json.dumps(dict(sorted(doc.items())), indent=rnd.choice([None, 1])).encode()
    assert scanned(raw) is not None
    size = 8 + len(raw) + at
    assert parsed(raw, size, True) == parsed(raw, size, False)


def test_without_the_extension_a_header_still_reads(monkeypatch):
    """A machine without a C compiler: the Python parser reads every header."""
    monkeypatch.setattr(compiled, "_NATIVE", None)
    assert compiled.scan(b"{}", H._BITS, H.TensorInfo) is None
    doc, end = tiled([("a", (2,)), ("b", (3,))])
    raw = json.dumps(doc).encode()
    h = H.parse_header(raw, 8 + len(raw) + end, "x.safetensors")
    assert list(h.tensors) == ["a", "b"] and h.data_len == end


def index_files():
    return [p.read_bytes() for p in sorted((ROOT / "fixtures").rglob("*.index.json"))
            if p.is_file() and not p.is_symlink()]


def loaded(raw: bytes):
    """(weight_map, metadata) as json.loads reads them, where that is what index_map would
    answer at all (a top-level object of weight_map and metadata objects); else None."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict) or \
            not set(doc) <= {"weight_map", "metadata"} or \
            not isinstance(doc.get("metadata", {}), dict):
        return None
    return doc["weight_map"], doc.get("metadata")


def same_index(raw: bytes) -> bool:
    """index_map's answer is json.loads's (dicts in the same order) where it gives one;
    whether it gave one."""
    got = compiled.index_map(raw)
    if got is None:
        return False
    want = loaded(raw)
    assert want is not None, raw[:200]
    assert got == want and list(got[0].items()) == list(want[0].items()), raw[:200]
    return True


@needs_build
def test_every_fixture_index_is_taken_as_json_reads_it():
    raws = index_files()
    assert len(raws) > 20 and all(same_index(raw) for raw in raws if loaded(raw) is not None
                                  and b"\\" not in raw)
    assert sum(same_index(raw) for raw in raws) > 20


@needs_build
@pytest.mark.parametrize("raw", [
    b'{"weight_map": {"a\\u0062": "s.safetensors"}}',          # an escape
    b'{"weight_map": {"\xc3\xa9": "s.safetensors"}}',          # not ASCII
    b'{"weight_map": {"a": "s"}, "other": 1}',                 # another key
    b'{"weight_map": {"a": "s"}, "weight_map": {"b": "t"}}',   # a key twice
    b'{"metadata": {"total_size": 1.5}, "weight_map": {}}',    # a float
    b'{"metadata": {"total_size": -1}, "weight_map": {}}',     # a negative number
    b'{"metadata": {"x": {"y": 1}}, "weight_map": {}}',        # a nested value
    b'{"metadata": {"x": null}, "weight_map": {}}',
    b'{"metadata": {"total_size": 01}, "weight_map": {}}',     # not JSON
    b'{"weight_map": {"a": 1}}',                               # a shard that is no string
    b'{"weight_map": {"a": "s"}} x',                           # bytes after it
    b'{"weight_map": {"a": "s"}',                              # cut short
    b'{"metadata": {}}', b'{}', b'[]', b'', b'{"weight_map": {"a": "s",}}'])
def test_what_the_index_reader_leaves_to_json(raw):
    assert compiled.index_map(raw) is None


@needs_build
def test_mutated_and_generated_indexes_read_as_json_reads_them():
    """1,500 fixture indexes with a few bytes changed, and 300 generated ones (keys met twice,
    names repeating, spaces anywhere): every answer index_map gives is json.loads's."""
    rnd = random.Random(5)
    raws = [r for r in index_files() if len(r) > 40]
    taken = 0
    for _ in range(1500):
        b = bytearray(rnd.choice(raws))
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(len(b))
            b[at] = rnd.choice(b'{}[],:"\\019- aeF') if rnd.random() < 0.8 else rnd.randrange(256)
        taken += same_index(bytes(b))
    for _ in range(300):
        ws = rnd.choice(["", " ", "\n  ", "\t"])
        names = [rnd.choice(["a", "b.0", "x.y.qweight", "z"]) for _ in range(rnd.randrange(6))]
        shards = [f"s-{rnd.randrange(12)}.safetensors" for _ in names]
        wm = ("," + ws).join(f'"{n}":{ws}"{s}"' for n, s in zip(names, shards))
        meta = rnd.choice(["", f'"metadata": {{"total_size": {rnd.randrange(10**12)}, '
                               f'"format": "pt"}},{ws}'])
        raw = f'{ws}{{{ws}{meta}"weight_map":{ws}{{{ws}{wm}{ws}}}{ws}}}{ws}'.encode()
        assert same_index(raw), raw
        taken += 1
    assert taken > 500


def test_an_index_reads_the_same_without_the_extension(tmp_path):
    """_read_index with the compiled reader on and off: the same map and total, and the same
    finding for a broken one."""
    from gptqfmt.safetensors_io import index as I
    good = tmp_path / "good.json"
    good.write_text('{"metadata": {"total_size": 12}, "weight_map": {"a": "s.safetensors"}}')
    bad = tmp_path / "bad.json"
    bad.write_text('{"weight_map": {"a": 3}}')
    answers = []
    for on in (True, False):
        with loops(compiled=on):
            got = [I._read_index(good)]
            with pytest.raises(FindingError) as e:
                I._read_index(bad)
            got.append(e.value.finding.message)
        answers.append(got)
    assert answers[0] == answers[1]
    assert answers[0][0] == ({"a": "s.safetensors"}, 12)
