"""Coverage-guided fuzzing (atheris, libFuzzer) of the GGUF reader: any outcome of GGUFFile on
arbitrary bytes other than a parsed file or a GGUFError is a finding. Ends by itself.

    python benchmarks/fuzz_gguf.py [--seconds 600] [--corpus DIR]

Seeds: a minimal valid file and a tiny model's header (the corpus directory keeps what the
campaign finds, so a second run starts from there). Prints executions, coverage and findings.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from edge_infer.errors import GGUFError
    from edge_infer.formats.gguf import GGUFFile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

_TMP = Path(tempfile.mkdtemp(prefix="gguf-fuzz-")) / "input.gguf"


def one_input(data: bytes) -> None:
    _TMP.write_bytes(data)
    try:
        with GGUFFile(_TMP) as f:
            for t in f.tensors.values():  # touch every view the reader hands out
                t.data[:1].tobytes()
    except GGUFError:
        pass


def _seed(corpus: Path) -> None:
    import gguf_bytes
    from tiny_models import write_tiny_llama

    corpus.mkdir(parents=True, exist_ok=True)
    (corpus / "minimal.gguf").write_bytes(gguf_bytes.minimal().build())
    tiny = write_tiny_llama(Path(tempfile.mkdtemp()) / "tiny.gguf")
    (corpus / "tiny-head.gguf").write_bytes(tiny.read_bytes()[:65536])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--corpus", type=Path, default=Path(tempfile.gettempdir()) / "edge-infer-gguf-corpus")
    a, rest = ap.parse_known_args()
    if not any(a.corpus.glob("*")):
        _seed(a.corpus)
    atheris.Setup([sys.argv[0], f"-max_total_time={a.seconds}", "-max_len=65536", "-print_final_stats=1",
                   str(a.corpus), *rest], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
