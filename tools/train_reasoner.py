#!/usr/bin/python3
"""Trains kvevict's default reasoning model on `kvevict tasks gen` output.

Usage (CPU, Debian's python3-torch; see models/reasoner/MODEL_CARD.md for the exact command that
made the shipped model):
    /usr/bin/python3 tools/train_reasoner.py --kvevict build/kvevict --out /work/runs/reasoner
    /usr/bin/python3 tools/train_reasoner.py --kvevict build/kvevict --out /work/runs/reasoner --resume
    # a variant with 1 KV head (MQA), uptrained from the shipped 2-KV-head model (models/reasoner-kv/)
    /usr/bin/python3 tools/train_reasoner.py --kvevict build/kvevict --out runs/kv1 --kv-heads 1 \\
        --init models/reasoner/reasoner.gguf --first-stage 2 --final-steps 120 --lr 1e-3 --batch-scale 0.5

Curriculum (--curriculum): `v1` is the 2-layer models' (chain, running, once up to ~720-token
traces); `v2` adds recall and revisit and grows every family to traces of ~1,000-1,300 tokens.
First the lookup alone (chain family, small alphabets), then stages of growing alphabets (facts)
and chains (steps N); a stage ends when the skill-token accuracies and the overall token accuracy
of the recent log windows pass its gate (after a minimum number of steps) or after its maximum.
"Skill" in the gate is the worst of the token kinds present (see token_kinds: the prompt lookup,
the letter value d, once's recalled code, recall's recalled value, revisit's re-read value, the
decision to restate). The last stage decays the learning rate. Each instance is its own
sequence (right-padded; causal attention never looks at padding, and padded targets are masked);
instances of similar length are batched together. Loss is on the trace and EOS only.

Outputs in --out: ckpt.pt (resumable: model, optimizer, stage, step, data cursors, RNG state,
CPU seconds), curve.csv (one row per --log-every steps), final.pt (weights + config) at the end.
"""

import argparse
import csv
import hashlib
import json
import lzma
import math
import os
import re
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reasoner_model import BOS, EOS, VOCAB_SIZE, Config, Reasoner, convert_kv_heads, encode, load_gguf  # noqa: E402

FAMILIES = ["chain", "running", "once", "recall", "revisit"]
TRACE_FAMILIES = ("recall", "revisit")

# v1: the 2-layer models' curriculum (chain, running, once).
# (facts range, {family: steps range}, batch tokens, min steps, max steps, gate skill, gate all)
STAGES_V1 = [
    ("3-8", {"chain": "2-8"}, 4096, 150, 20000, 0.95, 0.95),
    ("3-8", {"chain": "1-4", "running": "1-4", "once": "3-5"}, 4096, 100, 2000, 0.95, 0.95),
    ("4-12", {"chain": "1-10", "running": "1-8", "once": "3-10"}, 2048, 100, 3000, 0.98, 0.98),
    ("6-20", {"chain": "1-36", "running": "1-28", "once": "3-36"}, 6144, 80, 300, 0.985, 0.985),
    ("10-26", {"chain": "1-66", "running": "1-51", "once": "3-66"}, 6144, 80, 300, 0.99, 0.99),
    ("12-26", {"chain": "1-101", "running": "1-79", "once": "3-100"}, 6144, None, None, None, None),
]


def _v2(facts, chain, running, once, t_facts, t_depth, t_steps):
    fam = {"chain": (facts, chain), "running": (facts, running), "once": (facts, once)}
    for f in TRACE_FAMILIES:
        fam[f] = (t_facts, t_steps, t_depth)
    return fam


# v2: every family; recall/revisit entries are (facts, steps N, depth K) with every restate count
# 1, 2, 4, 8 (restatements start once phase B has more than 20 lines). The last stage reaches
# traces of ~1,050 tokens (chain 150 steps, running 115) and ~1,300 (recall/revisit N = 190).
# Stage 0 is a warm-up, "chain-xy": chain tasks whose trace lines "cccX=Y" are written "cccXY",
# so the lookup is the classic induction pattern (the current token X, then what followed X in
# the prompt). Without it, a 4-layer model with 8 heads of size 16 stalled at ~0.53 lookup
# accuracy for 1,700 steps (two runs): predicting Y at '=' needs the query side to fetch X from
# the previous position (Q-composition), which formed only after the key-side circuit existed.
# Before it, "chain-dense": the walk written as letters only ("KGCWAKG..."), so every trace token
# is a lookup (the current letter, then what followed it in the prompt or earlier in the trace):
# the dense next-token copying on which induction heads form fastest; chain-xy had one lookup in
# six trace tokens and a 4-layer run was still at chance (0.04) after 190 steps of it. Its
# overall gate is lower (0.85): where the line ends (after N letters, no countdown) is a count.
STAGES_V2 = [
    (None, {"chain-dense": ("3-12", "8-40")}, 2048, 50, 800, 0.95, 0.85),
    (None, {"chain-xy": ("3-8", "2-8")}, 4096, 100, 20000, 0.95, 0.95),
    (None, {"chain": ("3-8", "2-8")}, 4096, 150, 20000, 0.95, 0.95),
    (None, _v2("3-8", "1-4", "1-4", "3-5", "9-12", "3-5", "6-12"), 4096, 100, 3000, 0.95, 0.95),
    (None, _v2("4-12", "1-12", "1-10", "3-12", "10-14", "3-6", "7-40"), 4096, 100, 3000, 0.98, 0.98),
    (None, _v2("6-20", "1-40", "1-32", "3-40", "12-20", "3-8", "9-90"), 6144, 80, 1500, 0.985, 0.985),
    (None, _v2("10-26", "1-90", "1-70", "3-90", "14-26", "3-10", "11-170"), 8192, 80, 1500, 0.99, 0.99),
    (None, _v2("12-26", "1-150", "1-115", "3-150", "14-26", "3-10", "11-190"), 8192, None, None, None, None),
]
# Every trace stage draws the depth K from a range (facts >= K + 4, steps > K): two runs whose first
# trace stage had K = 3 only learned to end phase A after a fixed 3 lines instead of at the letter
# e the question names (greedy recall 0/20 at depth 6; models/reasoner/MODEL_CARD.md).
STAGES = STAGES_V2


