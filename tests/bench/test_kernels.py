"""The profile summary of `bench device`: kernels per call, busy time with overlaps counted once,
launch gaps, the top kernels; and a CPU profile that has no device timeline says so."""
import jax
import jax.numpy as jnp
import pytest

from atgrpo_jax.bench.kernels import profile_kernels, summarize


def meta(pid, tid, process, thread):
    return [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": process}},
            {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": thread}}]


def kernel(pid, tid, name, ts, dur):
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur}


def test_summary_of_a_gpu_like_trace():
    events = (meta(1, 7, "/device:GPU:0", "Stream #7(Compute)") + meta(1, 9, "/device:GPU:0", "Stream #9(Compute)")
              + meta(1, 3, "/device:GPU:0", "XLA Ops") + meta(2, 1, "/host:CPU", "python"))
    events += [kernel(1, 7, "gemm", 0, 10), kernel(1, 9, "fusion", 5, 10),  # overlap: busy 0..15
               kernel(1, 7, "gemm", 40, 10), kernel(1, 7, "fusion", 60, 20),  # gaps 15..40, 50..60
               kernel(1, 7, "dynamic-slice_fusion.3", 80, 4), kernel(1, 9, "MemcpyD2D", 84, 2),  # copies
               kernel(1, 3, "an op line", 0, 80),  # not a stream: not a kernel
               kernel(2, 1, "host work", 0, 1000)]  # the host: never counted
    s = summarize({"traceEvents": events}, calls=2, top=5)
    assert s["kernel_timelines"] == ["/device:GPU:0 / Stream #7(Compute)", "/device:GPU:0 / Stream #9(Compute)"]
    assert s["kernels_per_call"] == 3
    assert s["busy_s_per_call"] == pytest.approx(51e-6 / 2)
    assert s["span_s_per_call"] == pytest.approx(86e-6 / 2)
    assert s["busy_fraction"] == pytest.approx(51 / 86)
    assert s["copy_kernels_per_call"] == 1 and s["copy_s_per_call"] == pytest.approx(6e-6 / 2)
    assert [k["name"] for k in s["top"]][:2] == ["fusion", "gemm"]
    assert s["top"][0]["s_per_call"] == pytest.approx(15e-6) and s["top"][0]["mean_us"] == 15


def test_a_cpu_profile_has_no_device_timeline():
    x = jnp.ones((64, 64))
    s = profile_kernels(lambda: jax.jit(lambda x: x @ x)(x), calls=2)
    assert s["device_timelines"] == [] and "no device timeline" in s["note"]
    assert any("/host:" in p for p in s["processes"])


def test_the_device_table_shows_kernels_per_update_and_per_decode_step():
    from atgrpo_jax.bench.device import table
    events = meta(1, 7, "/device:GPU:0", "Stream #7(Compute)") + [kernel(1, 7, f"k{i}", 10 * i, 5) for i in range(36)]
    events += [kernel(1, 7, "copy.5", 360 + 10 * i, 10) for i in range(4)]
    prof = summarize({"traceEvents": events})
    text = table({"parts": {"update": {"status": "ok", "update_profile": prof},
                            "decode": {"status": "ok", "profile_unrolled": {"steps": 4, **prof}}}})
    assert "kernels, update: 40 per call, device busy 55% of their span, copies 4 taking 0.04 ms" in text
    assert "kernels, decode, layers unrolled: 10 per step, device busy 55% of their span, copies 1 taking 0.01 ms" \
        in text


def test_a_profile_that_fails_is_reported_not_raised():
    from atgrpo_jax.bench.device import table

    def broken():
        raise RuntimeError("CUPTI is not available\nmore")
    prof = profile_kernels(broken)
    assert prof == {"error": "RuntimeError: CUPTI is not available"}
    text = table({"parts": {"update": {"status": "ok", "update_profile": prof, "update_split": prof}}})
    assert "kernels, update: no profile (RuntimeError: CUPTI is not available)" in text
    assert "update step split: RuntimeError" in text


def test_in_place_cache_writes_are_not_copies():
    events = meta(1, 7, "/device:GPU:0", "Stream #7(Compute)") + [
        kernel(1, 7, "dynamic-update-slice_fusion.2", 0, 5), kernel(1, 7, "bitcast_dynamic_update_slice_fusion", 5, 5),
        kernel(1, 7, "slice_fusion.1", 10, 5)]
    assert summarize({"traceEvents": events})["copy_kernels_per_call"] == 1
