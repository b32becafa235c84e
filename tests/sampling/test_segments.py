"""Decoding in segments with finished rows dropped: the same rows as one plain loop, less work, no recompiles."""
import jax
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.sampling import generate, segments

NEW = 16
FIELDS = ("tokens", "lengths", "stopped", "mask", "prompt_ids")


@pytest.fixture(scope="module")
def model():
    @nnx.jit
    def make():  # test-tiny with a sharper head: stop tokens then end rows at many different steps
        m = Qwen3(get_preset("test-tiny"), rngs=nnx.Rngs(0))
        m.lm_head.set_value(m.lm_head[...] * 8.0)
        return m
    return make()


def prompts(seed, lengths=(5, 9, 3, 12)):
    rng = np.random.RandomState(seed)
    return [list(rng.randint(1, 512, n)) for n in lengths]


def test_buckets_halve_rows_and_never_hold_more_prompt_rows_than_prefill():
    assert segments.row_buckets(4, 8) == [(32, 4), (16, 4), (8, 4), (4, 4), (2, 2), (1, 1)]
    # K = 6: 24 rows in 12 groups of 2 (16 groups of 1.5 cannot be), odd sizes round up
    assert segments.row_buckets(16, 6) == [(96, 16), (48, 16), (24, 12), (12, 12), (6, 6), (3, 3), (2, 2), (1, 1)]
    assert segments.row_buckets(4, 3) == [(12, 4), (6, 3), (3, 3), (2, 2), (1, 1)]
    assert segments.row_buckets(32, 1, min_rows=4) == [(32, 32), (16, 16), (8, 8), (4, 4)]


def test_plan_keeps_each_live_row_with_its_prompt_row():
    k, ids = 4, np.arange(12, dtype=np.int32)  # 3 prompts x 4 branches, groups of 4
    live = np.zeros(12, bool)
    live[[1, 2, 3, 9]] = True  # prompt 0: three rows, prompt 2: one
    plan = segments.plan_compaction(ids, live, ids // k, 3, rows=6, groups=3)  # groups of 2
    np.testing.assert_array_equal(plan.ids, [1, 2, 3, -1, 9, -1])
    np.testing.assert_array_equal(plan.keep, plan.ids >= 0)
    np.testing.assert_array_equal(plan.src[plan.keep], [1, 2, 3, 9])
    np.testing.assert_array_equal(plan.src_group, [0, 0, 2])  # prompt 0 twice (3 rows in groups of 2), prompt 2
    assert segments.plan_compaction(ids, live, ids // k, 3, rows=3, groups=3) is None  # 4 live rows
    live[[2, 3]] = False
    plan = segments.plan_compaction(ids, live, ids // k, 3, rows=2, groups=2)
    np.testing.assert_array_equal(plan.ids, [1, 9])
    np.testing.assert_array_equal(plan.src_group, [0, 2])


K = 4  # every test: 4 prompts x 4 branches, so they share compiled buckets (16, 8 in groups of 2, 4, 2, 1)


def gen(model, ps, **kw):
    kw.setdefault("key", jax.random.key(0))
    return generate(model, ps, num_branches=K, raw_logprobs=True, **kw)


@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=1.0)])  # one compiled sampler for both
def test_compacted_rows_equal_the_plain_loop(model, kw):
    """Greedy and sampled, K = 4 branches, stop tokens and one budget per prompt."""
    ps, budget = prompts(1), [4, NEW, 9, 13]
    run = lambda segment, stops: gen(model, ps, max_new_tokens=budget, key=jax.random.key(2),  # noqa: E731
                                     stop_ids=stops, segment=segment, **kw)
    free = run(0, []).tokens  # tokens drawn somewhere mid-row become the stop set
    plain = run(0, stops := [int(free[r, j]) for r, j in ((1, 2), (6, 5), (11, 7), (14, 3))])
    assert plain.row_steps == 4 * K * plain.lengths.max()  # one batch, every row every step
    assert len(set(plain.lengths)) >= 3 and plain.stopped.any()
    for segment in (1, 3):
        got = run(segment, stops)
        for field in FIELDS:
            np.testing.assert_array_equal(getattr(got, field), getattr(plain, field), err_msg=field)
        # log-probs: the same computation on fewer rows; XLA:CPU may round a row sum differently by batch size
        np.testing.assert_allclose(got.logprobs, plain.logprobs, atol=2e-6, rtol=0)
        np.testing.assert_allclose(got.raw_logprobs, plain.raw_logprobs, atol=2e-6, rtol=0)
        assert (got.logprobs[~got.mask] == 0).all() and (got.tokens[~got.mask] == 0).all()
        assert plain.lengths.sum() <= got.row_steps <= plain.row_steps
        if segment == 1:  # greedy: a prompt's branches end together, so fewer rows can be dropped
            assert got.row_steps < (0.9 if kw["temperature"] == 0 else 0.75) * plain.row_steps