WARMUP = {"chain-dense": "chain", "chain-xy": "chain"}  # warm-up family -> the generator family it rewrites


def warmup_trace(trace, family="chain-xy"):
    """chain-xy: "cccX=Y" lines written "cccXY"; chain-dense: the letters of the walk on one line
    ("X" of the first step, then every "Y"). The answer line is unchanged."""
    if family == "chain-dense":
        steps = re.findall(r"^\d{3}([A-Z])=([A-Z])$", trace, flags=re.M)
        return steps[0][0] + "".join(y for _, y in steps) + "\n" + trace[trace.rfind("\\boxed{"):]
    return re.sub(r"^(\d{3}[A-Z])=([A-Z])$", r"\1\2", trace, flags=re.M)


# --drill: a pseudo-family of recall tasks with a short phase B (20 lines at most), mixed into every
# stage that has recall: phase A's decisions (go / end) are ~1 token in 25 of these against ~1 in
# 125 of a stage-6 recall task, the only failure left for R = 1 in a run whose full-length recall
# was otherwise right (models/trace-reasoner/MODEL_CARD.md).
DRILL = "recall-phase-a"
# --far-drill: a pseudo-family of recall tasks with a long phase B (100 lines or more, to the
# stage's largest N), where the copies of V lie 700-1,300 tokens before the answer. With copy
# dropout, R14 (kept copy drawn from all but the last, 1,500 steps) read R = 4's first
# restatement with the later two and the memo hidden in 1 of 20 tasks but the last one in 18: the
# far kept copy behind hidden nearer ones is a few percent of its recall tasks.
FAR = "recall-far"
# The recall pseudo-families: recall's facts and depths with their own range of N, from the
# stage's deepest K and largest N: DRILL K + 1 to K + 20, FAR K + 100 (at most the largest N) to
# the largest N. In this order in a stage's family list (runs replay their draws).
RECALL_DRILLS = {
    DRILL: lambda deepest, top: f"{deepest + 1}-{deepest + 20}",
    FAR: lambda deepest, top: f"{min(deepest + 100, top)}-{top}",
}


def stage_families(stage, drills=()):
    """The families `stage` draws from; the pseudo-families of RECALL_DRILLS named in `drills`
    too where the stage has recall."""
    fams = [f for f in FAMILIES + list(WARMUP) if f in STAGES[stage][1]]
    return fams + [d for d in RECALL_DRILLS if d in drills] if "recall" in fams else fams


def stage_spec(stage, family):
    """(facts, steps, depth or None) of `family` in `stage`."""
    facts, fams = STAGES[stage][0], STAGES[stage][1]
    if family in RECALL_DRILLS:
        r_facts, r_steps, r_depth = fams["recall"]
        steps = RECALL_DRILLS[family](int(r_depth.split("-")[-1]), int(r_steps.split("-")[-1]))
        return r_facts, steps, r_depth
    spec = fams[family]
    if isinstance(spec, str):  # v1: one facts range for the stage
        return facts, spec, None
    return spec[0], spec[1], (spec[2] if len(spec) > 2 else None)


(KIND_OTHER, KIND_LOOKUP, KIND_DIGIT, KIND_SUM, KIND_PASS, KIND_ANSWER, KIND_MEMO, KIND_COPY, KIND_RECALL,
 KIND_REVISIT, KIND_RESTATE, KIND_JUMP, KIND_END, KIND_GO, KIND_HOLD, KIND_COUNT, KIND_RESUME) = range(17)
KIND_NAMES = ["other", "lookup", "digit", "sum", "pass", "answer", "memo", "copy", "recall", "revisit", "restate",
              "jump", "end", "go", "hold", "count", "resume"]
# Kinds whose accuracy gates a stage (a kind seen fewer than GATE_MIN_COUNT times in a log window
# counts as passed).
GATE_MIN_COUNT = 20
# The few tokens a task that recall or re-read a far value or make a one-off decision: weighted by
# --skill-weight, and gated with the lookup and the letter value.
SKILL_KINDS = [KIND_PASS, KIND_MEMO, KIND_COPY, KIND_RECALL, KIND_REVISIT, KIND_RESTATE, KIND_JUMP, KIND_END, KIND_GO, KIND_HOLD]
GATE_KINDS = [KIND_LOOKUP, KIND_DIGIT] + SKILL_KINDS


