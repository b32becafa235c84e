"""The config reference: every key, its default and its meaning, read from the typed sections' fields
(`python -m atgrpo_jax.train.config_docs > docs/reference/config.md` writes the docs' page)."""
from __future__ import annotations

from atgrpo_jax.typed_config import rows
from atgrpo_jax.train.config import Config


def config_docs() -> list[tuple[str, str, str]]:
    """(key, default, meaning) of every key of the config (sections included, with an empty default),
    from the typed sections' fields."""
    return list(rows(Config))


PAGE_HEAD = """# Config keys

Every key a config file or `--config.KEY=VALUE` sets, its default and what it means. This page is made
from the typed config sections, each defined next to the code that reads it
(`python -m atgrpo_jax.train.config_docs`); a test keeps the two equal. Sections hold keys
(`rollout.k`); `env.kwargs` and `rollout.agents` take keys of your choosing. `--config.regime=NAME` is
shorthand for the settings of a regime (shared, per_role, lora, single_agent, plain_grpo), expanded
once before anything runs.

"""


def config_docs_page() -> str:
    """docs/reference/config.md."""
    return PAGE_HEAD + config_docs_markdown() + "\n"


def config_docs_markdown() -> str:
    """The config reference table (of docs/reference/config.md)."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for key, value, comment in config_docs():
        shown = f"`{value}`" if value else ""
        lines.append(f"| `{key}` | {shown} | {comment.replace('|', '/')} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m atgrpo_jax.train.config_docs: docs/reference/config.md
    print(config_docs_page(), end="")
