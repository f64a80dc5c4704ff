"""Tokenizer speed, side by side with llama.cpp's own tokenizer on the same text.

    python benchmarks/bench_tokenizer.py [--models NAME ...] [--mb 1.0] [--json]

For each model: vocabulary load time (Tokenizer.from_gguf vs llama.cpp vocab_only), encode
throughput on English prose (Python's reference docs), Python source code and mixed-script
text (first call on a fresh tokenizer = cold, second call = warm, then llama.cpp), whether
the ids are identical, decode throughput and streaming cost per token, and the cost of one
encode call on a short chat-sized prompt. llama.cpp comes from llama-cpp-python (the
[bench] extra); without it only our numbers are printed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from edge_infer.bench.baseline import baseline_info, format_baseline
from edge_infer.tokenizer import Tokenizer

MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b")


def english(nbytes: int) -> str:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return _fit(text, nbytes)


def code(nbytes: int) -> str:
    parts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        src = path.read_text(encoding="utf-8", errors="replace")
        parts.append(src)
        total += len(src.encode())
        if total >= nbytes:
            break
    return _fit("\n".join(parts), nbytes)


def mixed_scripts(nbytes: int) -> str:
    # Words drawn from several scripts' letter ranges, with punctuation and digits.
    r = random.Random(7)
    ranges = [(0x61, 0x7A), (0xE0, 0xFF), (0x430, 0x44F), (0x3B1, 0x3C9), (0x4E00, 0x4FFF), (0x3041, 0x3096),
              (0xAC00, 0xAD00), (0x627, 0x64A), (0x915, 0x939), (0x1F600, 0x1F64F)]
    out, size = [], 0
    while size < nbytes:
        lo, hi = r.choice(ranges)
        word = "".join(chr(r.randint(lo, hi)) for _ in range(r.randint(1, 8)))
        word += r.choice([" ", " ", " ", ", ", ". ", "\n", " 42 "])
        out.append(word)
        size += len(word.encode())
    return _fit("".join(out), nbytes)


def _fit(text: str, nbytes: int) -> str:
    data = (text * (1 + nbytes // max(1, len(text.encode())))).encode()[:nbytes]
    return data.decode("utf-8", "ignore")


class Llama:
    """llama.cpp's tokenizer via llama-cpp-python's C bindings."""

    def __init__(self, path: Path) -> None:
        import llama_cpp

        self.lib = llama_cpp
        start = time.perf_counter()
        self.llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        self.load_s = time.perf_counter() - start
        self.vocab = self.llm._model.vocab

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buf = (self.lib.llama_token * (len(data) + 8))()
        n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, len(data) + 8, False, False)
        return list(buf[:n])

    def detokenize(self, ids: list[int]) -> bytes:
        arr = (self.lib.llama_token * max(1, len(ids)))(*ids)
        size = 16 * len(ids) + 64
        out = ctypes.create_string_buffer(size)
        n = self.lib.llama_detokenize(self.vocab, arr, len(ids), out, size, False, False)
        return out.raw[: max(n, 0)]


def _time(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def bench_model(name: str, nbytes: int) -> dict[str, Any]:
    from edge_infer import hub

    path = hub.resolve_model(name)
    load_s, _ = _time(lambda: Tokenizer.from_gguf(path))
    try:
        llama: Llama | None = Llama(path)
    except ImportError:
        llama = None
    row: dict[str, Any] = {"model": name, "load_s": load_s, "llama_load_s": llama.load_s if llama else None}
    texts = {"english": english(nbytes), "code": code(nbytes), "mixed-scripts": mixed_scripts(nbytes)}
    row["encode"] = {}
    for kind, text in texts.items():
        mb = len(text.encode()) / 1e6
        tok = Tokenizer.from_gguf(path)
        cold, ids = _time(lambda: tok.encode(text, add_special=False))  # noqa: B023
        warm, _ = _time(lambda: tok.encode(text, add_special=False))  # noqa: B023
        entry: dict[str, Any] = {"mb": mb, "cold_mb_s": mb / cold, "warm_mb_s": mb / warm, "tokens": len(ids)}
        if llama is not None:
            ref_s, ref = _time(lambda: llama.tokenize(text))  # noqa: B023
            entry.update(llama_mb_s=mb / ref_s, same_ids=ref == ids)
        row["encode"][kind] = entry
    tok = Tokenizer.from_gguf(path)
    ids = tok.encode(texts["english"], add_special=False)
    dec_s, out = _time(lambda: tok.decode_bytes(ids))
    detok = tok.detokenizer()
    stream_s, _ = _time(lambda: [detok.add(i) for i in ids])
    row["decode"] = {"mb_s": len(out) / 1e6 / dec_s, "stream_us_per_token": stream_s / len(ids) * 1e6}
    prompts = [texts["english"][i : i + 200] for i in range(0, 200 * 500, 200)]
    fresh = Tokenizer.from_gguf(path)
    short_s, _ = _time(lambda: [fresh.encode(p) for p in prompts])
    row["short_prompt_us"] = short_s / len(prompts) * 1e6
    if llama is not None:
        ref_dec_s, ref_out = _time(lambda: llama.detokenize(ids))
        row["decode"].update(llama_mb_s=len(ref_out) / 1e6 / ref_dec_s, same_bytes=ref_out == out)
        ref_short_s, _ = _time(lambda: [llama.tokenize(p) for p in prompts])
        row["llama_short_prompt_us"] = ref_short_s / len(prompts) * 1e6
    return row


def _fmt(v: Any, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'model':<20} {'text':<14} {'MB':>5} {'ours cold':>10} {'ours warm':>10} {'llama.cpp':>10} {'same ids':>9}"
    )
    print(f"{'':<20} {'':<14} {'':>5} {'MB/s':>10} {'MB/s':>10} {'MB/s':>10}")
    for r in rows:
        for kind, e in r["encode"].items():
            same = "-" if "same_ids" not in e else ("yes" if e["same_ids"] else "NO")
            print(f"{r['model']:<20} {kind:<14} {e['mb']:>5.2f} {e['cold_mb_s']:>10.2f} {e['warm_mb_s']:>10.2f} "
                  f"{_fmt(e.get('llama_mb_s')):>10} {same:>9}")
    print()
    print(f"{'model':<20} {'load s':>7} {'llama s':>8} {'decode MB/s':>12} {'llama MB/s':>11} {'stream µs/tok':>14} "
          f"{'200-char encode µs':>19} {'llama µs':>9}")
    for r in rows:
        d = r["decode"]
        print(f"{r['model']:<20} {r['load_s']:>7.3f} {_fmt(r['llama_load_s'], '.3f'):>8} {d['mb_s']:>12.1f} "
              f"{_fmt(d.get('llama_mb_s'), '.1f'):>11} {d['stream_us_per_token']:>14.2f} {r['short_prompt_us']:>19.1f} "
              f"{_fmt(r.get('llama_short_prompt_us'), '.1f'):>9}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), help="hub model names")
    ap.add_argument("--mb", type=float, default=1.0, help="size of each text in MiB (default 1)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    rows = [bench_model(m, int(args.mb * (1 << 20))) for m in args.models]
    build = baseline_info()
    if args.json:
        json.dump({"llama_cpp_build": build, "models": rows}, sys.stdout, indent=2)
        print()
    else:
        print_table(rows)
        print(format_baseline(build))
    return 0


if __name__ == "__main__":
    sys.exit(main())
