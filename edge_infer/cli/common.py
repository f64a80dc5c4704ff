"""What `run`, `chat` and `perplexity` share once their flags are read: loading the model,
streaming a request, the speed figures of -v, and the chat template with its stop strings."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_infer.cli.args import engine_options, lora_options
from edge_infer.errors import ChatTemplateError

if TYPE_CHECKING:
    from edge_infer.chat import ChatTemplate
    from edge_infer.engine.image_prompt import MultimodalPrompt
    from edge_infer.llm import LLM
    from edge_infer.outputs import RequestOutput
    from edge_infer.sampling_params import SamplingParams

Message = dict[str, Any]


def load_llm(args: argparse.Namespace, model: str | os.PathLike[str] | None = None) -> LLM:
    """Load the model named by -m (or `model`); validates the options before the slow part."""
    from edge_infer.llm import LLM

    opts = engine_options(args)
    if getattr(args, "lora", None):  # run's --lora: loaded with the model, applied to its request
        opts["adapters"] = lora_options(args.lora)
    t0 = time.perf_counter()
    remove = compile_notice(args)
    try:
        llm = LLM(str(model or args.model), **opts)
    finally:
        remove()
    if args.verbose:
        extra = f", seed {opts['seed']}" if "seed" in opts else ""
        spec = opts.get("speculative")
        if spec is not None:
            draft = f" {Path(spec['model']).name}" if "model" in spec else ""
            extra += f", speculative {spec['method']}{draft} k {spec.get('k', 4)}"
        print(f"edge-infer: loaded {Path(llm.plan.model_path).name} in {time.perf_counter() - t0:.2f} s "
              f"({llm.plan.device}, {llm.plan.n_threads} threads, context {llm.plan.max_model_len}{extra})", file=sys.stderr)
    return llm


COMPILE_NOTE = ("edge-infer: compiling the kernels for this CPU ({cpu}): a one-time step of about a minute "
                "(longer on slow CPUs); later runs load them from the cache in seconds")


def compile_notice(args: argparse.Namespace) -> Callable[[], None]:
    """Print COMPILE_NOTE on stderr when the first kernel of this process has to be compiled
    (not loaded from numba's cache), unless -q; returns the function that removes the hook."""
    if getattr(args, "quiet", False):
        return lambda: None
    from edge_infer.kernels_cpu.jit_cache import on_first_compile
    from edge_infer.kernels_cpu.target import cpu_name

    def note(kernel: str) -> None:
        print(COMPILE_NOTE.format(cpu=cpu_name()), file=sys.stderr, flush=True)

    return on_first_compile(note)


def stream_request(llm: LLM, prompt: str | list[int] | MultimodalPrompt, params: SamplingParams,
                   final: list[RequestOutput]) -> Iterator[str]:
    """Text deltas of one request (with every LoRA adapter loaded: run's --lora); the last
    RequestOutput is appended to `final`."""
    names = [a.name for a in llm.adapters()]
    return llm.stream(prompt, params, final=final, adapter=names or None)


def print_figures(out: RequestOutput) -> None:
    """Prompt size, time to first token and decode speed of a finished request, on stderr."""
    m = out.metrics
    n_prompt = len(out.prompt_token_ids)
    n_gen = len(out.outputs[0].token_ids)
    lines = []
    ttft = m.time_to_first_token if m else None
    if ttft is not None:
        rate = f" ({n_prompt / ttft:.1f} tokens/s)" if ttft > 0 else ""
        lines.append(f"prompt: {n_prompt} tokens, time to first token {ttft * 1000:.0f} ms{rate}")
    else:
        lines.append(f"prompt: {n_prompt} tokens")
    if m and m.first_token_time is not None and m.last_token_time is not None and n_gen > 1:
        dt = m.last_token_time - m.first_token_time  # the n_gen - 1 tokens after the first
        speed = f"{(n_gen - 1) / dt:.1f} tokens/s" if dt > 0 else "n/a"
        lines.append(f"decode: {n_gen} tokens, {speed} after the first")
    else:
        lines.append(f"decode: {n_gen} tokens")
    lines[-1] += f", finish reason: {out.finish_reason}"
    for line in lines:
        print(f"edge-infer: {line}", file=sys.stderr)


def print_spec_figures(llm: LLM) -> None:
    """Speculative decoding's acceptance rate and tokens per step so far, on stderr (nothing
    when speculation is off)."""
    m = llm.metrics()
    if "spec_proposed_tokens" not in m:
        return
    print(f"edge-infer: speculative: {m['spec_accepted_tokens']:.0f} of {m['spec_proposed_tokens']:.0f} "
          f"proposed tokens accepted ({m['spec_acceptance_rate']:.0%}), "
          f"{m['spec_tokens_per_step']:.2f} tokens per step", file=sys.stderr)


@dataclass(slots=True)
class ChatEncoder:
    """A model's chat template (or a forced built-in one) and the stop strings that go with it."""

    template: ChatTemplate
    stops: tuple[str, ...] = ()

    @classmethod
    def for_model(cls, path: str | os.PathLike[str], forced: str | None = None) -> ChatEncoder:
        """The template of the .gguf at `path`, or the built-in `forced` one (e.g. "chatml").
        A model without a template is a ChatTemplateError that says how to force one."""
        from edge_infer.chat import BUILTIN_STOPS, BUILTIN_TEMPLATES, ChatTemplate
        from edge_infer.formats.gguf import GGUFFile

        if forced is not None and forced not in BUILTIN_TEMPLATES:
            raise ChatTemplateError(
                f"unknown --template {forced!r} (built-in: {', '.join(BUILTIN_TEMPLATES)})"
            )
        from edge_infer.models.encoder_config import encoder_refusal

        with GGUFFile(path) as f:
            why = encoder_refusal(f)
            if why is not None:
                raise ChatTemplateError(why)
            own = f.metadata.get("tokenizer.chat_template")
            if forced is None and not (isinstance(own, str) and own.strip()):
                raise ChatTemplateError(
                    f"{path}: the model has no chat template (tokenizer.chat_template); "
                    f"use --template {next(iter(BUILTIN_TEMPLATES))} to force a built-in one"
                )
            t = ChatTemplate.from_gguf(f, fallback=forced)
        if forced is None:
            return cls(t)
        if not t.name.startswith("builtin"):  # the model has its own: force the built-in anyway
            t = ChatTemplate(BUILTIN_TEMPLATES[forced], bos_token=t.bos_token, eos_token=t.eos_token,
                             name=f"builtin {forced} template")
        return cls(t, BUILTIN_STOPS.get(forced, ()))

    def encode(self, llm: LLM, messages: list[Message]) -> list[int] | MultimodalPrompt:
        """Token ids of `messages` under the template, ending with the assistant's turn header
        (with image parts: a MultimodalPrompt, the model loaded with an mmproj)."""
        from edge_infer.chat.content_parts import media_marker, split_parts

        marker = media_marker()
        plain, refs = split_parts(messages, marker)
        if not refs:
            return self.template.encode(plain, llm.tokenizer, add_generation_prompt=True)
        return llm.images_prompt(self.template.encode_runs(plain, llm.tokenizer, marker), refs)

    def params(self, params: SamplingParams) -> SamplingParams:
        """`params` plus this template's stop strings."""
        if not self.stops:
            return params
        return replace(params, stop=tuple(params.stop or ()) + self.stops)