def test_per_prompt_budgets_are_honoured_exactly(model):
    ps, budget = prompts(3), [1, 7, NEW, 3]
    g = gen(model, ps, max_new_tokens=budget, segment=2)
    np.testing.assert_array_equal(g.lengths, np.repeat(budget, K))  # no stop tokens: each row uses its budget
    assert g.tokens.shape == (4 * K, NEW) and not g.stopped.any()
    np.testing.assert_array_equal(g.mask, np.arange(NEW) < g.lengths[:, None])
    one = gen(model, ps, max_new_tokens=NEW, segment=2)  # one budget for all
    assert one.tokens.shape == (4 * K, NEW) and (one.lengths == NEW).all()
    np.testing.assert_array_equal(one.tokens[2 * K:3 * K], g.tokens[2 * K:3 * K])  # prompt 2 had NEW in both
    np.testing.assert_array_equal(np.where(g.mask, one.tokens, 0), g.tokens)  # the others: cut at their budget
    for bad, message in [([3, 4], "one per prompt"), ([3, 0, 1, 1], ">= 1"), (2.5, "int")]:
        with pytest.raises(ValueError, match=message):
            generate(model, ps, max_new_tokens=bad, key=jax.random.key(0))


def test_no_recompilation_after_warm_up_across_20_calls(model):
    """Twenty calls with other prompts, budgets, stops and temperatures compile one program per row
    bucket and per pair of buckets a compaction moves between, whatever rows end where: after a
    warm-up through every bucket, only compactions between buckets it did not pair may compile.
    (Counted on emptied jit caches: what other tests compiled in this process, and JAX's persistent
    cache, which skips the compile of a program seen before, would hide a recompilation.)"""
    for f in segments.JITTED:
        f.clear_cache()
    ps, kw = prompts(5), dict(segment=2, max_new_tokens=[NEW, 1, 1, 1])
    # warm-up through every bucket: prompt 0's branches stopped one after another by tokens only they draw
    free = gen(model, ps, **kw).tokens[:K]
    stops = [int(free[r, j]) for r, j in ((3, 2), (2, 4), (1, 6)) if free[r, j] not in free[0]]
    warm = gen(model, ps, stop_ids=stops + [-1] * (4 - len(stops)), **kw)
    gen(model, ps, segment=2, max_new_tokens=[NEW, NEW, 1, 1])  # 8 live rows: the (8 rows, 4 groups) bucket
    live = [(warm.lengths > step).sum() for step in range(2, NEW, 2)]  # at each segment's end
    assert {1, 2} <= set(live), warm.lengths  # so batches of 4, 2 and 1 rows ran too
    buckets = segments.row_buckets(4, K)
    assert segments.segment_jit._cache_size() == len(buckets)  # every bucket's segment is warm
    sizes = {f: f._cache_size() for f in segments.JITTED}

    rng = np.random.RandomState(6)
    work = []
    for call in range(20):
        budget = [int(x) for x in rng.randint(1, NEW + 1, 4)]
        budget[call % 4] = NEW  # the same output width each call
        g = gen(model, prompts(call, rng.randint(1, 16, 4)), max_new_tokens=budget, key=jax.random.key(call),
                temperature=float(rng.uniform(0.5, 1.5)), segment=2, stop_ids=[int(s) for s in rng.randint(1, 512, 4)])
        work.append(g.row_steps / (len(g.lengths) * g.lengths.max()))
    grown = {f.__name__: f._cache_size() - n for f, n in sizes.items() if f._cache_size() != n}
    assert set(grown) <= {"_compact"}, grown  # no segment, prefill or set-up compiled again
    pairs = len(buckets) * (len(buckets) - 1) // 2  # from a bucket to any smaller one
    assert segments.compact_jit._cache_size() <= pairs, segments.compact_jit._cache_size()
    assert min(work) < 0.6  # rows were dropped: well under one full batch per step


