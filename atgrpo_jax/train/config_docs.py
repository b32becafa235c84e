"""The config reference: every key of `base_config`, its default and its meaning, read from the
comments in `config.py`'s source (`python -m atgrpo_jax.train.config_docs > docs/reference/config.md`
writes the docs' page)."""
from __future__ import annotations

import inspect
import io
import tokenize

from atgrpo_jax.train.config import base_config


def config_docs() -> list[tuple[str, str, str]]:
    """(key, default, meaning) of every key of `base_config`, read from its source: the comment
    on the line that sets the key, plus the comment-only lines right below it (sections
    included, with an empty default)."""
    rows: list[list[str]] = []
    for line in inspect.getsource(base_config).splitlines():
        text = line.strip()
        if text.startswith("#") and rows:
            rows[-1][2] += " " + text[1:].strip()
            continue
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(text + "\n").readline)
                  if t.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER)]
        if len(tokens) < 4 or tokens[0].string != "c" or tokens[1].string != ".":
            continue
        comment = tokens[-1].string[1:].strip() if tokens[-1].type == tokenize.COMMENT else ""
        code = text[:tokens[-1].start[1]].strip() if comment else text
        key, _, value = code.partition(" = ")
        rows.append([key[2:], "" if value.startswith("ml_collections.ConfigDict") else value, comment])
    return [tuple(r) for r in rows]


PAGE_HEAD = """# Config keys

Every key a config file or `--config.KEY=VALUE` sets, its default and what it means. This page is made
from the comments in `atgrpo_jax/train/config.py` (`python -m atgrpo_jax.train.config_docs`); a test
keeps the two equal. Sections hold keys (`rollout.k`); `env.kwargs` and `rollout.agents` take keys of
your choosing. `--config.regime=NAME` is shorthand for the settings of a regime (shared, per_role,
lora, single_agent, plain_grpo), expanded once before anything runs.

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