def token_kinds(trace, family=None):
    """Per trace character: which skill predicts it (tasks/generator.h line formats).
    lookup = Y of a step line "cccX=Y..." (the letter after X in the prompt); digit = d of a running
    line "cccX=Yds" (the value of Y, a fixed function); sum = s; memo = V of recall/revisit's
    phase-A line "cccX=Yd&V" (the running sum, keyed by '&'); copy = V of a restatement "&V";
    restate = the '&' or '!' that opens a restatement or checkpoint line (the decision to write
    one); revisit = W of a checkpoint "!W" or of revisit's answer (V re-read and added to the
    letter value); recall = V inside recall's final \\boxed{} (after '&'); pass = once's code P
    inside the final \\boxed{}; answer = the other characters inside the final \\boxed{} and its
    closing brace; jump = X of recall/revisit's first phase-B line (the start letter b, read after
    '+' in the question: one token a task, which teacher-forced accuracy hides but a greedy run
    needs); end = the '&' of phase A's last line "cccX=Yd&V" (Y is the letter e after '>' in the
    question: phase A ends); go = the s of the phase-A lines before it (`family` given; Y is not
    e: phase A goes on); hold = the first countdown
    digit of a phase-B line that follows a step line (no restatement here: the negative outcome of
    'restate', which teacher-forced 'restate' accuracy alone does not see; a run that weighted it
    only after countdowns that are multiples of 20, where a larger R would restate, learned to
    restate after 150, where no R does: greedy recall R = 4 0.60 -> 0.28); count = the countdown
    digits of a line whose countdown is not the line above's less one: the first trace line (the
    question's count less one) and the step line after a memo line, a restatement "&V" or a
    checkpoint "!W" (the step line two above less one; every 10th a borrow, 159 after 160). A
    run that tracked only 'end' had it at 0.95 while ending phase A after 3 lines of 5 in greedy runs; with both tracked
    and weighted alike, a run sat at 0.83 over both, what the count prior "end after 3-6 lines"
    scores in stage 4. resume = X of a step line right after a restatement "&V" or checkpoint "!W"
    (the previous step line's Y, read across that line): the 8-KV-head run's p7 wrote it wrong in 18
    of 25 failures on recall R = 2 (it took the X of the step line above instead), where as 'other'
    it weighed 1. Not a skill kind: weighted only through --kind-weight resume=N, so earlier
    recipes train as before."""
    kinds = [KIND_OTHER] * len(trace)
    if trace[:3].isdigit():
        kinds[0:3] = [KIND_COUNT] * 3
    b = trace.rfind("\\boxed{")
    pos = 0
    after_memo = False
    in_phase_a = family in TRACE_FAMILIES
    in_phase_b = prev_step = prev_extra = False
    for line in trace[:b].split("\n"):
        step = len(line) >= 6 and line[:3].isdigit()
        if (after_memo or prev_extra) and step:
            kinds[pos:pos + 3] = [KIND_COUNT] * 3
        if prev_extra and step:
            kinds[pos + 3] = KIND_RESUME
        prev_extra = len(line) == 2 and line[0] in "&!"
        if after_memo and step:
            kinds[pos + 3] = KIND_JUMP
        elif in_phase_b and prev_step and line[:3].isdigit():
            kinds[pos] = KIND_HOLD  # no restatement or checkpoint after the previous step line
        prev_step = step
        in_phase_b = in_phase_b or after_memo
        after_memo = len(line) == 9 and line[:3].isdigit() and line[7] == "&"
        in_phase_a = in_phase_a and not after_memo
        if len(line) == 5 and line[:3].isdigit() and line[3:].isalpha():  # warm-up "cccXY"
            kinds[pos + 4] = KIND_LOOKUP
        elif len(line) >= 2 and line.isalpha() and line.isupper():  # warm-up chain-dense "XYZ..."
            for i in range(1, len(line)):
                kinds[pos + i] = KIND_LOOKUP
        elif len(line) >= 6 and line[:3].isdigit():
            kinds[pos + 5] = KIND_LOOKUP
            if len(line) >= 8:
                kinds[pos + 6] = KIND_DIGIT
                if len(line) == 8:
                    # In recall/revisit's phase A, s is also the decision that phase A goes on (Y is not
                    # e): tracked as 'go', so a model that ends phase A early fails it.
                    kinds[pos + 7] = KIND_GO if in_phase_a else KIND_SUM
                elif len(line) == 9 and line[7] == "&":
                    kinds[pos + 7] = KIND_END
                    kinds[pos + 8] = KIND_MEMO
        elif len(line) == 2 and line[0] in "&!":
            kinds[pos] = KIND_RESTATE
            kinds[pos + 1] = KIND_COPY if line[0] == "&" else KIND_REVISIT
        pos += len(line) + 1
    # The closing '}' too: a run that weighted it as 'other' (1 beside skills at 20-80) left 2 of
    # R16's 4 revisit failures at 166 steps (n = 40) with a right W and no '}' ("\boxed{K!443333").
    for i in range(b + 7, len(trace)):
        kinds[i] = KIND_ANSWER
    if family == "once":
        kinds[len(trace) - 2] = KIND_PASS
    elif family == "recall":
        kinds[len(trace) - 2] = KIND_RECALL
    elif family == "revisit":
        kinds[len(trace) - 2] = KIND_REVISIT
    return kinds


