"""Context shift (context_shift=True) against llama.cpp's on the same file: llama.cpp's server
rule (keep --keep tokens plus BOS, drop half of the rest, K-shift the others) run through its
low-level API (llama_memory_seq_rm / seq_add), teacher-forced on our greedy tokens so that
every position compares the two runtimes on the same context. After each shift the first 32
tokens are llama.cpp's argmax, but for near-ties (llama.cpp's own 8-bit activations move its
argmax where two logits are within TIE_LOGITS: the forward-agreement tests' rule); with a q8_0
cache, where both re-quantize every shifted key, 90% of them. Without
the flag a full context finishes with "length", as before."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from llama_oracle import model_params

from edge_infer import LLM, SamplingParams
from edge_infer.errors import InvalidRequest

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
AFTER = 32  # tokens compared after each shift
TIE_LOGITS = 0.1


class LlamaCppShift:
    """llama.cpp fed our tokens one at a time, shifting its context as its server does."""

    def __init__(self, path: Path, n_ctx: int, keep: int, kv: str) -> None:
        self.lc = lc = pytest.importorskip("llama_cpp")
        from llama_cpp._logger import set_verbose

        set_verbose(False)
        lc.llama_backend_init()
        self.model = lc.llama_model_load_from_file(str(path).encode(), model_params(lc))
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = n_ctx + 64, 512, 512, 2, 2
        if kv != "f16":  # the same quantized KV type, flash attention on (as test_kv_agreement)
            from edge_infer.formats.weight_types import by_name

            cp.type_k = cp.type_v = by_name(kv.upper()).id
            cp.flash_attn_type = 1
        self.ctx = lc.llama_init_from_model(self.model, cp)
        vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(vocab)
        self.n_ctx, self.n_keep = n_ctx, min(n_ctx - 4, keep + int(lc.llama_vocab_get_add_bos(vocab)))

    def _decode(self, toks: list[int], pos: int) -> np.ndarray:
        lc = self.lc
        b = lc.llama_batch_init(len(toks), 0, 1)
        try:
            for i, t in enumerate(toks):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos + i, 1, i == len(toks) - 1
                b.seq_id[i][0] = 0
            b.n_tokens = len(toks)
            assert lc.llama_decode(self.ctx, b) == 0
        finally:
            lc.llama_batch_free(b)
        return np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,)).copy()

    def follow(self, prompt: list[int], ours: list[int]) -> tuple[list[np.ndarray], list[int]]:
        """llama.cpp's logits before each of our output tokens, and the outputs it shifted before."""
        lc, mem = self.lc, self.lc.llama_get_memory(self.ctx)
        logits, shifts, n_past = [self._decode(prompt, 0)], [], len(prompt)
        for i, tok in enumerate(ours[:-1]):
            if n_past + 1 >= self.n_ctx:  # llama.cpp server's rule (server-context.cpp)
                n_left = n_past - self.n_keep
                n_discard = max(0, min(n_left // 2, n_left - 1))
                lc.llama_memory_seq_rm(mem, 0, self.n_keep, self.n_keep + n_discard)
                lc.llama_memory_seq_add(mem, 0, self.n_keep + n_discard, n_past, -n_discard)
                n_past -= n_discard
                shifts.append(i + 1)
            logits.append(self._decode([tok], n_past))
            n_past += 1
        return logits, shifts

    def close(self) -> None:
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


@pytest.mark.parametrize(("n_ctx", "keep", "kv"), [(96, 8, "f16"), (128, 0, "q8_0")])
def test_tokens_after_a_shift_are_llama_cpps(smollm2_path: Path, n_ctx: int, keep: int, kv: str) -> None:
    with LLM(str(smollm2_path), context_shift=True, context_keep=keep, max_model_len=n_ctx, kv_cache_dtype=kv,
             kv_cache_memory="16MiB") as llm:
        prompt = llm.tokenizer.encode(PROMPT, add_special=True)
        out = llm.generate([prompt], SamplingParams(max_tokens=2 * n_ctx, temperature=0.0, ignore_eos=True))[0]
    ours = list(out.outputs[0].token_ids)
    assert len(ours) == 2 * n_ctx and out.outputs[0].finish_reason == "length"  # max_tokens, past the context
    m = LlamaCppShift(smollm2_path, n_ctx, keep, kv)
    try:
        logits, shifts = m.follow(prompt, ours)
    finally:
        m.close()
    assert len(shifts) >= 2
    after = [i for s in shifts for i in range(s, min(s + AFTER, len(ours)))]
    gaps = {i: float(logits[i].max() - logits[i][ours[i]]) for i in after}
    if kv == "f16":
        bad = {i: round(g, 3) for i, g in gaps.items() if g > TIE_LOGITS}
        assert not bad, f"outputs after a shift where llama.cpp's argmax is not ours (logit gaps): {bad}"
    else:  # both re-quantize the shifted keys, each with its own rounding of slightly different values
        agree = sum(g == 0.0 for g in gaps.values()) / len(gaps)
        assert agree >= 0.9, f"top-1 agreement after the shifts {agree:.2f}"


def test_a_full_context_without_the_flag_finishes_length(smollm2_path: Path) -> None:
    with LLM(str(smollm2_path), max_model_len=64, kv_cache_memory="16MiB") as llm:
        prompt = llm.tokenizer.encode(PROMPT, add_special=True)
        out = llm.generate([prompt], SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True))[0].outputs[0]
        assert out.finish_reason == "length" and len(prompt) + len(out.token_ids) == 64
        with pytest.raises(InvalidRequest, match="exceeds the maximum context length"):
            llm.generate([prompt], SamplingParams(max_tokens=100))


def test_shifted_sequences_batch_and_sample_as_alone(smollm2_path: Path) -> None:
    """Two prompts shifting at different steps, batched, give each one's tokens alone; n = 2
    samples fork and shift on their own blocks."""
    params = SamplingParams(max_tokens=150, temperature=0.0, ignore_eos=True)
    with LLM(str(smollm2_path), context_shift=True, max_model_len=80, kv_cache_memory="16MiB") as llm:
        prompts = [PROMPT, "The quick brown fox jumps over the lazy dog. " * 3]
        alone = [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]
        both = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        assert both == alone
        two = llm.generate([prompts[0]], SamplingParams(n=2, max_tokens=150, temperature=0.0, ignore_eos=True))[0]
        assert [o.token_ids for o in two.outputs] == [alone[0], alone[0]]


def test_a_chat_keeps_its_system_prompt_and_drops_whole_messages(smollm2_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Without --keep a chat's first shift keeps its system prompt and cuts where a message
    begins (the template's starts of its messages); the reply goes on past the context."""
    from edge_infer.chat import ChatTemplate

    text = Path("/usr/share/common-licenses/GPL-3").read_text()
    msgs = [{"role": "system", "content": "You are a pirate. Answer like one."}]
    msgs += [{"role": "user" if i % 2 == 0 else "assistant", "content": text[i * 160 : (i + 1) * 160]}
             for i in range(5)]
    caplog.set_level(logging.DEBUG, logger="edge_infer.engine")
    with LLM(str(smollm2_path), context_shift=True, max_model_len=256, kv_cache_memory="16MiB") as llm:
        ids = llm.chat_prompt(msgs)
        assert isinstance(ids, list) and 150 < len(ids) < 240
        starts = ChatTemplate.from_gguf(str(smollm2_path)).message_starts(msgs, llm.tokenizer, ids)
        assert len(starts) == len(msgs)  # the 5 messages after the system prompt, and the reply
        out = llm.chat(msgs, SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 200 and out.finish_reason == "length"
    shifts = [tuple(map(int, r.getMessage().rsplit("kept ", 1)[1].split(", dropped "))) for r in caplog.records
              if "context shift of request" in r.getMessage()]
    assert shifts and shifts[0][0] == starts[0] and shifts[0][0] + shifts[0][1] in starts[1:]
