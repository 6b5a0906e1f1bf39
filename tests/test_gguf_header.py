"""`gguf_header`: the fast header reader gives what `gguf.GGUFReader` gives, and a broken header
is one `ModelFileError` line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from clover_local.model.gguf_header import StringArray, read_header
from clover_local.model.gguf_info import ModelFileError, read_info


def reader_value(field) -> object:
    """What GGUFReader holds for a field, as plain Python (string arrays as their length)."""
    if field.types[0] == GGUFValueType.ARRAY:
        if field.types[1] == GGUFValueType.STRING:
            return len(field.data)
        return [field.parts[i].tolist()[0] for i in field.data]
    if field.types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode()
    return field.parts[field.data[0]].tolist()[0]


@pytest.fixture(scope="module")
def gguf_path(gguf_factory) -> Path:
    return gguf_factory("tiny")[1]


def test_header_equals_gguf_readers_metadata_and_tensors(gguf_path):
    header, reader = read_header(gguf_path), GGUFReader(gguf_path)
    assert set(header.metadata) == {k for k in reader.fields if not k.startswith("GGUF.")}
    for key, value in header.metadata.items():
        expected = reader_value(reader.fields[key])
        got = len(value) if isinstance(value, StringArray) else value
        if isinstance(expected, float):
            assert got == pytest.approx(expected, rel=1e-7), key
        elif isinstance(expected, list) and expected and isinstance(expected[0], float):
            np.testing.assert_allclose(got, expected, rtol=1e-7, err_msg=key)
        else:
            assert got == expected, key
    assert [(t.name, t.shape, t.type) for t in header.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type)) for t in reader.tensors
    ]
    assert read_info(gguf_path).vocab_size == len(reader.fields["tokenizer.ggml.tokens"].data)


@pytest.mark.parametrize("keep", [4, 8, 24, 40, 1000, -100])
def test_a_truncated_header_is_one_error_line(gguf_path, tmp_path, keep):
    data = gguf_path.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:keep] if keep > 0 else data[: len(read_header_bytes(data)) + keep])
    with pytest.raises(ModelFileError, match=r"cut\.gguf: unreadable GGUF \(") as e:
        read_info(bad)
    assert "\n" not in str(e.value)


def read_header_bytes(data: bytes) -> bytes:
    """The bytes up to the end of the last tensor info: the whole header (a cut inside it fails)."""
    n_tensors = int.from_bytes(data[8:16], "little")
    assert n_tensors > 0
    marker = data.rfind(b"output.weight")
    assert marker > 0
    end = marker + len(b"output.weight")
    n_dims = int.from_bytes(data[end : end + 4], "little")
    return data[: end + 4 + 8 * n_dims + 4 + 8]
