"""The Python package against independent references: the `kvevict` CLI (a second front end of
the engine, run as a subprocess) for generation and perplexity, and Hugging Face's `tokenizers`
package for tokenization. Each test says where its expected values come from."""

import re

import pytest

from conftest import SHARED, STORIES, TINYSTORIES_656K, missing, need_module

PROMPT = "Once upon a time, there was a little dog"


@pytest.mark.parametrize(
    "py_kwargs, cli_flags",
    [
        # No eviction: the forward pass and greedy sampling alone.
        (dict(policy="full"), ["--policy", "full"]),
        # Random Attention under a budget small enough for many eviction rounds (seeded draws).
        (dict(policy="random", budget=16, buffer=8, seed=7), ["--policy", "random", "-B", "16", "-r", "8", "--seed", "7"]),
    ],
)
def test_generate_equals_cli(stories, cli, py_kwargs, cli_flags):
    # Reference: `kvevict generate` stdout = prompt text + generated text + "\n".
    ref = cli("generate", "-m", STORIES, "-p", PROMPT, "-n", 60, "--temp", 0, "-t", 1, *cli_flags).stdout
    out = stories.generate(PROMPT, max_tokens=60, temperature=0.0, threads=1, **py_kwargs)
    assert PROMPT + out.text + "\n" == ref
    assert out.tokens and out.prompt_tokens[0] == stories.bos_id
    if py_kwargs["policy"] == "random":
        assert out.eviction_rounds > 0
        assert out.peak_slots <= 16 + 8
    else:
        assert out.eviction_rounds == 0


def test_generate_stats_equal_cli_summary(stories, cli):
    # Reference: the CLI's stderr summary line (eviction rounds, peak slots, KV bytes).
    r = cli("generate", "-m", STORIES, "-p", PROMPT, "-n", 50, "--temp", 0, "-B", 12, "-r", 4, "--ignore-eos")
    rounds = int(re.search(r"eviction rounds (\d+)", r.stderr).group(1))
    peak = int(re.search(r"peak slots/KV head (\d+)", r.stderr).group(1))
    kv_bytes = int(re.search(r"KV bytes (\d+)", r.stderr).group(1))
    out = stories.generate(PROMPT, budget=12, buffer=4, max_tokens=50, ignore_eos=True)
    assert (out.eviction_rounds, out.peak_slots, out.kv_bytes) == (rounds, peak, kv_bytes)
    assert len(out.tokens) == 50 and out.finish_reason == "length"


def test_round_interval_equals_cli(stories, cli):
    # Reference: the CLI's summary line with --round-interval (spec §2.3: rounds every s decode
    # steps, peak B + s), and the count of rounds that schedule gives.
    r = cli("generate", "-m", STORIES, "-p", PROMPT, "-n", 80, "--temp", 0, "-B", 24, "-r", 4,
            "--round-interval", 12, "--ignore-eos")
    rounds = int(re.search(r"eviction rounds (\d+)", r.stderr).group(1))
    out = stories.generate(PROMPT, budget=24, buffer=4, round_interval=12, max_tokens=80, ignore_eos=True)
    assert PROMPT + out.text + "\n" == r.stdout
    assert (out.eviction_rounds, out.peak_slots) == (rounds, 24 + 12)
    prompt_len = len(out.prompt_tokens)
    assert rounds == (prompt_len + 79 - 36) // 12 + 1  # lengths 36, 48, ... up to prompt + 79 decode steps


def test_perplexity_equals_cli(stories, cli, tmp_path):
    # Reference: `kvevict perplexity -f FILE` table row (perplexity printed with 4 decimals).
    src = SHARED / "data" / "tinystories" / "tinystories_sample.txt"
    if not src.exists():
        missing(str(src))
    text = src.read_text(encoding="utf-8")[:1500]
    f = tmp_path / "story.txt"
    f.write_text(text, encoding="utf-8")
    for policy, flags, kw in [
        ("full", ["--policy", "full"], dict(policy="full")),
        ("h2o", ["--policy", "h2o", "-B", "64", "-r", "16"], dict(policy="h2o", budget=64, buffer=16)),
    ]:
        out = cli("perplexity", "-m", STORIES, "-f", f, *flags).stdout
        row = next(line for line in out.splitlines() if line.startswith(policy + " "))
        ref_ppl, ref_rounds = row.split()[3], int(row.split()[4])
        got = stories.perplexity(text, **kw)
        assert f"{got.ppl:.4f}" == ref_ppl, (policy, got.ppl, row)
        assert got.eviction_rounds == ref_rounds
        assert len(got.nll) == len(stories.tokenize(text)) - 1


