"""Reward functions for tests/envs/test_prompt_reward.py (importable as `prompt_reward_fns:NAME`)."""


def exact(completions, records):
    return [1.0 if c.strip() == str(r["answer"]) else 0.0 for c, r in zip(completions, records)]


def with_feedback(completions, records):
    scores = exact(completions, records)
    return scores, ["right" if s else f"no, not {c}" for s, c in zip(scores, completions)]


def raises(completions, records):
    return [1 / 0 for _ in completions]


def too_few(completions, records):
    return [0.0]


def not_numbers(completions, records):
    return ["high"] * len(completions)


def nan(completions, records):
    return [float("nan")] * len(completions)


def number_strings(completions, records):
    return ["1"] * len(completions)


def one_string(completions, records):
    return "1" * len(completions)


def too_large(completions, records):
    return [1e39] * len(completions)


def wrong_feedback(completions, records):
    return [0.0] * len(completions), ["no"] * (len(completions) + 1)


def exits(completions, records):
    raise SystemExit(3)


def interrupted(completions, records):
    raise KeyboardInterrupt


def trl_style(prompts, completions, answer, **kwargs):
    """As TRL calls it: the prompts, the completions, a dataset column by its name, the rest in kwargs."""
    assert all(p.endswith("=") for p in prompts) and "records" in kwargs and "role" in kwargs
    return [1.0 if c.strip() == str(a) else 0.0 for c, a in zip(completions, answer)]


def trl_kwargs(completions, **kwargs):
    return [1.0 if c.strip() == str(a) else 0.0 for c, a in zip(completions, kwargs["answer"])]


def asks_unknown(completions, solution):
    return [0.0] * len(completions)
