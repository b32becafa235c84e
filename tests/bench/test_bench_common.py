"""Machine notes name the CPU and the extensions that change which kernels run (AVX-512, AMX)."""
from atgrpo_jax.bench.common import cpu_model, machine_notes

XEON = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: fpu avx2 fma avx512f amx_tile amx_bf16\n\n" \
       "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: fpu\n"


def test_cpu_model_reads_the_first_processor():
    assert cpu_model(XEON) == {"cpu_model": "Intel(R) Xeon(R) Platinum 8481C",
                               "cpu_extensions": ["avx2", "fma", "avx512f", "amx_tile", "amx_bf16"]}


def test_arm_features_and_no_cpuinfo():
    assert cpu_model("Features\t: fp asimd sve\n")["cpu_extensions"] == ["asimd", "sve"]
    assert cpu_model("")["cpu_extensions"] == []


def test_machine_notes_carry_the_cpu():
    notes = machine_notes()
    assert notes["cpu_model"] and isinstance(notes["cpu_extensions"], list)
