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
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"check failed: {e}")
        sys.exit(1)