def test_tokenize_equals_hf_tokenizers(kvevict):
    # Reference: Hugging Face's `tokenizers` on the checkpoint's own tokenizer.json.
    tokenizers = need_module("tokenizers")
    if not (TINYSTORIES_656K / "tokenizer.json").exists():
        missing(str(TINYSTORIES_656K))
    hf = tokenizers.Tokenizer.from_file(str(TINYSTORIES_656K / "tokenizer.json"))
    model = kvevict.Model(str(TINYSTORIES_656K))
    for text in ["Once upon a time, there was a little girl named Lily.",
                 "  Tom's dog   ran\tto the park!\nThe end.", "naïve café 123 — 😀", "x"]:
        ids = model.tokenize(text)
        assert ids == hf.encode(text).ids, text
        assert model.tokenize(text, add_special=False) == hf.encode(text, add_special_tokens=False).ids, text


def test_bad_policy_raises_engine_message(stories, cli, kvevict):
    # Reference: the CLI's one-line error for the same name (both come from the settings builder).
    with pytest.raises(kvevict.Error) as e:
        stories.generate(PROMPT, policy="randon", max_tokens=4)
    assert isinstance(e.value, ValueError)
    msg = str(e.value)
    assert "randon" in msg and "random" in msg
    r = cli("generate", "-m", STORIES, "-p", PROMPT, "-n", 4, "--policy", "randon", ok=False)
    assert r.returncode != 0 and msg in r.stderr


def test_field_errors_name_the_keyword(stories, kvevict):
    # The engine names the field; the package spells it as its keyword argument.
    with pytest.raises(kvevict.Error, match="buffer"):
        stories.generate(PROMPT, budget=16, buffer=0, max_tokens=4)
    with pytest.raises(kvevict.Error, match="top_p"):
        stories.generate(PROMPT, temperature=1.0, top_p=0.0, max_tokens=4)
    with pytest.raises(kvevict.Error, match="max_tokens"):
        stories.generate(PROMPT, max_tokens=0)
    with pytest.raises(kvevict.Error, match="sinks"):
        stories.perplexity(PROMPT, sinks=-1)
    with pytest.raises(kvevict.Error, match="round_interval 0"):
        stories.generate(PROMPT, budget=16, buffer=4, round_interval=0, max_tokens=4)
    with pytest.raises(kvevict.Error):
        kvevict.Model("/nonexistent/model.gguf")


def test_same_seed_same_tokens(stories):
    kw = dict(policy="random", budget=16, buffer=8, temperature=1.0, top_p=0.95, max_tokens=60, ignore_eos=True)
    a = stories.generate(PROMPT, seed=11, threads=1, **kw)
    b = stories.generate(PROMPT, seed=11, threads=2, **kw)
    c = stories.generate(PROMPT, seed=12, threads=1, **kw)
    assert a.tokens == b.tokens and a.text == b.text
    assert a.tokens != c.tokens  # the seed reaches the sampler and the eviction draws


def test_policies_registry(kvevict):
    ps = {p.name: p for p in kvevict.policies()}
    assert {"full", "random", "h2o"} <= set(ps)
    assert not ps["full"].evicts and ps["random"].evicts
    assert ps["full"].params == []
    for p in ps.values():
        for spec in p.params:
            assert spec.type in ("number", "integer", "text") and spec.name


def test_token_ids_prompt_and_detokenize(stories):
    ids = stories.tokenize(PROMPT)
    a = stories.generate(ids, policy="full", max_tokens=20)
    b = stories.generate(PROMPT, policy="full", max_tokens=20)
    assert a.tokens == b.tokens
    assert stories.detokenize(a.tokens) == a.text


def test_chat_prompt_equals_cli_chat(kvevict, cli):
    # Reference: `kvevict generate --chat` prints the rendered prompt, then the greedy tokens.
    path = SHARED / "models" / "tiny-random" / "tiny-random-qwen3-f16.gguf"
    if not path.exists():
        missing(str(path))
    m = kvevict.Model(str(path))
    question = "What is 2+3?"
    text = m.chat_prompt([{"role": "user", "content": question}])
    out = m.generate(text, special=True, policy="full", max_tokens=8)
    ref = cli("generate", "-m", path, "--chat", "-p", question, "-n", 8, "--temp", 0, "--policy", "full").stdout
    assert text + out.text + "\n" == ref
    with pytest.raises(kvevict.Error, match="content"):
        m.chat_prompt([{"role": "user"}])


def test_stop_string_cuts_the_text(stories):
    # Reference: the same greedy run without a stop string, cut before the first match.
    full = stories.generate(PROMPT, policy="full", max_tokens=40)
    cut = full.text.index(" toys") if " toys" in full.text else None
    assert cut is not None, full.text
    out = stories.generate(PROMPT, policy="full", max_tokens=40, stop=[" toys"])
    assert out.text == full.text[:cut] and out.finish_reason == "stop"