@pytest.mark.parametrize("slots", [1, 4])  # 4: the batch shapes of the tests above (groups of one), compiled once
def test_continuous_batching_equals_the_plain_loop(model, slots):
    """At most `slots` rows decode at once; the 16 rows start in order as slots free up (rows end on
    stop tokens and per-prompt budgets), and each row makes the tokens of the plain loop."""
    ps, budget = prompts(1), [4, NEW, 9, 13]
    run = lambda stops, **kw: gen(model, ps, max_new_tokens=budget, key=jax.random.key(2),  # noqa: E731
                                  stop_ids=stops, temperature=1.0, **kw)
    free = run([], segment=0).tokens
    plain = run(stops := [int(free[r, j]) for r, j in ((1, 2), (6, 5), (11, 7), (14, 3))], segment=0)
    for segment in (1, 3):
        got = run(stops, segment=segment, slots=slots)
        for field in FIELDS:
            np.testing.assert_array_equal(getattr(got, field), getattr(plain, field), err_msg=field)
        np.testing.assert_allclose(got.logprobs, plain.logprobs, atol=2e-6, rtol=0)
        np.testing.assert_allclose(got.raw_logprobs, plain.raw_logprobs, atol=2e-6, rtol=0)
        assert (got.logprobs[~got.mask] == 0).all() and (got.tokens[~got.mask] == 0).all()
        if slots == 1 and segment == 1:  # one row at a time, refilled every step: no step is wasted
            assert got.row_steps == plain.lengths.sum()
        assert plain.lengths.sum() <= got.row_steps < plain.row_steps


def test_continuous_batching_checks_its_arguments_and_does_not_recompile(model):
    ps = prompts(4)
    with pytest.raises(ValueError, match="slots"):
        gen(model, ps, max_new_tokens=NEW, slots=0)
    with pytest.raises(ValueError, match="segment"):
        gen(model, ps, max_new_tokens=NEW, slots=4, segment=0)
    budgets = [[NEW, 2, 5, 1], [3, NEW, 1, 7], [1, 1, NEW, 1]]
    call = lambda b, seed: gen(model, ps, max_new_tokens=b, slots=4, segment=2,  # noqa: E731
                               key=jax.random.key(seed), temperature=0.5 + seed / 4)
    for b in budgets:  # warm-up: the budgets alone decide which buckets each call reaches
        call(b, 0)
    sizes = [f._cache_size() for f in segments.JITTED]
    for seed, b in enumerate(budgets, start=1):
        g = call(b, seed)
        np.testing.assert_array_equal(g.lengths, np.repeat(b, K))
    assert [f._cache_size() for f in segments.JITTED] == sizes


def test_own_caches_grow_by_doubling_from_128_slots_to_the_budget():
    assert [segments.own_slots(s, 2048) for s in (1, 16, 128, 129, 700, 2048)] == [128, 128, 128, 256, 1024, 2048]
    assert segments.own_slots(16, 40) == 40 and segments.own_slots(300, 300) == 300


def test_rows_with_grown_own_caches_equal_the_plain_loop(model, monkeypatch):
    """Segments start the rows' own caches at 128 slots and grow them (128 -> 200 here); the plain
    loop (segment 0) reads all 200 from the start: the same tokens."""
    ps = prompts(7, (4, 6))
    run = lambda segment: gen(model, ps, max_new_tokens=200, key=jax.random.key(3), segment=segment)  # noqa: E731
    widths, grow = [], segments.grow_jit

    def spy(cache, slots):
        widths.append((cache.slots, slots))
        return grow(cache, slots=slots)
    monkeypatch.setattr(segments, "grow_jit", spy)
    plain, got = run(0), run(100)
    assert widths == [(128, 200)]  # the plain loop started at full width; the segments grew once
    assert (plain.lengths > 128).any()  # rows wrote past the first width
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(got, field), getattr(plain, field), err_msg=field)
    np.testing.assert_allclose(got.logprobs, plain.logprobs, atol=2e-6, rtol=0)


def test_a_grown_cache_keeps_its_slots_and_adds_empty_ones_in_either_layout():
    from atgrpo_jax.models.strategies import KVCache
    cfg = get_preset("test-tiny")
    base = KVCache.init(cfg, 3, 5)
    rng = np.random.RandomState(0)
    base = base._replace(k=jax.numpy.asarray(rng.randn(*base.k.shape), base.k.dtype),
                         v=jax.numpy.asarray(rng.randn(*base.v.shape), base.v.dtype), valid=base.valid.at[:, :2].set(True))
    for cache in (base, base.per_layer()):
        grown = cache.grow(8)
        assert grown.slots == 8 and grown.layered == cache.layered and grown.index == cache.index
        for old, new in zip(jax.tree.leaves((cache.k, cache.v)), jax.tree.leaves((grown.k, grown.v))):
            assert new.shape == old.shape[:-2] + (8, old.shape[-1])
            np.testing.assert_array_equal(new[..., :5, :], old)
            assert not new[..., 5:, :].any()
        np.testing.assert_array_equal(grown.valid[:, :5], cache.valid)
        assert not grown.valid[:, 5:].any()