class Data:
    """Instances from the kvevict binary, per (stage, family), with persistent cursors."""

    def __init__(self, binary, cursors, cache=None):
        """cache: optional folder of `tasks gen` outputs (one xz file per call, named by a hash of its
        arguments): a call whose file is there is read from it, any other is run and its output
        written there, so a machine without the binary (the GPU machine) can train from a filled
        folder. The files hold what this binary wrote: fill a folder with the binary you mean."""
        self.binary = binary
        self.cursors = cursors  # "stage:family" -> next task index
        self.pool = {}
        self.cache = cache
        if cache:
            os.makedirs(cache, exist_ok=True)

    CHUNK = 2000  # tasks per `kvevict tasks gen` call; a (stage, family) cursor moves in these steps

    @staticmethod
    def gen_args(stage, family, first):
        """The `kvevict` arguments that write tasks first .. first + CHUNK - 1 of (stage, family)."""
        facts, steps, depth = stage_spec(stage, family)
        # Training seeds are 1..999 (held-out evaluation uses seed >= 1000).
        gen_family = "recall" if family in RECALL_DRILLS else WARMUP.get(family, family)
        args = ["tasks", "gen", "--family", gen_family, "--count", str(Data.CHUNK), "--seed", str(100 + stage),
                "--first", str(first), "--steps", steps, "--facts", facts]
        if gen_family in TRACE_FAMILIES:
            args += ["--depth", depth or "6", "--restate", "1,2,4,8"]
        return args

    def gen(self, args):
        """stdout of `kvevict ARGS`, from the cache folder when it holds it."""
        path = None
        if self.cache:
            path = os.path.join(self.cache, hashlib.sha1(" ".join(args).encode()).hexdigest()[:20] + ".jsonl.xz")
            if os.path.exists(path):
                with lzma.open(path, "rt") as f:
                    return f.read()
        if not os.access(self.binary, os.X_OK):
            sys.exit(f"--kvevict {self.binary}: not executable, and the task cache {self.cache} has no "
                     f"{path} for: kvevict {' '.join(args)}")
        out = subprocess.run([self.binary] + args, check=True, capture_output=True, text=True).stdout
        if path:
            tmp = f"{path}.{os.getpid()}.tmp"  # runs sharing a cache may write the same file at once
            with lzma.open(tmp, "wt", preset=9) as f:
                f.write(out)
            os.replace(tmp, path)
        return out

    def take(self, stage, family, k):
        key = f"{stage}:{family}"
        pool = self.pool.setdefault(key, [])
        while len(pool) < k:
            first = self.cursors.get(key, 0)
            out = self.gen(self.gen_args(stage, family, first))
            tasks = [json.loads(line) for line in out.splitlines() if line]
            if family in WARMUP:
                for t in tasks:
                    t["trace"], t["family"] = warmup_trace(t["trace"], family), family
            pool.extend(tasks)
            self.cursors[key] = first + self.CHUNK
        taken, self.pool[key] = pool[:k], pool[k:]
        return taken


def copy_dropout_hide(kinds, offset, gen, keep="uniform"):
    """One recall task under --copy-dropout: one of V's copies drawn uniformly is kept (with
    `keep` = "not-last", drawn uniformly from all but the last copy, the one a full cache is read
    from anyway; with "restatement", from the restatements before the last one, or the memo where
    there is only one restatement; with "any-restatement", from every restatement, the last
    included, never the memo: R = 2's condition in the ablation test, the restatement alone,
    which "restatement" never trains); every other
    copy is hidden from all queries after it, and phase A's digits from all queries after the memo
    line, as the trace ablation test hides them (tests/trace_ablation_test.cpp: a position is
    removed from the cache once written). Hiding a copy only from the queries after the kept one
    was tried first and taught nothing: the positions between the memo line and the kept copy had
    read V from the memo and carried it in their layer-1 keys and values (R = 2 with the memo
    hidden: 4/20 after 450 steps, as before). Returns ([(first query position, key position)],
    [trace offsets of copies whose V is then unpredictable: the restatements up to the kept one,
    when it is not the memo]); positions are sequence positions (trace offset + `offset`).
    `kinds`: token_kinds of the trace (family recall): V's copies are the memo and copy kinds,
    phase A's digits the digit and go kinds before the memo."""
    copies = [o for o, k in enumerate(kinds) if k in (KIND_MEMO, KIND_COPY)]
    if len(copies) < 2:
        return [], []
    if keep == "restatement" and len(copies) > 2:  # a restatement other than the last: r1 .. r(n-2)
        i = 1 + int(torch.randint(0, len(copies) - 2, (1,), generator=gen))
    elif keep == "any-restatement":  # r1 .. r(n-1)
        i = 1 + int(torch.randint(0, len(copies) - 1, (1,), generator=gen))
    else:
        i = int(torch.randint(0, len(copies) - (keep != "uniform"), (1,), generator=gen))
    memo = copies[0]
    digits = [o for o, k in enumerate(kinds[:memo]) if k in (KIND_DIGIT, KIND_GO)]
    pairs = [(memo + 1 + offset, j + offset) for j in digits]
    pairs += [(j + 1 + offset, j + offset) for n, j in enumerate(copies) if n != i]
    return pairs, copies[1:i + 1]


def make_batch(tasks, copy_dropout=0.0, gen=None, copy_keep="uniform"):
    """Token ids, targets, loss mask and token kinds [B, T] of a batch; with `copy_dropout` > 0,
    also the attention hide mask [B, T, T] (None when no task drew it): each recall task with
    more than one copy of V gets copy_dropout_hide with that probability, and the copies it makes
    unpredictable leave the loss."""
    seqs, masks, kinds, hides = [], [], [], []
    for t in tasks:
        p = [BOS] + encode(t["problem"])
        tr = encode(t["trace"]) + [EOS]
        seq = p + tr
        # target j = seq[j+1]; trace targets start at j = len(p) - 1
        m = [0] * (len(p) - 1) + [1] * len(tr)
        kd = [0] * (len(p) - 1) + token_kinds(t["trace"], t["family"]) + [KIND_OTHER]
        seqs.append(seq)
        masks.append(m)
        kinds.append(kd)
        pairs = []
        if copy_dropout > 0 and t["family"] == "recall" and float(torch.rand(1, generator=gen)) < copy_dropout:
            pairs, blind = copy_dropout_hide(kd[len(p) - 1:], len(p), gen, copy_keep)
            for o in blind:  # the target at trace offset o is predicted at position len(p) - 1 + o
                m[len(p) - 1 + o] = 0
        hides.append(pairs)
    T = max(len(s) for s in seqs) - 1
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    tgt = torch.zeros(len(seqs), T, dtype=torch.long)
    msk = torch.zeros(len(seqs), T)
    knd = torch.zeros(len(seqs), T, dtype=torch.long)
    for i, s in enumerate(seqs):
        n = len(s) - 1
        ids[i, :n] = torch.tensor(s[:-1])
        tgt[i, :n] = torch.tensor(s[1:])
        msk[i, :n] = torch.tensor(masks[i], dtype=torch.float)
        knd[i, :n] = torch.tensor(kinds[i])
    hide = None
    if any(hides):
        hide = torch.zeros(len(seqs), T, T, dtype=torch.bool)
        for i, pairs in enumerate(hides):
            for q, j in pairs:
                hide[i, q:, j] = True
    return ids, tgt, msk, knd, hide


