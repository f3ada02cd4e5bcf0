#!/usr/bin/env python3
"""Checks a running `kvevict serve` with the official `openai` Python client (PyPI).

Usage: serve_openai_client.py BASE_URL MODEL
Exit codes: 0 all checks passed, 1 a check failed, 3 the `openai` package is not installed.
Expected values come from the API contract (OpenAI API reference) and from the server's own
non-streamed answer for the same seed (the streamed text must equal it).
"""
import sys

try:
    import openai
except ImportError:
    print("the `openai` Python package is not installed (pip install openai)")
    sys.exit(3)


def main() -> int:
    base, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
    assert client.models.list().data[0].id == model

    kw = dict(model=model, prompt="Once upon a time", max_tokens=24, temperature=0.8, seed=7)
    r = client.completions.create(**kw)
    text = r.choices[0].text
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason in ("stop", "length"), r
    assert r.usage.prompt_tokens >= 1 and 1 <= r.usage.completion_tokens <= 24, r.usage
    parts, usage, finish = [], None, None
    for ch in client.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if ch.choices:
            parts.append(ch.choices[0].text)
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage
    assert "".join(parts) == text, ("".join(parts), text)
    assert finish == r.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage
    print(f"completions: {text!r} finish={finish} usage={r.usage.completion_tokens} tokens; streamed text equal")

    # Per-request eviction settings as extra body fields; the usage block carries kv statistics.
    r2 = client.completions.create(model=model, prompt="Once", max_tokens=48, seed=3, temperature=0.7,
                                   extra_body={"kv_policy": "random", "kv_budget": 16, "kv_buffer": 4,
                                               "ignore_eos": True})
    kv = r2.model_dump()["usage"]["kv"]
    assert kv["policy"] == "random" and kv["eviction_rounds"] > 0 and kv["peak_slots_per_kv_head"] <= 20, kv
    print(f"kv extras: {kv}")

    # logprobs (OpenAI's legacy completions shape) as the SDK parses it; the tokens spell the text.
    lp = client.completions.create(model=model, prompt="Once upon a time", max_tokens=6, temperature=0,
                                   logprobs=2, extra_body={"ignore_eos": True})
    l = lp.choices[0].logprobs
    assert len(l.tokens) == len(l.token_logprobs) == len(l.top_logprobs) == len(l.text_offset) == 6, l
    # text_offset indexes the text: each token is the text from its offset on (an end-of-generation
    # token sampled under ignore_eos is listed as its text, e.g. "</s>", and adds none).
    text = lp.choices[0].text
    assert all(v <= 0 for v in l.token_logprobs) and l.text_offset[0] == 0, l
    assert all(a <= b <= len(text) for a, b in zip(l.text_offset, l.text_offset[1:] + [len(text)])), l
    special = [len(t) > 2 and t.startswith("<") and t.endswith(">") for t in l.tokens]
    assert "".join(t for t, sp in zip(l.tokens, special) if not sp) == text, l
    assert all(text[o:].startswith(t) for t, o, sp in zip(l.tokens, l.text_offset, special) if not sp), l
    assert all(2 <= len(t) <= 3 for t in l.top_logprobs), l.top_logprobs
    print(f"logprobs: {list(zip(l.tokens, [round(v, 4) for v in l.token_logprobs]))}")

    # An array of prompts: one choice per prompt, in order.
    many = client.completions.create(model=model, prompt=["Once", "Lily"], max_tokens=3, temperature=0)
    assert [c.index for c in many.choices] == [0, 1], many

    try:
        client.completions.create(model=model, prompt="", max_tokens=4)
        raise AssertionError("empty prompt accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "prompt" in str(e), e

    chat = dict(model=model, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=16, seed=5)
    try:
        c = client.chat.completions.create(**chat)
    except openai.BadRequestError as e:
        # A model without a chat template: a 400 that names the problem.
        assert "chat template" in str(e), e
        print(f"chat: 400 {e.body['message'] if isinstance(e.body, dict) else e}")
        return 0
    ctext = c.choices[0].message.content
    assert c.object == "chat.completion" and c.choices[0].message.role == "assistant", c
    assert c.choices[0].finish_reason in ("stop", "length") and c.usage.prompt_tokens > 5, c
    sparts = [ch.choices[0].delta.content or "" for ch in client.chat.completions.create(**chat, stream=True) if ch.choices]
    assert "".join(sparts) == ctext, ("".join(sparts), ctext)
    print(f"chat: {ctext!r}; streamed text equal")
    cl = client.chat.completions.create(**chat, logprobs=True, top_logprobs=2)
    content = cl.choices[0].logprobs.content
    assert len(content) == cl.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content), content
    # Every sampled token, an ending end-of-generation token included (listed as its text).
    assert "".join(t.token for t in content).startswith(cl.choices[0].message.content), content
    assert all(bytes(t.bytes) == t.token.encode() for t in content if "\ufffd" not in t.token), content
    print(f"chat logprobs: {[(t.token, round(t.logprob, 4)) for t in content[:4]]}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"check failed: {e}")
        sys.exit(1)
