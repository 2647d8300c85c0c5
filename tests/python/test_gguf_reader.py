"""strata.inspect (the native GGUF reader) agrees with the reference gguf package on a file it wrote,
and rejects a cut one."""

from pathlib import Path

import gguf
import numpy as np
import pytest

import strata


def write_model(path: Path) -> None:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_name("tiny \u00e9 model")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -300)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**40))
    w.add_float32("t.f32", 1.5)
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_array("t.arr_int", [1, -2, 3])
    w.add_array("t.arr_float", [0.25, -1.5])
    w.add_array("t.arr_bool", [True, False])
    w.add_token_list(["<s>", "</s>", "hello", ""])
    w.add_tensor("token_embd.weight", rng.standard_normal((3, 64), dtype=np.float32))
    w.add_tensor("output_norm.weight", rng.standard_normal(5).astype(np.float16))
    q8 = rng.integers(0, 256, size=(2, 2 * 34), dtype=np.uint8)  # 2 rows of 64 Q8_0 elements
    w.add_tensor("blk.0.ffn_up.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    write_model(path)
    return path


def test_matches_reference_reader(model: Path) -> None:
    ours = strata.inspect(str(model))
    ref = gguf.GGUFReader(str(model))

    assert ours["path"] == str(model)
    assert ours["file_size"] == model.stat().st_size
    assert ours["version"] == 3
    assert ours["alignment"] == ref.alignment == 64
    assert ours["data_offset"] == ref.data_offset

    ref_md = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(ours["metadata"]) == list(ref_md)  # same keys, file order
    for key, want in ref_md.items():
        got = ours["metadata"][key]
        assert got == want, key
        # bool must stay bool and int stay int (True == 1 would hide a mix-up).
        pairs = zip(got, want, strict=False) if isinstance(want, list) else [(got, want)]
        assert all(type(g) is type(x) for g, x in pairs), key
    assert ours["metadata"]["t.u64"] == 2**63 + 5
    assert ours["metadata"]["tokenizer.ggml.tokens"] == ["<s>", "</s>", "hello", ""]

    assert [t["name"] for t in ours["tensors"]] == [t.name for t in ref.tensors]
    raw = model.read_bytes()
    for got, want in zip(ours["tensors"], ref.tensors, strict=False):
        assert got["type"] == int(want.tensor_type)
        assert got["type_name"] == want.tensor_type.name
        assert got["shape"] == [int(d) for d in want.shape]
        assert got["offset"] == want.data_offset
        assert got["nbytes"] == want.n_bytes
        assert got["offset"] % 64 == 0
        assert raw[got["offset"] : got["offset"] + got["nbytes"]] == want.data.tobytes()


def test_truncated_copy_raises_format_error(model: Path, tmp_path: Path) -> None:
    raw = model.read_bytes()
    for cut in (0, 10, 100, len(raw) // 2, len(raw) - 1 - 64):
        cut_path = tmp_path / f"cut_{cut}.gguf"
        cut_path.write_bytes(raw[:cut])
        with pytest.raises(strata.FormatError, match=f"cut_{cut}.gguf"):
            strata.inspect(str(cut_path))


def test_open_errors(tmp_path: Path) -> None:
    with pytest.raises(strata.Error, match="missing.gguf: cannot open"):
        strata.inspect(str(tmp_path / "missing.gguf"))
    not_gguf = tmp_path / "notes.txt"
    not_gguf.write_text("hello world, this is not a model file")
    with pytest.raises(strata.FormatError, match="bad magic"):
        strata.inspect(str(not_gguf))