def task_tokens(t):
    return len(t["problem"]) + len(t["trace"]) + 2


def sample_batch(data, stage, gen, batch_tokens, queue, mix=None):
    """Next batch of the stage: instances (family drawn per instance among the stage's families,
    uniformly or in the proportions of `mix`, family -> relative weight, default 1) are drawn in
    pools of ~8 batches' worth, sorted by length and cut into batches whose padded size (longest x
    count) stays within batch_tokens, so similar lengths share a batch; the batches of a pool are
    served in random order. `queue` holds the pool's remaining batches (a plain list, saved in the
    checkpoint)."""
    if not queue:
        fams = stage_families(stage, mix or {})
        probs = torch.tensor([float((mix or {}).get(WARMUP.get(f, f), 1.0)) for f in fams])
        pool, total = [], 0
        while total < 8 * batch_tokens:
            if mix:
                fam = fams[int(torch.multinomial(probs, 1, generator=gen))]
            else:  # the original draw, so runs without --mix replay exactly
                fam = fams[int(torch.randint(0, len(fams), (1,), generator=gen))]
            t = data.take(stage, fam, 1)[0]
            pool.append(t)
            total += task_tokens(t)
        pool.sort(key=task_tokens)
        batches, cur = [], []
        for t in pool:
            if cur and task_tokens(t) * (len(cur) + 1) > batch_tokens:
                batches.append(cur)
                cur = []
            cur.append(t)
        batches.append(cur)
        for i in torch.randperm(len(batches), generator=gen).tolist():
            queue.append(batches[i])
    return queue.pop(0)


