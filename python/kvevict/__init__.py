"""kvevict from Python: generation and perplexity under a KV-cache budget per (layer, KV head).

The engine is the C++ library the ``kvevict`` CLI runs (the extension module ``kvevict._kvevict``
links the same ``kvevict_core``); this package adds no engine logic. Policies, their schedule
(budget ``B``, recent buffer ``r``, sinks, prompt pinning) and their errors come from the engine's
one settings builder (docs/eviction-spec.md §2, §3), so a setting the CLI refuses is refused here
with the same message, the field spelled as this package's keyword (``buffer``, ``top_p``, ...).

Units: token ids are ``int`` in ``[0, n_vocab)``; budgets and buffers count slots per
(layer, KV head); times are milliseconds; KV bytes count K and V of every layer.

Errors: every bad input raises :class:`kvevict.Error` (a :class:`ValueError`) carrying the engine's
one-line message (file, key, field, value, limit). Compute runs with the GIL released, so other
Python threads keep running during ``generate`` and ``perplexity``.

Example::

    import kvevict
    m = kvevict.Model("../shared/models/stories260K/stories260K.gguf")
    out = m.generate("Once upon a time", policy="random", budget=32, buffer=8, max_tokens=64)
    print(out.text, out.eviction_rounds, out.peak_slots)
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

from . import _kvevict
from ._kvevict import Error, Generation, ParamSpec, Perplexity, PolicyInfo

__all__ = ["Model", "Generation", "Perplexity", "PolicyInfo", "ParamSpec", "Error", "policies"]
__version__ = "0.1.0"

Prompt = Union[str, Sequence[int]]


def policies() -> list:
    """The registered eviction policies, in registry order.

    Returns a list of :class:`PolicyInfo`: ``name`` (e.g. ``"random"``; ``"NAME+prompt"`` also pins
    the prompt), ``summary``, ``source`` (paper and section), ``evicts`` (False only for
    ``"full"``), the defaults ``protect_prompt`` and ``sinks``, and ``params``: the selector's
    parameters as :class:`ParamSpec` (``name``, ``type``, ``default``, ``lo``, ``hi``,
    ``allowed``), to pass as ``params=["NAME=VALUE"]``.
    """
    return _kvevict.policies()


def _prompt(prompt: Prompt):
    if isinstance(prompt, str):
        return prompt
    return [int(t) for t in prompt]


class Model:
    """A model loaded for inference: a GGUF file or a Hugging Face checkpoint directory.

    ``Model(path)`` opens ``path``: a ``.gguf`` file (Llama, Qwen2, Qwen3, Phi-3 families), or a
    directory holding ``config.json``, ``*.safetensors`` and ``tokenizer.json`` (docs/model-families.md).
    Raises :class:`Error` naming the file and key when the file is missing, malformed or of an
    architecture kvevict does not run. Loading releases the GIL.

    Attributes (read-only): ``path``, ``arch``, ``n_layers``, ``n_heads``, ``n_kv_heads``
    (KV heads per layer; ``n_heads / n_kv_heads`` is the GQA group), ``head_dim``, ``n_vocab``,
    ``context_length`` (trained context in tokens), ``bos_id``, ``eos_id`` (-1: none).
    """

    def __init__(self, path: str):
        self._m = _kvevict.Model(str(path))

    def __getattr__(self, name):
        if name in ("path", "arch", "n_layers", "n_heads", "n_kv_heads", "head_dim", "n_vocab",
                    "context_length", "bos_id", "eos_id"):
            return getattr(self._m, name)
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"kvevict.Model({self._m.path!r}, arch={self._m.arch!r})"

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list:
        """Token ids of ``text`` (list of int, in ``[0, n_vocab)``).

        ``add_special``: add BOS first (and EOS last) when the model's tokenizer says so, as
        ``kvevict generate -p`` does. ``parse_special``: text such as ``<|im_start|>`` becomes its
        special token (for a rendered chat prompt); otherwise it is tokenized as plain text.
        Raises :class:`Error` when a byte cannot be encoded.
        """
        return self._m.tokenize(text, add_special, parse_special)

    def detokenize(self, ids: Sequence[int], special: bool = False) -> str:
        """Text of the token ids ``ids``; ``special``: render control tokens (BOS, EOS, ...) as
        their text instead of dropping them. Raises :class:`Error` for an id outside
        ``[0, n_vocab)``."""
        return self._m.detokenize([int(i) for i in ids], special)

    def chat_prompt(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                    enable_thinking: bool = True, template: str = "") -> str:
        """The model's chat template applied to ``messages``, as text.

        ``messages``: list of ``{"role": "system" | "user" | "assistant", "content": str}``.
        ``add_generation_prompt``: end with the opening of an assistant turn.
        ``enable_thinking``: False pre-closes the think block (Qwen3 / DeepSeek-R1 templates).
        ``template``: a template family name instead of the model's own (as ``--chat-template``).
        The text holds special tokens as text: pass it to :meth:`generate` with ``special=True``.
        Raises :class:`Error` when the model has no chat template, or a message lacks a string
        ``role`` or ``content``.
        """
        return self._m.chat_prompt(list(messages), add_generation_prompt, enable_thinking, template)

    def generate(self, prompt: Prompt, *, policy: str = "random", budget: int = 1024, buffer: int = 64,
                 sinks: Optional[int] = None, protect_prompt: Optional[bool] = None,
                 params: Sequence[str] = (), max_tokens: int = 256, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, ignore_eos: bool = False,
                 stop: Sequence[str] = (), special: bool = False, kv_type: str = "f32", threads: int = 0) -> Generation:
        """Generates up to ``max_tokens`` tokens after ``prompt`` with ``policy`` evicting the KV cache.

        ``prompt``: text (tokenized as ``kvevict generate -p``: BOS as the model says) or a list of
        token ids run as given. ``special=True``: the text holds special tokens as text (a
        :meth:`chat_prompt` result): they are parsed, and BOS is added unless the text begins
        with it (as ``kvevict generate --chat``).

        Policy and schedule (docs/eviction-spec.md §2, §3): ``policy`` is a name from
        :func:`policies` (``"full"`` never evicts; budget and buffer then do not apply), with
        ``"+prompt"`` to pin the prompt. ``budget`` is B, the slots per (layer, KV head) kept
        after an eviction round; ``buffer`` is r, the newest slots never evicted; a round runs
        when B + r slots are live, so a head holds at most B + r slots. ``sinks``: pinned first
        positions (None: the policy's default). ``protect_prompt``: override the policy's prompt
        pinning. ``params``: selector parameters ``"[POLICY:]NAME=VALUE"``.

        Sampling: ``temperature`` 0 is greedy (argmax, lowest id on ties); ``top_p`` (1 = off),
        ``top_k`` (0 = off). ``seed`` seeds every random choice (eviction draws and sampling):
        the same seed gives the same tokens, whatever ``threads`` (0 = all cores).
        ``kv_type``: ``"f32"`` or ``"f16"`` cache elements. Generation stops at an
        end-of-generation token unless ``ignore_eos``, at ``max_tokens`` sampled tokens (an
        ending end-of-generation token counted), or before the first of the ``stop`` strings.
        The loop is the engine's one generation loop (engine/generation.h), the CLI's.

        Returns a :class:`Generation`: ``text`` (the generated text alone), ``tokens``,
        ``prompt_tokens``, ``finish_reason`` (``"stop"`` / ``"length"``), ``eviction_rounds``,
        ``peak_slots``, ``kv_bytes``, ``prefill_ms``, ``decode_ms``, ``decode_steps``,
        ``score_ms``, ``compact_ms``, ``policy``. Raises :class:`Error` with the engine's message
        for an unknown policy, a budget or buffer out of range, a bad sampler setting, an empty
        prompt or a token id out of range.
        """
        return self._m.generate(_prompt(prompt), policy, budget, buffer, sinks, protect_prompt, list(params),
                                max_tokens, temperature, top_p, top_k, seed, ignore_eos, list(stop), special, kv_type,
                                threads)

    def perplexity(self, text: Prompt, *, policy: str = "random", budget: int = 1024, buffer: int = 64,
                   sinks: Optional[int] = None, protect_prompt: Optional[bool] = None,
                   params: Sequence[str] = (), seed: int = 0, threads: int = 0) -> Perplexity:
        """Token-by-token perplexity of ``text`` with ``policy`` evicting throughout.

        As ``kvevict perplexity -f FILE`` without ``-c`` (StreamingLLM, arXiv 2309.17453 §4.1):
        the text is tokenized with the model's BOS (or ``text`` is a list of token ids taken as
        given); token 0 is the prompt, tokens 1..N-1 are decoded one at a time, each scored
        before it is appended. Policy keywords as in :meth:`generate`.

        Returns a :class:`Perplexity`: ``ppl`` = exp(mean ``nll``), ``nll`` (nats, N - 1 values),
        ``eviction_rounds``, ``peak_slots``, ``kv_bytes`` and timings. Raises :class:`Error` for
        fewer than 2 tokens and for the policy errors of :meth:`generate`.
        """
        return self._m.perplexity(_prompt(text), policy, budget, buffer, sinks, protect_prompt, list(params), seed,
                                  threads)
