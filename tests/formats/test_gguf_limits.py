"""Hostile GGUF metadata is refused before anything its counts size is built: absurd layer counts,
head counts and widths (by the reader, naming the key), counts the file's tensors cannot back (by
the model's config), and vocabulary arrays longer than any real vocabulary (before one element is
read), each with the peak memory of the attempt bounded."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf_bytes as gb
import pytest
from peak_memory import peak_growth
from tiny_models import write_tiny_llama

from edge_infer.errors import GGUFError, UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.gguf_limits import MAX_LAYERS, MAX_VOCAB
from edge_infer.models import config_from_gguf

MIB = 64  # peak RSS growth allowed for refusing a hostile file (the old code took 0.7-1.6 GB)


def llama_meta(**over: int) -> gb.RawGGUF:
    """The keys llama's config reads, with small values unless overridden (no tensors)."""
    g = gb.RawGGUF().kv("general.architecture", gb.STR, "llama")
    values = {"block_count": 2, "embedding_length": 64, "attention.head_count": 4, "feed_forward_length": 128,
              "context_length": 128, "vocab_size": 8} | over
    for key, v in values.items():
        g.kv(f"llama.{key}", gb.U32, v)
    return g


def write(path: Path, g: gb.RawGGUF) -> Path:
    path.write_bytes(g.build())
    return path


def patch_u32(path: Path, key: str, value: int) -> None:
    """Set the uint32 metadata value of `key` in place (the key must be stored once, as uint32)."""
    data = bytearray(path.read_bytes())
    head = gb.gstr(key) + struct.pack("<I", gb.U32)
    at = data.index(head) + len(head)
    data[at : at + 4] = struct.pack("<I", value)
    path.write_bytes(bytes(data))


def test_two_hundred_million_layers_in_a_tiny_file_are_refused_in_bounded_memory(tmp_path: Path) -> None:
    """The issue's case: ~400 bytes claiming 2e8 layers took 1.56 GB and its config was accepted."""
    path = write(tmp_path / "layers.gguf", llama_meta(block_count=200_000_000))
    assert path.stat().st_size < 500
    outcome, grown = peak_growth(
        f"from edge_infer.formats.gguf import GGUFFile\nfrom edge_infer.models import config_from_gguf\npath = {str(path)!r}",
        "config_from_gguf(GGUFFile(path))",
    )
    assert grown < MIB, f"refusing it took {grown:.0f} MiB ({outcome})"
    assert outcome.startswith("GGUFError: ") and f"'llama.block_count' = 200000000 is outside 0..{MAX_LAYERS}" in outcome


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("llama.block_count", MAX_LAYERS + 1, f"0..{MAX_LAYERS}"),
    ("llama.attention.head_count", 1_000_000_000, "0..1024"),
    ("llama.attention.head_count_kv", 1 << 31, "0..1024"),
    ("llama.embedding_length", 1 << 40, "0..1048576"),
    ("llama.feed_forward_length", 1 << 33, "0..1048576"),
    ("llama.attention.key_length", 1 << 20, "0..4096"),
    ("llama.vocab_size", 1 << 30, f"0..{MAX_VOCAB}"),
    ("llama.expert_count", 1 << 20, "0..1024"),
])
def test_absurd_counts_and_widths_are_refused_naming_the_key(tmp_path: Path, key: str, value: int, shown: str) -> None:
    g = llama_meta()
    g.kvs = [kv for kv in g.kvs if kv[0] != key] + [(key, gb.U64, value, None)]
    path = write(tmp_path / "w.gguf", g)
    with pytest.raises(GGUFError, match=rf"metadata '{key}' = {value} is outside {shown}"):
        GGUFFile(path)