def parse_weights(flag, text, names, positive=False):
    """NAME=W[,NAME=W...] -> {name: float}; exits naming the flag and the item when a name is not
    in `names`, W is not a number, or (`positive`) W <= 0."""
    out = {}
    for item in filter(None, text.split(",")):
        name, _, w = item.partition("=")
        try:
            out[name] = float(w)
        except ValueError:
            sys.exit(f"{flag} {text}: '{item}' is not name=weight")
        if name not in names or (positive and not out[name] > 0):
            sys.exit(f"{flag} {text}: '{item}': name must be one of {', '.join(names)}" + (", weight > 0" if positive else ""))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvevict", required=True, help="path to the built kvevict binary")
    ap.add_argument("--task-cache", help="folder of `kvevict tasks gen` outputs read before running the binary and "
                    "filled by it (see Data): how a machine without the binary trains")
    ap.add_argument("--out", required=True, help="run folder (checkpoint, curve)")
    ap.add_argument("--resume", action="store_true", help="continue from <out>/ckpt.pt")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (2 was ~6x slower on a shared 2-core machine)")
    ap.add_argument("--device", default="cpu",
                    help="torch device of the model and batches: cpu (default; with --threads 1, bit-reproducible) or "
                         "cuda / cuda:N (float32, TF32 off; not bit-reproducible: CUDA's backward sums in varying order)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--final-steps", type=int, default=600, help="steps of the last stage (lr decays over them)")
    ap.add_argument("--stop-after-min", type=float, default=0, help="checkpoint and exit after this many wall minutes (0 = off)")
    ap.add_argument("--stop-after-cpu-min", type=float, default=0,
                    help="checkpoint and exit once the run's CPU time (all sessions) passes this many minutes (0 = off)")
    ap.add_argument("--stop-after-steps", type=int, default=0,
                    help="checkpoint and exit once the run's step count reaches this (0 = off; the model card's "
                    "restarts happened at given steps)")
    ap.add_argument("--stop-after-stage", type=int, default=-1,
                    help="stop when this stage ends (its stage<N>.pt written), so the next run of a recipe can "
                    "start the following stage with other loss weights (tools/train-trace-reasoner.sh); -1 = off")
    ap.add_argument("--force-stage", type=int, default=-1, help="with --resume: restart the curriculum at this stage")
    ap.add_argument("--batch-scale", type=float, default=1.0,
                    help="multiply every stage's batch tokens by this (a cheaper fine-tune on a busy machine)")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--ckpt-every-s", type=float, default=120)
    ap.add_argument("--curriculum", choices=["v1", "v2"], default="v2",
                    help="v1: the 2-layer models' three families; v2: all five families, traces to ~1,300 tokens")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=384, help="SwiGLU hidden size")
    ap.add_argument("--heads", type=int, default=8, help="query heads")
    ap.add_argument("--rope-theta", type=float, default=10000.0,
                    help="RoPE base; larger keeps more low-frequency pairs nearly unrotated over ~1,000 tokens, the "
                    "dimensions a content lookup at that distance can use")
    ap.add_argument("--head-dim", type=int, default=0, help="size of each head (0 = dim / heads)")
    ap.add_argument("--kv-heads", type=int, default=4,
                    help="KV heads, each initialised independently (must divide --heads; 1 = MQA, --heads = MHA). "
                    "With --init weights that "
                    "have another count, their K/V projections are converted first (reasoner_model.convert_kv_heads: "
                    "mean-pooled to fewer heads, copied to more) and the run uptrains the result")
    ap.add_argument("--init", help="start from these weights (a final.pt or ckpt.pt of the same shape, or a GGUF "
                    "written by export_gguf.py) with a fresh optimizer and curriculum, instead of random initialisation")
    ap.add_argument("--first-stage", type=int, default=0, help="curriculum stage to start at (with --init)")
    ap.add_argument("--shared-embed", type=float, default=0.05,
                    help="initial value of embedding dim 0 for all tokens (see reasoner_model.Reasoner)")
    ap.add_argument("--skill-weight", type=float, default=1.0,
                    help="loss weight of the few tokens that recall or re-read a far value (once's code, recall's and "
                    "revisit's answers and copies, the memo value V of recall/revisit's phase-A line, the decision that ends phase A, "
                    "phase B's start letter, the restate decisions); 1 = plain mean")
    ap.add_argument("--lookup-weight", type=float, default=1.0,
                    help="loss weight of the lookup tokens (Y of X=Y), about 1 in 7 trace tokens; > 1 speeds up the "
                    "forming of the lookup (induction) circuit")
    ap.add_argument("--far-weight", type=float, default=0.0,
                    help="loss weight of the far copies alone (recall's answer V, a restated copy &V, revisit's "
                    "re-read W), overriding --skill-weight for them; 0 = --skill-weight. A run with --skill-weight 5 "
                    "had them at chance after 6,000 steps: ~3 such tokens in a batch of ~8,000 (models/reasoner/MODEL_CARD.md)")
    ap.add_argument("--end-weight", type=float, default=0.0,
                    help="loss weight of the decision that ends phase A (kind 'end', one a task); 0 = --skill-weight")
    ap.add_argument("--go-weight", type=float, default=0.0,
                    help="loss weight of the decisions that phase A goes on (kind 'go', depth - 1 a task); 0 = --skill-weight. "
                    "--end-weight ~ (depth - 1) x --go-weight balances the two outcomes, so the count prior no longer pays")
    ap.add_argument("--count-weight", type=float, default=0.0,
                    help="loss weight of the countdowns not copied from the line above (kind 'count': the first trace "
                    "line's, and the step line's after a memo, restatement or checkpoint line); > 0 also gates the "
                    "stages on it. 0 = plain weight 1 and no gate, as the earlier runs had it: the interim model's "
                    "greedy chain/once failures at ~600 tokens were 7 of 7 a wrong first countdown (084 or 007 for "
                    "083), and 9 of 20 recall R = 1 failures at 166 steps of a stage-6 run from it (R7) the countdown "
                    "after the memo line (109, 199 or 059 for 159) (models/trace-reasoner/MODEL_CARD.md)")
    ap.add_argument("--hold-weight", type=float, default=1.0,
                    help="loss weight of phase B's 'no restatement here' decisions (kind 'hold', every phase-B line); "
                    "the restate decisions themselves weigh --skill-weight (or --restate-weight)")
    ap.add_argument("--kind-weight", default="",
                    help="loss weights by token kind, KIND=W[,KIND=W...] (kinds: " + ", ".join(KIND_NAMES[1:]) + "), "
                    "applied after the per-kind flags. A run weighting the skills at 40-80 and 'sum' at 1 lost running's "
                    "sums (greedy running 0.95 -> 0.55 in 450 steps)")
    ap.add_argument("--restate-weight", type=float, default=0.0,
                    help="loss weight of the restate decisions (kind 'restate'); 0 = --skill-weight")
    ap.add_argument("--drill", type=float, default=0.0,
                    help="mix weight of recall tasks with a short phase B (<= 20 lines) in every stage with recall "
                    "(the families weigh 1 or their --mix weight); 0 = off")
    ap.add_argument("--far-drill", type=float, default=0.0,
                    help="mix weight of recall tasks with a long phase B (>= 100 lines) in every stage with recall; "
                    "0 = off")
    ap.add_argument("--copy-dropout", type=float, default=0.0,
                    help="probability that a recall task with more than one copy of V is trained with one copy kept, "
                    "the others hidden from attention after themselves and phase A's digits after the memo line "
                    "(copy_dropout_hide); 0 = off. "
                    "Without it the model read V from the memo line only: with the memo hidden and a restatement "
                    "~600 tokens nearer in the cache, 4/20 (tests/trace_ablation_test.cpp; MODEL_CARD.md)")
    ap.add_argument("--copy-keep", choices=["uniform", "not-last", "restatement", "any-restatement"],
                    default="uniform",
                    help="which copy --copy-dropout keeps: any (uniform), any but the last (not-last), a "
                    "restatement before the last (restatement; the memo when there is one restatement), or any "
                    "restatement, the last included, never the memo (any-restatement). R13 (uniform) read a "
                    "later copy with the memo hidden (15/20) but not R = 4's first restatement with the memo and "
                    "the later two hidden (0/20); R14 (not-last) read the memo (13/20) and R = 4's second "
                    "restatement (13/20) alone, not its first, ~120 lines back (1/20; MODEL_CARD.md, Next)")
    ap.add_argument("--mix", default="",
                    help="family proportions, e.g. recall=3,revisit=3 (a family not named weighs 1; default uniform)")
    args = ap.parse_args()
    mix = parse_weights("--mix", args.mix, FAMILIES, positive=True)
    kind_weights = parse_weights("--kind-weight", args.kind_weight, KIND_NAMES[1:])
    if args.heads < 1 or (not args.head_dim and args.dim % args.heads != 0):
        sys.exit(f"--heads {args.heads}: must divide --dim {args.dim} (or give --head-dim)")
    if args.kv_heads < 1 or args.heads % args.kv_heads != 0:
        sys.exit(f"--kv-heads {args.kv_heads}: must divide the {args.heads} query heads")
    for flag, family, weight in (("--drill", DRILL, args.drill), ("--far-drill", FAR, args.far_drill)):
        if weight < 0:
            sys.exit(f"{flag} {weight}: must be >= 0")
        if weight > 0:
            mix[family] = weight
    if not 0 <= args.copy_dropout <= 1:
        sys.exit(f"--copy-dropout {args.copy_dropout}: must be a probability in [0, 1]")
    global STAGES
    STAGES = STAGES_V1 if args.curriculum == "v1" else STAGES_V2
    if not -1 <= args.stop_after_stage < len(STAGES) - 1:
        sys.exit(f"--stop-after-stage {args.stop_after_stage}: must be -1 (off) or a stage before the last "
                 f"({len(STAGES) - 1}), which ends the run anyway")

    try:
        dev = torch.device(args.device)
    except RuntimeError as e:
        sys.exit(f"--device {args.device}: {e}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"--device {args.device}: this torch build sees no CUDA device")
    if dev.type not in ("cpu", "cuda"):
        sys.exit(f"--device {args.device}: must be cpu or cuda[:N]")
    # float32 throughout, as on the CPU: no TF32 matrix products on the GPU.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    os.makedirs(args.out, exist_ok=True)
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    curve_path = os.path.join(args.out, "curve.csv")

    torch.manual_seed(args.seed)
    cfg = Config(dim=args.dim, n_layers=args.layers, n_heads=args.heads, n_kv_heads=args.kv_heads,
                 hidden_dim=args.hidden, vocab_size=VOCAB_SIZE if args.curriculum == "v2" else 312,
                 head_dim=args.head_dim or None, rope_theta=args.rope_theta)
    model = Reasoner(cfg, shared_embed=args.shared_embed).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    state = {"step": 0, "stage": args.first_stage, "stage_step": 0, "cpu_s": 0.0, "wall_s": 0.0, "tokens": 0,
             "cursors": {}, "queue": [], "curriculum": args.curriculum}
    if args.init and not args.resume:
        init = load_gguf(args.init) if args.init.endswith(".gguf") else torch.load(args.init, map_location="cpu", weights_only=False)
        init_kv = Config.from_dict(init["config"]).n_kv_heads
        if init_kv != args.kv_heads:
            parent = Reasoner(Config.from_dict(init["config"]))
            parent.load_state_dict(init["model"])
            try:
                init = convert_kv_heads(init, args.kv_heads)
            except ValueError as e:
                sys.exit(f"--init {args.init} --kv-heads {args.kv_heads}: {e}")
            # How far the conversion moved the function: max |logit difference| to the parent on
            # one problem of the first stage (0 up to float rounding when heads are only copied).
            probe = Reasoner(Config.from_dict(init["config"]))
            probe.load_state_dict(init["model"])
            t = Data(args.kvevict, {}).take(args.first_stage, "chain", 1)[0]
            ids = torch.tensor([[BOS] + encode(t["problem"] + t["trace"])])
            with torch.no_grad():
                diff = float((probe(ids) - parent(ids)).abs().max())
            print(f"converted {init_kv} -> {args.kv_heads} KV heads; max |logit change| on one problem: {diff:.3g}",
                  flush=True)
        if Config.from_dict(init["config"]).to_dict() != cfg.to_dict():
            sys.exit(f"--init {args.init}: config {init['config']} differs from {cfg.to_dict()}")
        model.load_state_dict(init["model"])
        print(f"initialised from {args.init}", flush=True)
    if args.resume:
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        cfg = Config.from_dict(ck["config"])
        model = Reasoner(cfg).to(dev)
        model.load_state_dict(ck["model"])
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        torch.set_rng_state(ck["torch_rng"])
        state = ck["state"]
        state.setdefault("queue", [])
        if state.get("curriculum", "v1") != args.curriculum:
            sys.exit(f"--resume: the run used --curriculum {state.get('curriculum', 'v1')}")
        if args.force_stage >= 0:
            state["stage"], state["stage_step"], state["queue"] = args.force_stage, 0, []
        print(f"resumed at step {state['step']} stage {state['stage']} cpu {state['cpu_s']:.0f}s", flush=True)
        header = ["step", "stage", "tokens", "cpu_s", "wall_s", "lr", "loss", "acc"] + [f"acc_{k}" for k in KIND_NAMES[1:]]
        with open(curve_path, newline="") as f:
            rows = list(csv.reader(f))
        if rows and rows[0] != header:  # a run from before a token kind was added: pad its rows
            with open(curve_path, "w", newline="") as f:
                csv.writer(f).writerows([header] + [r + [""] * (len(header) - len(r)) for r in rows[1:]])
    else:
        with open(curve_path, "w", newline="") as f:
            csv.writer(f).writerow(["step", "stage", "tokens", "cpu_s", "wall_s", "lr", "loss", "acc"]
                                   + [f"acc_{k}" for k in KIND_NAMES[1:]])
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters, config {cfg.to_dict()}", flush=True)

    data = Data(args.kvevict, state["cursors"], args.task_cache)
    cpu0, wall0 = time.process_time(), time.time()
    cpu_base, wall_base = state["cpu_s"], state["wall_s"]
    last_ckpt = time.time()
    def new_window():
        # Sums stay on the device until a log row, so they add no host sync to a step (a GPU step is
        # a few ms; the batch's copy from pageable host memory still waits once per step).
        return {"loss": torch.zeros((), dtype=torch.float64, device=dev), "n": 0,
                "right": torch.zeros(len(KIND_NAMES), device=dev),
                "count": torch.zeros(len(KIND_NAMES), device=dev), "steps": 0}
    win = new_window()
    recent = []  # (skill acc, all acc) of the last log windows, for the stage gate
    weights = torch.ones(len(KIND_NAMES))
    for k in SKILL_KINDS:
        weights[k] = args.skill_weight
    weights[KIND_LOOKUP] = args.lookup_weight
    weights[KIND_HOLD] = args.hold_weight
    gate_kinds = GATE_KINDS + ([KIND_COUNT] if args.count_weight > 0 else [])
    # Per-kind overrides (0 = keep --skill-weight, or 1 for 'count').
    for kinds_of, w in (((KIND_END,), args.end_weight), ((KIND_GO,), args.go_weight),
                        ((KIND_RESTATE,), args.restate_weight), ((KIND_COPY, KIND_RECALL, KIND_REVISIT), args.far_weight),
                        ((KIND_COUNT,), args.count_weight)):
        for k in kinds_of:
            weights[k] = w if w > 0 else weights[k]
    for name, w in kind_weights.items():
        weights[KIND_NAMES.index(name)] = w

    weights = weights.to(dev)

    def cpu_state():  # checkpoints hold CPU tensors whatever --device trained them
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}

    def save(path=ckpt_path):
        state["cpu_s"] = cpu_base + time.process_time() - cpu0
        state["wall_s"] = wall_base + time.time() - wall0
        tmp = path + ".tmp"
        torch.save({"config": cfg.to_dict(), "model": cpu_state(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "torch_rng": torch.get_rng_state(), "state": state}, tmp)
        os.replace(tmp, path)

    last = len(STAGES) - 1
    while True:
        st = state["stage"]
        if st == last and state["stage_step"] >= args.final_steps:
            break
        _, _, batch_tokens, min_steps, max_steps, gate_skill, gate_all = STAGES[st]
        # lr: linear warm-up over 100 steps, constant, cosine decay to 10% over the last stage
        step = state["step"]
        lr = args.lr * min(1.0, (step + 1) / 100)
        if st == last:
            frac = state["stage_step"] / max(1, args.final_steps)
            lr = args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        tasks = sample_batch(data, st, gen, int(batch_tokens * args.batch_scale), state["queue"], mix)
        ids, tgt, msk, knd, hide = make_batch(tasks, args.copy_dropout, gen, args.copy_keep)
        n_tokens = int((ids != 0).sum())  # on the host copy: no device sync
        ids, tgt, msk, knd = ids.to(dev), tgt.to(dev), msk.to(dev), knd.to(dev)
        hide = hide.to(dev) if hide is not None else None
        logits = model(ids, hide=hide)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none").view_as(msk)
        wmsk = msk * weights[knd]
        loss = (ce * wmsk).sum() / wmsk.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            # Per-kind counts of right and scored targets: integers, so exact in any summation order.
            # index_add_, not bincount: CUDA's bincount reads the index range back to the host.
            right = (logits.argmax(-1) == tgt).float() * msk
            flat = knd.reshape(-1)
            win["right"].index_add_(0, flat, right.reshape(-1))
            win["count"].index_add_(0, flat, msk.reshape(-1))
            win["loss"] += loss.detach().double()  # float32 -> double, summed as float(loss) was
        win["n"] += 1
        state["step"] += 1
        state["stage_step"] += 1
        state["tokens"] += n_tokens

        if state["step"] % args.log_every == 0:
            acc_k = (win["right"] / win["count"].clamp(min=1)).tolist()
            acc_all = float(win["right"].sum() / win["count"].sum())
            cpu = cpu_base + time.process_time() - cpu0
            wall = wall_base + time.time() - wall0
            row = [state["step"], st, state["tokens"], round(cpu, 1), round(wall, 1), f"{lr:.2e}",
                   f"{float(win['loss']) / win['n']:.4f}", f"{acc_all:.4f}"] + [f"{a:.4f}" for a in acc_k[1:]]
            with open(curve_path, "a", newline="") as f:
                csv.writer(f).writerow(row)
            print(" ".join(str(x) for x in row), flush=True)
            # A kind seen fewer than GATE_MIN_COUNT times in the window counts as passed: stage 4's
            # restate decisions (phase B <= 37 lines, so only R = 8 restates, once) were too rare to
            # learn there, and gating on them held a run in that stage for its whole 3,000 steps.
            skill = min(acc_k[k] if win["count"][k] >= GATE_MIN_COUNT else 1.0 for k in gate_kinds)
            recent.append((skill, acc_all))
            recent = recent[-3:]
            win = new_window()
            if st < last and state["stage_step"] >= min_steps:
                passed = len(recent) == 3 and all(l >= gate_skill and a >= gate_all for l, a in recent)
                if passed or state["stage_step"] >= max_steps:
                    print(f"stage {st} -> {st + 1} at step {state['step']} ({'gate passed' if passed else 'max steps'})", flush=True)
                    state["stage"] += 1
                    state["stage_step"] = 0
                    state["queue"] = []
                    recent = []
                    save()
                    save(os.path.join(args.out, f"stage{st}.pt"))
                    if st == args.stop_after_stage:
                        print(f"stopping after stage {st} (--stop-after-stage)", flush=True)
                        return
        if time.time() - last_ckpt > args.ckpt_every_s:
            save()
            last_ckpt = time.time()
        if (args.stop_after_steps and state["step"] >= args.stop_after_steps) or (
                args.stop_after_min and time.time() - wall0 > 60 * args.stop_after_min) or (
                args.stop_after_cpu_min and cpu_base + time.process_time() - cpu0 > 60 * args.stop_after_cpu_min):
            save()
            print(f"stopping at step {state['step']} (a --stop-after limit); resume with --resume", flush=True)
            return
    save()
    torch.save({"config": cfg.to_dict(), "model": cpu_state(), "state": state}, os.path.join(args.out, "final.pt"))
    print(f"done: step {state['step']} cpu {state['cpu_s']:.0f}s wall {state['wall_s']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
