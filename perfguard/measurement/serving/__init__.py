"""Server gating: a server measured over HTTP, as the people who ship one measure it.

- `app`: `perfguard serve`, an HTTP server with sglang's endpoints over one built-in or
  diffusers pipeline, one worker behind a queue, with knobs that slow it for self-tests;
- `launch`: a server perfguard starts from a case's argv and stops (its process tree);
- `load`: the load generator (closed loop or Poisson arrivals, images or video jobs);
- `scrape`: sglang's `performance.log` lines and Prometheus `/metrics`, read forgivingly;
- `case`: a `workload = "server"` case measured into a `CaseResult`, a round per group.

docs/serving.md has the figures, the rule and a real report.
"""

WARMUP_HEADER = "x-perfguard-warmup"
"""The request header (value `1`) that marks a warm-up request: `perfguard serve` counts it
under `is_warmup="true"` in its request counter, as sglang labels its warm-up requests."""