def test_negative_and_per_layer_counts_are_checked_too(tmp_path: Path) -> None:
    path = write(tmp_path / "neg.gguf", llama_meta().kv("llama.attention.head_count_kv", gb.I32, -4))
    with pytest.raises(GGUFError, match=r"'llama.attention.head_count_kv' = -4 is outside 0\.\.1024"):
        GGUFFile(path)
    per_layer = write(tmp_path / "arr.gguf", llama_meta().kv("llama.attention.head_count_kv", gb.ARR, [4, 2, 5000], gb.U32))
    with pytest.raises(GGUFError, match=r"'llama.attention.head_count_kv' = 5000 is outside"):
        GGUFFile(per_layer)
    many = write(tmp_path / "many.gguf", llama_meta().kv("llama.attention.head_count_kv", gb.ARR, [1] * 10_000, gb.U8))
    with pytest.raises(GGUFError, match=r"'llama.attention.head_count_kv' has 10000 per-layer values, more than 512"):
        GGUFFile(many)


def test_zero_heads_is_one_error_not_a_division_by_zero(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf")
    patch_u32(path, "llama.attention.head_count", 0)
    with pytest.raises(UnsupportedModelError, match=r"'llama.attention.head_count' must be a positive integer, got 0"):
        config_from_gguf(GGUFFile(path))


def test_counts_the_tensors_cannot_back_are_refused_by_the_config(tmp_path: Path) -> None:
    """Under the maxima but not what the file holds: refused before a config is made of them."""
    path = write_tiny_llama(tmp_path / "m.gguf", n_layers=2, d_model=64)
    config_from_gguf(GGUFFile(path))  # as written: fine
    patch_u32(path, "llama.block_count", 500)
    with pytest.raises(UnsupportedModelError, match=r"'llama.block_count' = 500, but the file has no tensors of layer 499"):
        config_from_gguf(GGUFFile(path))
    patch_u32(path, "llama.block_count", 2)
    patch_u32(path, "llama.embedding_length", 65536)
    with pytest.raises(UnsupportedModelError, match=r"'llama.embedding_length' = 65536, but token_embd.weight has rows of 64"):
        config_from_gguf(GGUFFile(path))


def test_a_vocabulary_longer_than_the_file_is_refused_before_reading_it(tmp_path: Path) -> None:
    g = gb.RawGGUF().kv("tokenizer.ggml.model", gb.STR, "gpt2").kv("tokenizer.ggml.tokens", gb.ARR, ["a", "b"], gb.STR)
    data = bytearray(g.build())
    at = data.index(struct.pack("<IQ", gb.STR, 2)) + 4
    data[at : at + 8] = struct.pack("<Q", 500_000)  # under the vocabulary cap, past the end of the file
    path = tmp_path / "v.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=r"'tokenizer.ggml.tokens' declares 500000 strings, more than the file can hold"):
        GGUFFile(path)


def empty_tokens_file(path: Path, n: int) -> Path:
    """A gpt2 vocabulary (no merges) of n empty token texts: 8 bytes each in the file."""
    with open(path, "wb") as fh:
        fh.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 4))  # version 3, no tensors, 4 kvs
        fh.write(gb.gstr("general.architecture") + struct.pack("<I", gb.STR) + gb.gstr("llama"))
        fh.write(gb.gstr("tokenizer.ggml.model") + struct.pack("<I", gb.STR) + gb.gstr("gpt2"))
        fh.write(gb.gstr("tokenizer.ggml.merges") + struct.pack("<IIQ", gb.ARR, gb.STR, 0))
        fh.write(gb.gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", gb.ARR, gb.STR, n))
        fh.write(bytes(8 * n))
    return path


def test_thirty_mib_of_empty_token_texts_are_refused_in_bounded_memory(tmp_path: Path) -> None:
    """The issue's case: a 30 MiB file of empty token strings took 719 MB to load."""
    n = 30 * 2**20 // 8
    path = empty_tokens_file(tmp_path / "empty.gguf", n)
    outcome, grown = peak_growth(
        f"from edge_infer.tokenizer import Tokenizer\npath = {str(path)!r}", "Tokenizer.from_gguf(path)"
    )
    assert grown < MIB, f"refusing it took {grown:.0f} MiB ({outcome})"
    assert outcome.startswith("GGUFError: ")
    assert f"'tokenizer.ggml.tokens' declares {n} elements, more than the {MAX_VOCAB} allowed" in outcome
