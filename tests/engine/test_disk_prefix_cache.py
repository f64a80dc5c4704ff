"""The prefix cache on disk (prefix_cache_dir), on smollm2: a later process loads the blocks an
earlier one computed and gives the same greedy tokens; damaged, truncated, renamed and
foreign files are misses that never change the output; two processes sharing a directory
leave only whole files; the size cap removes the least recently used files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edge_infer import LLM, SamplingParams
from edge_infer.engine.disk_prefix_cache import DiskPrefixCache

TEXT = Path("/usr/share/common-licenses/GPL-3").read_text()[:3000]
N_PROMPT = 300  # tokens: 18 full blocks of 16
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

# one process: the prompt's greedy tokens and the engine's disk counters, as JSON
CHILD = """
import json, sys
from edge_infer import LLM, SamplingParams
path, cache, kv, text, n = sys.argv[1:6]
with LLM(path, prefix_cache_dir=cache, kv_cache_dtype=kv, kv_cache_memory="32MiB") as llm:
    ids = llm.tokenizer.encode(text, add_special=True)[:int(n)]
    out = llm.generate([ids], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    m = llm.metrics()
print(json.dumps({"tokens": list(out[0].outputs[0].token_ids), "hits": m["disk_hits"], "corrupt": m["disk_corrupt"]}))
"""


def run_child(model: Path, cache: Path, kv: str = "f16", n: int = N_PROMPT, wait: bool = True) -> dict | subprocess.Popen:
    args = [sys.executable, "-c", CHILD, str(model), str(cache), kv, TEXT, str(n)]
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    if not wait:
        return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def block_files(cache: Path) -> list[Path]:
    return sorted(cache.glob("*/*/*.kv"))


def test_a_later_process_loads_the_blocks_and_answers_the_same(smollm2_path: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = run_child(smollm2_path, cache)
    assert first["hits"] == 0 and len(block_files(cache)) >= (N_PROMPT - 1) // 16  # saved at exit
    second = run_child(smollm2_path, cache)
    assert second["tokens"] == first["tokens"]
    assert second["hits"] == (N_PROMPT - 1) // 16
    # another KV type is another fingerprint: nothing of the f16 blocks is read
    other = run_child(smollm2_path, cache, kv="q8_0")
    assert other["hits"] == 0 and other["corrupt"] == 0


def test_damaged_truncated_and_misnamed_files_are_misses(smollm2_path: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with LLM(str(smollm2_path), prefix_cache_dir=str(cache), kv_cache_memory="32MiB") as llm:
        ids = llm.tokenizer.encode(TEXT, add_special=True)[:N_PROMPT]
        want = llm.generate([ids], GREEDY)[0].outputs[0].token_ids
    files = block_files(cache)
    # the engine's order of the prompt's blocks: by the hash chain, so find them by their tokens
    by_tokens = {}
    for f in files:
        data = f.read_bytes()
        by_tokens[tuple(np.frombuffer(data, np.int32, 16, 8 + 32).tolist())] = f
    chain = [by_tokens[tuple(ids[i * 16 : (i + 1) * 16])] for i in range((N_PROMPT - 1) // 16)]

    def damage(k: int, f: Path) -> None:
        data = bytearray(f.read_bytes())
        if k == 0:
            data[200] ^= 0xFF  # a flipped bit
            f.write_bytes(bytes(data))
        elif k == 1:
            f.write_bytes(bytes(data[:-100]))  # truncated
        else:
            f.write_bytes(chain[3].read_bytes())  # another block's whole file under this name

    for kind, at in enumerate((5, 9, 12)):
        copy = tmp_path / f"copy{kind}"
        shutil.copytree(cache, copy)
        damage(kind, copy / chain[at].relative_to(cache))
        with LLM(str(smollm2_path), prefix_cache_dir=str(copy), kv_cache_memory="32MiB") as llm:
            out = llm.generate([ids], GREEDY)[0]
            m = llm.metrics()
        assert out.outputs[0].token_ids == want
        assert m["disk_hits"] == at
        assert m["disk_corrupt"] == 1  # logged and removed; at exit the block is saved again, whole
        data = (copy / chain[at].relative_to(cache)).read_bytes()
        assert hashlib.sha256(data[:-32]).digest() == data[-32:] and data == chain[at].read_bytes()


def test_two_processes_sharing_a_directory_leave_whole_files(smollm2_path: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    procs = [run_child(smollm2_path, cache, n=N_PROMPT + 40 * k, wait=False) for k in range(2)]
    outs = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]  # type: ignore[union-attr]
    assert all(p.returncode == 0 for p in procs)  # type: ignore[union-attr]
    files = block_files(cache)
    assert files and not list(cache.glob("*/*/.*.tmp"))
    for f in files:  # every file whole: its digest matches
        data = f.read_bytes()
        assert hashlib.sha256(data[:-32]).digest() == data[-32:], f
    again = run_child(smollm2_path, cache)
    assert again["tokens"] == outs[0]["tokens"] and again["hits"] == (N_PROMPT - 1) // 16


def test_the_size_cap_removes_the_least_recently_used(tmp_path: Path) -> None:
    cache = DiskPrefixCache(str(tmp_path), "model", max_bytes=10_000)
    blocks = [np.full((4, 256), i, np.float32) for i in range(5)]  # 4 KiB each
    for i, b in enumerate(blocks):
        cache.save(1000 + i, 0, (i,), [b])
    cache.close()  # the writer prunes as it goes: at most 10 kB remain
    left = sorted(p.stem for p in tmp_path.glob("model/*/*.kv"))
    assert 1 <= len(left) <= 2 and left[-1] == f"{1004:016x}"
    kept = DiskPrefixCache(str(tmp_path), "model", max_bytes=10_000)
    got = kept.load(1004, 0, (4,), [blocks[0]])
    assert got is not None and np.array_equal(got[0], blocks[4])
    assert kept.load(1004, 0, (5,), [blocks[0]]) is None  # other token ids: a miss
    kept.close()


@pytest.mark.parametrize("value", ["", 3])
def test_a_bad_prefix_cache_dir_is_a_clear_error(value: object) -> None:
    from edge_infer.config import EngineConfig
    from edge_infer.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="prefix_cache_dir must be a directory path"):
        EngineConfig(model="m.gguf", prefix_cache_dir=value)  # type: ignore[arg-type]


def test_blocks_evicted_from_memory_are_written_while_the_engine_runs(smollm2_path: Path, tmp_path: Path) -> None:
    """A pool of 22 blocks: a second 300-token prompt evicts most of the first one's blocks (the
    last first), which the writer thread saves then, not only at shutdown; the first prompt
    again finds its first blocks in memory and loads the others back."""
    cache = tmp_path / "cache"
    with LLM(str(smollm2_path), prefix_cache_dir=str(cache), kv_cache_memory="8MiB", max_num_seqs=1) as llm:
        ids = llm.tokenizer.encode(TEXT, add_special=True)[:N_PROMPT]
        other = llm.tokenizer.encode(TEXT[1500:] + TEXT, add_special=True)[:N_PROMPT]
        want = llm.generate([ids], GREEDY)[0].outputs[0].token_ids
        llm.generate([other], GREEDY)
        deadline = time.monotonic() + 30
        while llm.metrics()["disk_writes"] < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert llm.metrics()["disk_writes"] >= 12  # most of them (as many as the second prompt evicted), before shutdown
        again = llm.generate([ids], GREEDY)[0].outputs[0].token_ids
        assert again == want and llm.metrics()["disk_hits"] >= 1


def test_a_block_still_queued_is_loaded_from_the_queue(tmp_path: Path) -> None:
    """A prompt can come back before the writer thread reaches its blocks (a busy machine): the
    queued copy is served, checked like a file (another parent is a miss), then the file."""
    cache = DiskPrefixCache(str(tmp_path), "fingerprint", 1 << 30)
    gate, write = threading.Event(), cache._write

    def stalled(*item: object) -> None:
        gate.wait(30)
        write(*item)  # type: ignore[arg-type]

    cache._write = stalled  # type: ignore[method-assign]
    block, like = [np.arange(6, dtype=np.float32).reshape(2, 3)], [np.empty((2, 3), np.float32)]
    cache.save(7, 1, (5, 6), block)
    try:
        assert cache.has(7) and not cache._path(7).is_file()
        got = cache.load(7, 1, (5, 6), like)
        assert got is not None and np.array_equal(got[0], block[0])
        assert cache.load(7, 2, (5, 6), like) is None
        assert cache.load(7, 1, (5, 9), like) is None
    finally:
        gate.set()
        cache.flush()
    assert cache._path(7).is_file()
    got = cache.load(7, 1, (5, 6), like)
    assert got is not None and np.array_equal(got[0], block[0])
    cache.close()
