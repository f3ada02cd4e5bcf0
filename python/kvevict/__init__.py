"""kvevict from Python: generation and perplexity under a KV-cache budget per (layer, KV head).

The engine is the C++ library the ``kvevict`` CLI runs (the extension module ``kvevict._kvevict``
links the same ``kvevict_core``); this package adds no engine logic. Policies, their schedule
(budget ``B``, recent buffer ``r``, sinks, prompt pinning) and their errors come from the engine's
one settings builder (docs/eviction-spec.md §2, §3), so a setting the CLI refuses is refused here
with the same message, the field spelled as this package's keyword (``buffer``, ``top_p``, ...).

Units: token ids are ``int`` in ``[0, n_vocab)``; budgets and buffers count slots per
(layer, KV head); times are milliseconds; KV bytes count K and V of every layer.

Selectors can be written in Python (:class:`Selector`, :func:`selector`): they run under the
engine's schedule like the built-in ones. ``Model.generate`` also returns per-step KV statistics
and, on request, the keep log as NumPy arrays; :func:`evaluate` runs ``kvevict eval`` in memory.

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

import csv
import io
import json
import numbers
import traceback
import warnings
from typing import Callable, Optional, Sequence, Union

import numpy as np

from . import _kvevict
from ._kvevict import Candidates, Error, Generation, ParamSpec, Perplexity, PolicyInfo

__all__ = ["Model", "Generation", "Perplexity", "PolicyInfo", "ParamSpec", "Error", "policies", "Selector",
           "selector", "Candidates", "evaluate", "EvalResult"]
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


_NEEDS = ("queries", "queries_pre", "attention")


class Selector:
    """An eviction selector written in Python: subclass it and define :meth:`score`.

    At each eviction round the engine calls ``score(c)`` once per (layer, KV head), layer-major,
    with the :class:`Candidates` ``c`` of that head: every live slot but the recent buffer,
    oldest first. Everything else is the engine's shared schedule (docs/eviction-spec.md §2),
    exactly as for the built-in selectors: when a round runs (every ``round_interval`` decode steps,
    by default ``buffer``, once ``budget + round_interval`` slots are live), the pins (``sinks`` first positions; the prompt when
    ``protect_prompt``), keeping the top ``K_sel = budget - buffer`` with ties going to the older
    slot, compaction, the recent buffer, the per-(sequence, round, layer, KV head) seed
    (``c.stream``). Pass an instance as ``policy=`` to :meth:`Model.generate` or
    :meth:`Model.perplexity`.

    Class attributes: ``name`` (results carry it; not a built-in policy's name), ``needs``
    (any of ``"queries"``: the layer's last ``window`` post-RoPE queries; ``"queries_pre"``: the
    same un-rotated to pre-RoPE; ``"attention"``: the attention each slot has accumulated since
    it entered the cache, H2O's score), ``window`` (queries held, default 64; at most
    ``kvevict._kvevict.MAX_QUERY_WINDOW`` = 65536, as snapkv's, and the model's context length),
    ``protect_prompt`` (default False) and ``sinks`` (default 0), the policy's defaults that the
    ``protect_prompt=`` / ``sinks=`` keywords override.

    ``score(c)`` returns either scores, a float array of ``c.n_candidates`` (higher = kept; NaN
    is refused), or the indices of the candidates to keep, an integer array of at most
    ``c.k_sel`` distinct values in ``[0, c.n_candidates)`` (they score 1, the others 0, so any
    room left goes to the oldest others). Anything else raises :class:`Error` naming the
    selector, layer and KV head; an exception raised by ``score`` reaches the caller of
    ``generate`` unchanged. The arrays of ``c`` are views of the engine's memory valid only
    during the call: keeping ``c`` or a view past it is an :class:`Error` (copy with
    ``numpy.array``).
    """

    name = "python"
    needs: Sequence[str] = ()
    window = 64
    protect_prompt = False
    sinks = 0

    def score(self, c: Candidates):
        raise NotImplementedError("a kvevict.Selector defines score(self, c)")

    def _policy(self, context_length: int = 0):
        if not isinstance(self.name, str) or not self.name:
            raise Error(f"selector name {self.name!r}: must be a non-empty string")
        needs = _needs(self.name, self.needs)
        window = self.window
        if not isinstance(window, numbers.Integral) or isinstance(window, bool):
            raise Error(f"selector '{self.name}' window {window!r}: must be an integer")
        # Bounded before the engine allocates the window (n_layers * window queries, up front).
        if not 1 <= window <= _kvevict.MAX_QUERY_WINDOW:
            raise Error(f"selector '{self.name}' window {window}: must be in [1, {_kvevict.MAX_QUERY_WINDOW}] "
                        f"(as snapkv's window)")
        if context_length > 0 and window > context_length and needs & {"queries", "queries_pre"}:
            raise Error(f"selector '{self.name}' window {window}: exceeds the model's context length "
                        f"{context_length}")
        return _kvevict._python_policy(self.name, _adapter(self), "queries" in needs, "queries_pre" in needs,
                                       "attention" in needs, int(window), bool(self.protect_prompt), int(self.sinks))

    def __repr__(self) -> str:
        return f"kvevict.Selector(name={self.name!r}, needs={tuple(self.needs)!r})"


def _needs(name, needs) -> set:
    """A selector's needs as a set; a single str is one need."""
    if isinstance(needs, str):
        needs = (needs,)
    try:
        needs = tuple(needs)
    except TypeError:
        raise Error(f"selector '{name}' needs {needs!r}: must be a list of {', '.join(_NEEDS)}") from None
    bad = [n for n in needs if n not in _NEEDS]
    if bad:
        raise Error(f"selector '{name}' needs {bad[0]!r}: must be one of {', '.join(_NEEDS)}")
    return set(needs)


def selector(fn: Optional[Callable] = None, *, name: Optional[str] = None, needs: Sequence[str] = (),
             window: int = 64, protect_prompt: bool = False, sinks: int = 0):
    """A :class:`Selector` whose ``score(c)`` is ``fn(c)``; usable as ``@kvevict.selector`` or
    ``@kvevict.selector(needs=["attention"])`` (a single need may be a str). ``name`` defaults to the function's name (with
    ``_`` as ``-``); the other keywords are :class:`Selector`'s class attributes."""

    def make(f):
        s = Selector()
        s.score = f
        s.name = f.__name__.replace("_", "-") if name is None else name
        if not isinstance(s.name, str) or not s.name:
            raise Error(f"selector name {s.name!r}: must be a non-empty string")
        s.needs = (needs,) if isinstance(needs, str) else tuple(needs)
        _needs(s.name, s.needs)
        s.window, s.protect_prompt, s.sinks = window, protect_prompt, sinks
        return s

    return make(fn) if fn is not None else make


def _adapter(sel: Selector):
    """What the engine calls per (layer, KV head): ``sel.score(c)``, its result checked and turned
    into float32 scores [n_candidates]."""
    score, name = sel.score, sel.name

    def call(c):
        try:
            r = score(c)
        except BaseException as e:
            del c  # a traceback kept by the caller must not hold views of the cache
            traceback.clear_frames(e.__traceback__)
            raise
        where = f"selector '{name}' (layer {c.layer}, KV head {c.kv_head})"
        if not isinstance(r, (np.ndarray, list, tuple)):
            raise Error(f"{where}: returned {type(r).__name__}; expected a 1-D array of {c.n_candidates} float scores "
                        f"or of at most {c.k_sel} integer indices")
        a = np.asarray(r)
        del r
        n = c.n_candidates
        if a.ndim != 1:
            raise Error(f"{where}: returned an array of shape {a.shape}; expected {n} scores or at most "
                        f"{c.k_sel} indices")
        if a.dtype.kind == "f":
            if a.shape[0] != n:
                raise Error(f"{where}: returned {a.shape[0]} scores for {n} candidates")
            nan = np.flatnonzero(np.isnan(a))
            if nan.size:
                raise Error(f"{where}: score {int(nan[0])} is NaN")
            return np.ascontiguousarray(a, dtype=np.float32)
        if a.dtype.kind in "iu":
            if a.shape[0] > c.k_sel:
                raise Error(f"{where}: returned {a.shape[0]} indices; the round keeps K_sel = {c.k_sel}")
            out = (a < 0) | (a >= n)
            if out.any():
                raise Error(f"{where}: index {int(a[out][0])} outside [0, {n})")
            if np.unique(a).shape[0] != a.shape[0]:
                raise Error(f"{where}: an index appears twice")
            s = np.zeros(n, dtype=np.float32)
            s[a] = 1.0
            return s
        raise Error(f"{where}: returned dtype {a.dtype}; expected float scores or integer indices")

    return call


def _policy_args(policy, budget, buffer, sinks, seed, context_length=0, round_interval=None):
    """(policy name, PythonPolicy or None, budget, buffer) with the package's defaults; warns as
    the CLI does when a policy that keeps every token is given a schedule."""
    if seed < 0:
        raise Error(f"seed {seed}: must be in [0, 2^64)")
    custom = None
    if isinstance(policy, Selector):
        custom, policy = policy._policy(context_length), policy.name
    elif not isinstance(policy, str):
        raise Error(f"policy {policy!r}: must be a policy name or a kvevict.Selector")
    else:
        base = policy[:-7] if policy.endswith("+prompt") else policy
        info = next((p for p in _kvevict.policies() if p.name == base), None)
        if info is not None and not info.evicts:
            given = [f"{k}={v}" for k, v in (("budget", budget), ("buffer", buffer), ("round_interval", round_interval),
                                             ("sinks", sinks)) if v is not None]
            if given:
                warnings.warn(f"policy '{policy}' keeps every token: {', '.join(given)} unused", stacklevel=3)
    return policy, custom, 1024 if budget is None else budget, 64 if buffer is None else buffer


def _prompt(prompt: Prompt, what: str = "prompt"):
    """A str, or a list of int token ids; anything else (bytes included) is refused, not cast."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, (list, tuple, np.ndarray)):
        raise Error(f"{what}: got {type(prompt).__name__}; expected a str or a list of int token ids")
    for t in prompt:
        if not isinstance(t, numbers.Integral) or isinstance(t, bool):
            raise Error(f"{what}: token {t!r} is {type(t).__name__}; expected a str or a list of int token ids")
    return [int(t) for t in prompt]


def _flag(name: str, value) -> bool:
    """A bool keyword; anything else is a TypeError naming it (nanobind's would list every argument)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r}: must be True or False")
    return bool(value)


def _stops(stop) -> list:
    """stop strings: one str is one stop string (as OpenAI's API), or a list of str."""
    if isinstance(stop, str):
        return [stop]
    stop = list(stop)
    for s in stop:
        if not isinstance(s, str):
            raise Error(f"stop: {s!r} is {type(s).__name__}; expected a str or a list of str")
    return stop


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

    def generate(self, prompt: Prompt, *, policy: Union[str, Selector] = "random", budget: Optional[int] = None,
                 buffer: Optional[int] = None, round_interval: Optional[int] = None, sinks: Optional[int] = None, protect_prompt: Optional[bool] = None,
                 params: Sequence[str] = (), max_tokens: int = 256, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, ignore_eos: bool = False,
                 stop: Union[str, Sequence[str]] = (), special: bool = False, kv_type: str = "f32", threads: int = 0,
                 keep_log: bool = False) -> Generation:
        """Generates up to ``max_tokens`` tokens after ``prompt`` with ``policy`` evicting the KV cache.

        ``prompt``: text (tokenized as ``kvevict generate -p``: BOS as the model says) or a list of
        token ids run as given. ``special=True``: the text holds special tokens as text (a
        :meth:`chat_prompt` result): they are parsed, and BOS is added unless the text begins
        with it (as ``kvevict generate --chat``).

        Policy and schedule (docs/eviction-spec.md §2, §3): ``policy`` is a name from
        :func:`policies` (``"full"`` never evicts; budget, buffer and sinks then do not apply and
        giving one warns, as the CLI does), with ``"+prompt"`` to pin the prompt, or a
        :class:`Selector` written in Python. ``budget`` is B (default 1024), the slots per (layer,
        KV head) kept after an eviction round; ``buffer`` is r (default 64), the newest slots
        never evicted; ``round_interval`` is s (None: r), the decode steps between rounds: a round
        runs when B + s slots are live, so a head holds at most B + s slots (R-KV's code: s = 128
        with r = 8). ``sinks``: pinned first
        positions (None: the policy's default). ``protect_prompt``: override the policy's prompt
        pinning. ``params``: selector parameters ``"[POLICY:]NAME=VALUE"``.

        Sampling: ``temperature`` 0 is greedy (argmax, lowest id on ties); ``top_p`` (1 = off),
        ``top_k`` (0 = off). ``seed`` seeds every random choice (eviction draws and sampling):
        the same seed gives the same tokens, whatever ``threads`` (0 = all cores).
        ``kv_type``: ``"f32"`` or ``"f16"`` cache elements. Generation stops at an
        end-of-generation token unless ``ignore_eos``, at ``max_tokens`` sampled tokens (an
        ending end-of-generation token counted), or before the first of the ``stop`` strings
        (a str is one stop string, as in OpenAI's API).
        The loop is the engine's one generation loop (engine/generation.h), the CLI's.

        Returns a :class:`Generation`: ``text`` (the generated text alone), ``tokens``,
        ``prompt_tokens``, ``finish_reason`` (``"stop"`` / ``"length"``), ``eviction_rounds``,
        ``peak_slots``, ``kv_bytes``, ``prefill_ms``, ``decode_ms``, ``decode_steps``,
        ``score_ms``, ``compact_ms``, ``policy``; ``steps``, per decode step a dict of NumPy arrays
        (``live_slots``, ``eviction_rounds``, ``decode_ms``, ``round_ms``); and with
        ``keep_log=True`` ``keep_log``, a dict with ``positions`` [rounds, n_layers, n_kv_heads,
        budget] (int32: the positions each (layer, KV head) holds right after each round),
        ``step`` and ``n_seen`` [rounds]. Raises :class:`Error` with the engine's message
        for an unknown policy, a budget, buffer or round interval out of range, a bad sampler setting, a negative
        seed, an empty prompt or a token id out of range; an exception raised by a Python
        selector propagates unchanged.
        """
        policy, custom, budget, buffer = _policy_args(policy, budget, buffer, sinks, seed,
                                                      self._m.context_length, round_interval)
        return self._m.generate(_prompt(prompt), policy, custom, budget, buffer, round_interval, sinks, protect_prompt,
                                list(params),
                                max_tokens, temperature, top_p, top_k, seed, _flag("ignore_eos", ignore_eos),
                                _stops(stop), _flag("special", special), kv_type, threads, _flag("keep_log", keep_log))

    def perplexity(self, text: Prompt, *, policy: Union[str, Selector] = "random", budget: Optional[int] = None,
                   buffer: Optional[int] = None, round_interval: Optional[int] = None,
                   sinks: Optional[int] = None, protect_prompt: Optional[bool] = None,
                   params: Sequence[str] = (), seed: int = 0, threads: int = 0) -> Perplexity:
        """Token-by-token perplexity of ``text`` with ``policy`` evicting throughout.

        As ``kvevict perplexity -f FILE`` without ``-c`` (StreamingLLM, arXiv 2309.17453 §4.1):
        the text is tokenized with the model's BOS (or ``text`` is a list of token ids taken as
        given); token 0 is the prompt, tokens 1..N-1 are decoded one at a time, each scored
        before it is appended. Policy keywords as in :meth:`generate` (a :class:`Selector` too).

        Returns a :class:`Perplexity`: ``ppl`` = exp(mean ``nll``), ``nll`` (nats, N - 1 values),
        ``eviction_rounds``, ``peak_slots``, ``kv_bytes`` and timings. Raises :class:`Error` for
        fewer than 2 tokens and for the policy errors of :meth:`generate`.
        """
        policy, custom, budget, buffer = _policy_args(policy, budget, buffer, sinks, seed,
                                                      self._m.context_length, round_interval)
        return self._m.perplexity(_prompt(text, "text"), policy, custom, budget, buffer, round_interval, sinks,
                                  protect_prompt, list(params), seed, threads)


class EvalResult:
    """What :func:`evaluate` returns: the rollouts and the report of ``kvevict eval``.

    ``summary``: one dict per (policy, budget) cell, the columns of the CLI's ``summary.csv``
    (numbers as int / float, empty fields as None): ``pandas.DataFrame(result.summary)``.
    ``rollouts``: one dict per rollout, the fields of the CLI's ``rollouts.jsonl`` (text
    included). ``markdown``: the table the CLI prints. ``report``: ``summary.json`` as a dict.
    """

    def __init__(self, out):
        self.rollouts = [json.loads(line) for line in out.rollouts]
        self.summary = [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(out.csv))]
        self.markdown = out.markdown
        self.report = json.loads(out.json)

    def __repr__(self) -> str:
        return f"kvevict.EvalResult({len(self.summary)} cells, {len(self.rollouts)} rollouts)"


def _number(text: str):
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def evaluate(model: Model, tasks: str, policies: Sequence[Union[str, Selector]] = ("full", "random"),
             budgets: Sequence[int] = (256,), *, buffer: int = 64, round_interval: Optional[int] = None,
             sinks: Optional[int] = None,
             protect_prompt: Optional[bool] = None, params: Sequence[str] = (), seed: int = 0,
             reference: str = "full", rollouts: int = 2, temperature: float = 0.6, top_p: float = 0.95,
             top_k: int = 0, max_length: int = 32768, max_new_tokens: int = 0, template: str = "auto",
             math_suffix: Optional[bool] = None, limit: int = 0, bootstrap: int = 10000,
             threads: int = 0) -> EvalResult:
    """Accuracy of ``policies`` x ``budgets`` on the task file ``tasks``, as ``kvevict eval``.

    The same grid (a policy that does not evict runs once, every other once per budget), prompts
    (``template``: ``"auto"``, ``"plain"`` or ``"chat"``; ``math_suffix`` defaults to on except for
    kvevict-format files), sampling (``temperature``, ``top_p``, ``top_k``, ``seed``), length caps
    (``max_length`` counts the prompt; ``max_new_tokens`` 0 = none), ``rollouts`` per problem and
    report (paired bootstrap CI and sign test against ``reference``, ``bootstrap`` resamples) as
    the CLI with the same flags (docs/eviction-spec.md §4), in memory: nothing is written, nothing
    resumed, no shards. ``policies`` may hold :class:`Selector` objects (named by their ``name``;
    one name or Selector alone is one policy); ``budgets`` are integers;
    ``buffer``, ``round_interval``, ``sinks``, ``protect_prompt``, ``params`` and ``limit`` (first N
    problems) are the CLI's ``-r``, ``--round-interval``, ``--sinks``, ``--protect-prompt``,
    ``--param`` and ``--limit``.

    Returns an :class:`EvalResult` (``summary``, ``rollouts``, ``markdown``, ``report``). Raises
    :class:`Error` with the engine's message for a bad task file, policy, budget or setting.
    """
    if seed < 0:
        raise Error(f"seed {seed}: must be in [0, 2^64)")
    if isinstance(policies, (str, Selector)):
        policies = [policies]
    if isinstance(budgets, numbers.Integral):
        budgets = [budgets]
    for b in budgets:
        if not isinstance(b, numbers.Integral) or isinstance(b, bool):
            raise Error(f"budgets: {b!r} is not an integer")
    grid = []
    for p in policies:
        if isinstance(p, Selector):
            grid.append(_kvevict._GridPolicy(p.name, p._policy(model._m.context_length)))
        elif isinstance(p, str):
            grid.append(_kvevict._GridPolicy(p, None))
        else:
            raise Error(f"policies: {p!r} is neither a policy name nor a kvevict.Selector")
    return EvalResult(_kvevict._evaluate(model._m, str(tasks), grid, [int(b) for b in budgets], buffer, round_interval,
                                         sinks, protect_prompt, list(params), seed, reference, rollouts, temperature, top_p,
                                         top_k, max_length, max_new_tokens, template, math_suffix, limit, bootstrap,
                                         threads))
