"""Joining a GGUF split in shards (llama.cpp's gguf-split: `name-00001-of-00003.gguf`, each with
its own header, `split.*` keys and a share of the tensors) into one GGUF file: the first shard's
metadata less the split keys, then every shard's tensors in shard order, bytes unchanged."""

from __future__ import annotations

from pathlib import Path

from edge_infer.errors import HubError

_SKIP = ("GGUF.", "split.", "general.architecture")


def join_shards(shards: list[Path], out: Path) -> None:
    """Write the model of `shards` (in order) to `out` (a new file)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    readers = [GGUFReader(p) for p in shards]
    first = readers[0]
    count = first.fields.get("split.count")
    if count is None or int(count.contents()) != len(shards):
        raise HubError(f"{shards[0].name}: not the first of {len(shards)} GGUF shards (its split.count says otherwise)")
    arch = first.fields["general.architecture"].contents()
    writer = GGUFWriter(str(out), arch)
    align = first.fields.get("general.alignment")
    if align is not None:
        writer.data_alignment = int(align.contents())
    try:
        for name, field in first.fields.items():
            if name.startswith(_SKIP):
                continue
            vtype = GGUFValueType(field.types[0])
            sub = GGUFValueType(field.types[-1]) if vtype == GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
        tensors = [t for r in readers for t in r.tensors]
        for t in tensors:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, raw_dtype=t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in tensors:
            writer.write_tensor_data(t.data)
    finally:
        writer.close()
