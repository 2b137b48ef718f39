"""Decision: how perfguard answers *same*, *slower* or *can't tell*. Pure Python plus
scipy: nothing here imports torch.

The rule card (README.md, "The rule", is this text; docs/verdicts.md works examples).

The stored check (`perfguard check`, against a committed baseline; `verdict.py`, `gate.py`):

 1. A case runs 1 warm-up and 5 timed runs in a fresh process. A run whose reference
    workload is over 1.3x its baseline median is dropped (CONTENDED_RATIO), as is every
    run of a process whose reference median is over 1.2x (PROCESS_RATIO); a case with
    half its runs dropped waits 10 s and runs again, twice, then gets no verdict (exit 4).
 2. Each run is divided by the share of its reference reading fitted on the baseline's
    runs (`normalize.py`), so the runner's speed divides out.
 3. Per timed figure: r = median / baseline median. Its log-scale standard error is the
    larger of the samples' and the process medians' spread, plus twice the offset one
    session of the runner leaves (SESSION_SD: 0.7 % on e2e and the denoising figures,
    4 % on other stages; a server case at a url, whose rounds share one server:
    SERVER_SESSION_SD, 5-6 %); Student's t on the processes' degrees of freedom
    (`answer.bound`).
 4. The minimum effect d (MIN_EFFECT): 3 % for e2e, the denoising stage and the step
    aggregates, 10 % for a step, 20 % for other stages. Bound: max(b (1 + d), b + pad),
    pad = max(f, 3 standard errors of the baseline median) (NOISE_PAD_K), f the timer
    floor: 10 us on CPU, 50 us on devices (MEASURED_FLOOR_MS).
 5. Slower: the median is over the bound and the one-sided lower bound on r at
    alpha = 0.1 % (STORED_ALPHA) is over 1. Steps share alpha (Bonferroni,
    `answer.step_level`).
 6. Same: the one-sided 95 % upper bound on r (SAME_ALPHA) is within max(1 + d, 1 + f/b)
    (the band without its noise pad: a noisy baseline must not make sameness easier),
    the check could have caught 3 d (SAME_PRECISION) and, against a baseline of several
    processes, has 3 of its own (SAME_PROCESSES; `answer.assess`).
    Faster: the same, with the median 20 % or more below the baseline.
 7. Can't tell: neither. Each figure carries the slowdown it would catch with 80 %
    probability (POWER; `answer.catches`) and the margin that would have made it the
    same.
 8. Below resolution (`resolution.py`, timing gate `auto`): the baseline records what a
    check of 9 processes (CHECK_PROCESSES) could catch on its runner; a check computes it
    for its own budget. A figure whose resolution is over 4/3 of its minimum effect
    (RESOLVABLE: +4 % on the 3 % figures, where unchanged code reads same 9 times in 10)
    is judged only for slower (5.), else reads below resolution, which neither fails nor
    measures more. `gate` judges every figure in full, `advise` none.
 9. A case over a bound or that can't tell is measured in fresh processes, one at a
    time, at most 8 (DEFAULT_MAX_RERUNS), pooled; it stops once nothing is either.
10. Work (aten ops, FLOPs, bytes allocated, host syncs per stage and step), the
    output hash and a server case's failed requests (failures:cN) are exact: any
    growth, or a changed output, is slower, whatever the runner's load.
11. A case answers its worst figure's answer, the check its worst case's: slower exits 1,
    can't tell (or a contended runner) 4, same or below resolution 0; a case that
    failed to run exits 3.
12. gen-baselines refuses a contended session (other processes using over half a core:
    FOREIGN_LOAD, or the reference over 1.3x the baseline it replaces) after waiting
    10 s and measuring again, twice; one whose runs 1. mostly drops is stored whole,
    marked busy; a noisy one is recorded, never refused.

The relative check (`perfguard compare --against DIR|REF`; `paired.py`):

 1. Base and head run in blocks of one fresh process each, in random order, on the
    same runner; each block gives a log ratio head / base per figure (normalized as 2.).
 2. The estimate is Yuen's 20 % trimmed mean of the blocks' log ratios (PAIRED_TRIM),
    with Student's t on h - 1 degrees of freedom (`estimate.paired_estimate`).
 3. It looks after 4, 6, 8, 12, 16, 24 blocks, each look at the level that keeps the
    false-alarm rate over all looks at 1 % (RELATIVE_ALPHA; found by 100,000 simulated
    A/A checks, `looks.alpha_per_look`).
 4. Slower: the ratio is over 1 + d (and f) and its lower bound over 1. Same: its
    interval lies within +-d (`answer.Criteria.sides` / `inside`, at the look's level).
    It stops once every figure is one or the other.
 5. Past 50 s of measuring (DEFAULT_BUDGET_S) or 24 blocks a figure still open is can't
    tell (exit 4), or below resolution (exit 0) where the blocks could not have caught
    4/3 of its minimum effect (RESOLVABLE, as 8.). Work and output as 10.; exits as 11.

`--rigorous` measures more before it answers can't tell; it never changes the rule.
Held-out figures for every constant: docs/verdicts.md.
"""
