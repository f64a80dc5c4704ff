"""Write a higher-precision copy of a GGUF model: every quantized matrix dequantized (edge-infer's
reference dequantizer) and stored as F16 (or F32); metadata copied as is.

    python benchmarks/make_f16_copy.py MODEL OUT.gguf [--type F16|F32]

Used by the speculative-decoding benchmark: the original low-bit file drafts for this copy.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from edge_infer import hub
from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.quants import dequantize

_TYPES = {
    "uint8": GGUFValueType.UINT8, "int8": GGUFValueType.INT8, "uint16": GGUFValueType.UINT16,
    "int16": GGUFValueType.INT16, "uint32": GGUFValueType.UINT32, "int32": GGUFValueType.INT32,
    "float32": GGUFValueType.FLOAT32, "bool": GGUFValueType.BOOL, "string": GGUFValueType.STRING,
    "uint64": GGUFValueType.UINT64, "int64": GGUFValueType.INT64, "float64": GGUFValueType.FLOAT64,
}


def write_copy(src: str, out: str, dtype: str = "F16") -> Path:
    target = np.float16 if dtype == "F16" else np.float32
    tmp = out + ".part"
    with GGUFFile(src) as f:
        w = GGUFWriter(tmp, f.architecture)
        for key, value in f.metadata.items():
            if key in ("general.architecture", "general.alignment"):
                continue
            t = f.metadata_types[key]
            if t.startswith("array["):
                w.add_key_value(key, value, GGUFValueType.ARRAY, _TYPES[t[6:-1]])
            else:
                w.add_key_value(key, value, _TYPES[t])
        for t in f.tensors.values():
            x = dequantize(t)
            if t.type in (GGMLQuantizationType.F32,) or x.ndim == 1:
                w.add_tensor(t.name, np.ascontiguousarray(x, np.float32))
            else:
                w.add_tensor(t.name, x.astype(target))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    os.replace(tmp, out)
    return Path(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--type", default="F16", choices=["F16", "F32"])
    args = ap.parse_args()
    print(write_copy(str(hub.resolve_model(args.model)), args.out, args.type))


if __name__ == "__main__":
    main()
