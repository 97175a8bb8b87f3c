"""The executor's side of prompt logprobs (engine/prompt_logprobs.py): a step whose segments ask
for every row's logits is scored here, and only the rows to sample go on to the sampler."""

from __future__ import annotations

import torch

# Rows per log-softmax slice: Gemma 3's 262144-entry vocabulary makes a row 1 MiB in fp32, so a
# 1024-row prompt scored at once would hold a 1 GiB temporary; 64 rows keep it at 64 MiB.
SLICE_ROWS = 64


def score_rows(logits: torch.Tensor, score) -> None:
    """Fill `score.sink` with (logprob, rank, top) for each target the rows of `logits` predict.
    The logprobs are the model's raw distribution (no sampling knobs), as vLLM's prompt logprobs."""
    n = len(score.targets)
    for a in range(0, n, SLICE_ROWS):
        b = min(n, a + SLICE_ROWS)
        lp = torch.log_softmax(logits[a:b].float(), -1)
        tgt = torch.tensor(score.targets[a:b], dtype=torch.long, device=lp.device)
        chosen = lp.gather(1, tgt[:, None])[:, 0]
        ranks = (lp > chosen[:, None]).sum(-1) + 1
        if score.k > 0:
            v, idx = lp.topk(score.k, -1)
            tops = [list(zip(i, x)) for i, x in zip(idx.tolist(), v.tolist())]
        else:
            tops = [[] for _ in range(b - a)]
        for j, (c, r, top) in enumerate(zip(chosen.tolist(), ranks.tolist(), tops)):
            score.sink[score.first + a + j] = (c, r, top)


def scoring(runner):
    """`runner.step`, except that a step with scored segments returns only its sampled rows (one
    per sampled segment, in plan order), as every step without them does."""

    def run(segments):
        logits = runner.step(segments)
        if not any(s.all_logits for s in segments):
            return logits
        keep, r = [], 0
        for s in segments:
            rows = len(s.tokens) if s.all_logits else 1 if s.sample else 0
            if s.score is not None:
                score_rows(logits[r : r + rows], s.score)
            if s.sample:
                keep.append(r + rows - 1)
            r += rows
        return logits[keep]

    return run
